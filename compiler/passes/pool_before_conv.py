"""Average pooling moved before the 1x1 conv it reads: ``avg_pool(conv(x, W))`` is
``conv(avg_pool(x), W)`` when the conv is 1x1, stride 1, unpadded, ungrouped and has
no bias (both are linear, the pool the same weighted sum of pixels for every channel,
the conv the same sum over channels for every pixel; a padded pool's zeros stay zeros
through the conv). The conv then runs on the pooled image: DenseNet's transition layers
(batch-norm, ReLU, 1x1 conv, 2x2 average pool) do a quarter of their multiply-adds.
Runs before op fusion, which would otherwise give the conv an epilogue or a prologue.
"""

from __future__ import annotations

from compiler.ir import Graph, GraphBuilder, Node, rewrite


def _swappable(conv: Node, users: dict[Node, list[Node]]) -> bool:
    """``conv`` a plain float 1x1 conv read only by one pool."""
    if conv.op != "nn.conv2d" or conv.ty.dtype != "float32" or len(users[conv]) != 1:
        return False
    kh, kw = conv.inputs[1].ty.shape[2:]
    return ((kh, kw) == (1, 1) and tuple(conv.attr("strides")) == (1, 1)
            and not any(conv.attr("padding")) and conv.attr("groups") == 1)


def pool_before_conv(graph: Graph) -> Graph:
    users = graph.users()

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        if node.op != "nn.avg_pool2d" or not _swappable(node.inputs[0], users):
            return None
        conv = node.inputs[0]
        pooled = b.call(node.op, [b.mapping[conv.inputs[0]]], node.name, **node.attrs)
        return b.call(conv.op, [pooled, b.mapping[conv.inputs[1]]], conv.name, **conv.attrs)

    return rewrite(graph, visit)

"""Op fusion: conv2d / dense followed by bias_add, relu and a residual add becomes one
``fused.conv2d`` / ``fused.dense`` whose template kernel applies them in its epilogue,
so the intermediate tensors are never written to memory.

A chain grows while the current node has exactly one reader and is not a graph output;
each of bias and add joins at most once, relu any number of times (as the templates'
``Epilogue`` allows).
"""

from __future__ import annotations

from compiler.ir import Graph, GraphBuilder, Node, rewrite

FUSABLE = {"nn.conv2d": "fused.conv2d", "nn.dense": "fused.dense"}


def _grow(start: Node, users: dict[Node, list], claimed: set[Node]
          ) -> tuple[list[Node], tuple[str, ...], Node | None, Node | None]:
    """The chain after ``start``: its nodes, the epilogue, the bias and residual nodes.
    A node an earlier chain took is not taken again (ResNet's shortcut and main branch
    both reach the same residual add; the first to get there fuses it)."""
    chain, ops, bias, residual = [], [], None, None
    node = start
    while len(users[node]) == 1 and users[node][0] is not None:
        nxt = users[node][0]
        if nxt in claimed:
            break
        if nxt.op == "nn.bias_add" and bias is None and nxt.inputs[0] is node \
                and nxt.attr("axis") % nxt.ty.ndim == 1:
            bias = nxt.inputs[1]
            ops.append("bias")
        elif nxt.op == "nn.relu":
            ops.append("relu")
        elif nxt.op == "add" and residual is None and nxt.inputs[0].ty == nxt.inputs[1].ty:
            residual = nxt.inputs[1] if nxt.inputs[0] is node else nxt.inputs[0]
            ops.append("add")
        else:
            break
        chain.append(nxt)
        node = nxt
    return chain, tuple(ops), bias, residual


def fuse_ops(graph: Graph) -> Graph:
    users = graph.users()
    plans: dict[Node, tuple[Node, tuple[str, ...], Node | None, Node | None]] = {}
    claimed: set[Node] = set()
    for node in graph.nodes:
        if node.op in FUSABLE:
            chain, ops, bias, residual = _grow(node, users, claimed)
            if chain:
                plans[chain[-1]] = (node, ops, bias, residual)
                claimed.update(chain)

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        plan = plans.get(node)
        if plan is None:
            return None
        head, ops, bias, residual = plan
        inputs = [b.mapping[x] for x in (*head.inputs, bias, residual) if x is not None]
        return b.call(FUSABLE[head.op], inputs, head.name, epilogue=ops, **head.attrs)

    return rewrite(graph, visit)

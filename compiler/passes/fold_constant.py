"""Constant folding: an op whose inputs are all constants becomes a constant.

ONNX exports compute weights (ConstantOfShape), shapes and transposed matrices with
ops; folding them once here means no kernel ever recomputes them at run time.
"""

from __future__ import annotations

from compiler.ir import Graph, GraphBuilder, Node, rewrite
from compiler.ir.ops import evaluate_op

# fused kernels are never folded: their inputs are weights, not the whole computation
_KEEP = frozenset({"fused.conv2d", "fused.dense"})


def fold_constant(graph: Graph) -> Graph:
    def fold(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        if node.is_const or node.op == "input" or node.op in _KEEP:
            return None
        if not all(a.is_const for a in args):
            return None
        value = evaluate_op(node.op, [a.value for a in args], node.attrs)  # type: ignore[misc]
        return b.const(value.astype(node.ty.dtype, copy=False), node.name)

    return rewrite(graph, fold)

"""Element-wise fusion: a chain of element-wise ops (scale, shift, relu, ...) on one
tensor becomes one ``fused.elementwise`` kernel, which reads the tensor once and
writes it once instead of once per op.

DenseNet's pre-activation batch-norm + relu (a scale, a shift and a relu after the
batch-norm folding) is the case that matters: three kernels and two intermediate
tensors per layer become one kernel. Runs after conv/dense fusion, which has first
claim on bias, relu and add.
"""

from __future__ import annotations

from typing import Any

from compiler.ir import Graph, GraphBuilder, Node, rewrite
from compiler.ir.ops import get_op

# the running value may be either operand of these; of the others, only the first
_COMMUTATIVE = frozenset({"add", "multiply"})


def _step(node: Node, running: Node) -> tuple[str, Node | None, tuple[Any, ...]] | None:
    """How ``node`` applies to ``running``: (op, other operand or None, attrs), or None
    when it cannot join a chain on ``running``."""
    if node.op == "fused.elementwise" or not get_op(node.op).elementwise:
        return None
    if node.ty != running.ty:
        return None  # broadcasting would grow the running value
    items = tuple(sorted(node.attrs.items()))
    if len(node.inputs) == 1:
        return node.op, None, items
    first, second = node.inputs
    if first is running and second is not running:
        return node.op, second, items
    if second is running and first is not running and node.op in _COMMUTATIVE:
        return node.op, first, items
    return None


def fuse_elementwise(graph: Graph) -> Graph:
    users = graph.users()
    plans: dict[Node, tuple[Node, list[tuple[str, Node | None, tuple[Any, ...]]]]] = {}
    claimed: set[Node] = set()
    for node in graph.nodes:
        if node in claimed or not node.inputs:
            continue
        # the running value: the first operand, or the second of a commutative op whose
        # first is a constant (multiply(scale, x))
        starts = [a for a in node.inputs if not a.is_const] or [node.inputs[0]]
        start = starts[0]
        first = _step(node, start)
        if first is None:
            continue
        steps, tail = [first], node
        while len(users[tail]) == 1 and users[tail][0] is not None:
            nxt = users[tail][0]
            step = _step(nxt, tail)
            if step is None:
                break
            steps.append(step)
            tail = nxt
            claimed.add(nxt)
        if len(steps) > 1:
            plans[tail] = (start, steps)
            claimed.add(node)

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        plan = plans.get(node)
        if plan is None:
            return None
        start, steps = plan
        # one input per step, even for a node two steps share: each step broadcasts its
        # operand its own way (bias_add on the channel axis, add by numpy's rules)
        inputs = [b.mapping[start]]
        chain = []
        for op, other, items in steps:
            if other is None:
                chain.append((op, -1, items))
            else:
                inputs.append(b.mapping[other])
                chain.append((op, len(inputs) - 1, items))
        return b.call("fused.elementwise", inputs, node.name, chain=tuple(chain))

    return rewrite(graph, visit)

"""Op fusion: conv2d / dense followed by bias_add, relu and a residual add becomes one
``fused.conv2d`` / ``fused.dense`` whose template kernel applies them in its epilogue,
so the intermediate tensors are never written to memory.

A chain grows while the current node has exactly one reader and is not a graph output;
each of bias and add joins at most once, relu any number of times (as the templates'
``Epilogue`` allows). An int8 conv (int32 accumulators, from ``quantize``) also takes
its requantize steps: a rounding right shift (``add(x, 2**(k-1))`` then
``right_shift(x, k)``), a residual that is int32 or an int8 value cast to int32, and a
final ``clip(-127, 127)`` + ``cast`` to int8, which makes the kernel store int8.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler.ir import Graph, GraphBuilder, Node, rewrite
from compiler.templates.base import INT8_MAX, INT8_MIN

FUSABLE = {"nn.conv2d": "fused.conv2d", "nn.dense": "fused.dense"}


@dataclass
class _Chain:
    nodes: list[Node] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    bias: Node | None = None
    residual: Node | None = None
    shift: int = 0
    store_dtype: str = ""


def _scalar(node: Node) -> int | None:
    """The value of a one-element integer constant, else None."""
    if not node.is_const or node.ty.size != 1 or node.ty.dtype not in ("int32", "int8"):
        return None
    return int(np.asarray(node.value).reshape(()))


def _rounding_shift(add: Node, node: Node, users: dict[Node, list]) -> tuple[int, Node] | None:
    """``add(node, 2**(k-1))`` read only by ``right_shift(., k)``: (k, the shift node)."""
    if add.op != "add" or add.inputs[0] is not node or len(users[add]) != 1:
        return None
    half, shift = _scalar(add.inputs[1]), users[add][0]
    if half is None or shift is None or shift.op != "right_shift" or shift.inputs[0] is not add:
        return None
    k = _scalar(shift.inputs[1])
    return (k, shift) if k is not None and k >= 1 and half == 1 << (k - 1) else None


def _int8_store(clip: Node, users: dict[Node, list]) -> Node | None:
    """``clip(x, -127, 127)`` read only by ``cast(., "int8")``: the cast node."""
    if clip.op != "clip" or (clip.attr("a_min"), clip.attr("a_max")) != (INT8_MIN, INT8_MAX):
        return None
    if len(users[clip]) != 1 or users[clip][0] is None:
        return None
    cast = users[clip][0]
    return cast if cast.op == "cast" and cast.attr("dtype") == "int8" else None


def _residual(add: Node, node: Node, integer: bool) -> Node | None:
    """The other operand of a residual ``add`` of ``node`` (an int8 value read through
    its cast to int32, for int kernels), or None."""
    if add.op != "add" or node not in add.inputs or add.inputs[0] is add.inputs[1]:
        return None
    other = add.inputs[1] if add.inputs[0] is node else add.inputs[0]
    if other.ty.shape != add.ty.shape:
        return None
    if not integer:
        return other if add.inputs[0].ty == add.inputs[1].ty else None
    if other.op == "cast" and other.inputs[0].ty.dtype == "int8":
        return other.inputs[0]
    return other if other.ty.dtype == "int32" else None


def _grow(start: Node, users: dict[Node, list], claimed: set[Node]) -> _Chain:
    """The chain after ``start``. A node an earlier chain took is not taken again
    (ResNet's shortcut and main branch both reach the same residual add; the first to
    get there fuses it)."""
    c = _Chain()
    integer = start.ty.dtype == "int32"
    node = start
    while len(users[node]) == 1 and users[node][0] is not None:
        nxt = users[node][0]
        if nxt in claimed:
            break
        taken = [nxt]
        found = _rounding_shift(nxt, node, users) if integer and not c.shift else None
        residual = _residual(nxt, node, integer) if c.residual is None else None
        store = _int8_store(nxt, users) if integer else None
        if nxt.op == "nn.bias_add" and c.bias is None and nxt.inputs[0] is node \
                and nxt.attr("axis") % nxt.ty.ndim == 1:
            c.bias = nxt.inputs[1]
            c.ops.append("bias")
        elif nxt.op == "nn.relu":
            c.ops.append("relu")
        elif found is not None:
            c.shift, shift_node = found
            c.ops.append("shift")
            taken.append(shift_node)
        elif residual is not None:
            c.residual = residual
            c.ops.append("add")
        elif store is not None:
            c.store_dtype = "int8"
            taken.append(store)
        else:
            break
        c.nodes += taken
        node = taken[-1]
        if c.store_dtype:
            break
    return c


def fuse_ops(graph: Graph) -> Graph:
    users = graph.users()
    plans: dict[Node, tuple[Node, _Chain]] = {}
    claimed: set[Node] = set()
    for node in graph.nodes:
        if node.op in FUSABLE:
            chain = _grow(node, users, claimed)
            if chain.nodes:
                plans[chain.nodes[-1]] = (node, chain)
                claimed.update(chain.nodes)

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        plan = plans.get(node)
        if plan is None:
            return None
        head, c = plan
        inputs = [b.mapping[x] for x in (*head.inputs, c.bias, c.residual) if x is not None]
        extra = ({"shift": c.shift, "store_dtype": c.store_dtype}
                 if head.ty.dtype == "int32" else {})
        return b.call(FUSABLE[head.op], inputs, head.name, epilogue=tuple(c.ops), **extra,
                      **head.attrs)

    return rewrite(graph, visit)

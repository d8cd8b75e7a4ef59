"""Op fusion: conv2d / dense followed by bias_add, relu and a residual add becomes one
``fused.conv2d`` / ``fused.dense`` whose template kernel applies them in its epilogue,
so the intermediate tensors are never written to memory.

A chain grows while the current node has exactly one reader and is not a graph output;
each of bias and add joins at most once, and so does one activation other than relu: a
second one ends the chain and runs unfused, as each activation's C expression reads its
operand several times (compiler.templates.activations) and stacked ones would grow the
kernel source exponentially. Relu joins any number of times, but a relu right after
another adds no op (relu(relu(x)) is relu(x)), which bounds the relus in the epilogue
too. Float chains take relu, clip (ReLU6), leaky_relu, PRelu with one slope for every
channel (a leaky_relu), hard_sigmoid, hard_swish, and SiLU written
``multiply(x, sigmoid(x))`` (x's two readers are the pair; HardSwish written
``multiply(x, hard_sigmoid(x))`` with ONNX's 1/6, 1/2 is hard_swish). An int8
conv (int32 accumulators, from ``quantize``) also takes its requantize steps: a
rounding right shift (``add(x, 2**(k-1))`` then ``right_shift(x, k)``), a residual that
is int32 or an int8 value cast to int32, and a final ``clip(-127, 127)`` + ``cast`` to
int8, which makes the kernel store int8.

A grouped float conv (not depthwise, which has its own template) becomes one conv per
group over its channel slice, epilogue included, and a concatenation: no template
computes groups, and per-group template convs (all one tuning task) run 3-50x faster
than the plain grouped kernel even untuned, slices and concatenation included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler.ir import Graph, GraphBuilder, Node, rewrite
from compiler.templates.base import INT8_MAX, INT8_MIN, activation

FUSABLE = {"nn.conv2d": "fused.conv2d", "nn.dense": "fused.dense"}


@dataclass
class _Chain:
    nodes: list[Node] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    bias: Node | None = None
    residual: Node | None = None
    shift: int = 0
    store_dtype: str = ""
    activated: bool = False  # holds its one activation other than relu


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


def _activation(nxt: Node) -> str | None:
    """The epilogue op of a one-input float activation node, or None."""
    if nxt.op == "clip":
        return activation("clip", nxt.attr("a_min"), nxt.attr("a_max"))
    if nxt.op == "nn.leaky_relu":
        return activation("leaky_relu", nxt.attr("alpha"))
    if nxt.op == "hard_sigmoid":
        return activation("hard_sigmoid", nxt.attr("alpha"), nxt.attr("beta"))
    if nxt.op == "hard_swish":
        return activation("hard_swish")
    if nxt.op == "nn.prelu":
        slope = nxt.inputs[1]
        values = np.unique(np.asarray(slope.value)) if slope.is_const else ()
        return activation("leaky_relu", float(values[0])) if len(values) == 1 else None
    return None


def _gated(node: Node, users: dict[Node, list]) -> tuple[str, list[Node]] | None:
    """``multiply(node, gate(node))`` where node's only readers are that pair: SiLU
    (gate sigmoid) or HardSwish (gate hard_sigmoid(1/6, 1/2)); the op and the nodes."""
    readers = users[node]
    if len(readers) != 2 or None in readers:
        return None
    # the multiply is the second reader unless only the first is one (if both are,
    # the checks below decide)
    gate, mul = readers if readers[1].op == "multiply" else readers[::-1]
    if mul.op != "multiply" or set(mul.inputs) != {node, gate} or users[gate] != [mul] \
            or gate.inputs[0] is not node:
        return None
    if gate.op == "sigmoid":
        return activation("silu"), [gate, mul]
    if gate.op == "hard_sigmoid" and np.isclose(gate.attr("alpha"), 1 / 6, rtol=1e-6) \
            and gate.attr("beta") == 0.5:
        return activation("hard_swish"), [gate, mul]
    return None


def _grow(start: Node, users: dict[Node, list], claimed: set[Node]) -> _Chain:
    """The chain after ``start``. A node an earlier chain took is not taken again
    (ResNet's shortcut and main branch both reach the same residual add; the first to
    get there fuses it)."""
    c = _Chain()
    integer = start.ty.dtype == "int32"
    node = start
    while True:
        gated = None if integer or c.activated else _gated(node, users)
        if gated is not None and not claimed.intersection(gated[1]):
            c.ops.append(gated[0])
            c.activated = True
            c.nodes += gated[1]
            node = gated[1][-1]
            continue
        if len(users[node]) != 1 or users[node][0] is None:
            break
        nxt = users[node][0]
        if nxt in claimed:
            break
        taken = [nxt]
        act = (None if integer or c.activated or nxt.inputs[0] is not node
               else _activation(nxt))
        found = _rounding_shift(nxt, node, users) if integer and not c.shift else None
        residual = _residual(nxt, node, integer) if c.residual is None else None
        store = _int8_store(nxt, users) if integer else None
        if nxt.op == "nn.bias_add" and c.bias is None and nxt.inputs[0] is node \
                and nxt.attr("axis") % nxt.ty.ndim == 1:
            c.bias = nxt.inputs[1]
            c.ops.append("bias")
        elif nxt.op == "nn.relu":
            if c.ops[-1:] != ["relu"]:  # relu(relu(x)) is relu(x)
                c.ops.append("relu")
        elif act is not None:
            c.ops.append(act)
            c.activated = True
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


def _split_groups(node: Node) -> bool:
    """A float conv with groups that is not depthwise (groups == input channels): split
    per group."""
    if node.op != "nn.conv2d" or node.attr("groups") == 1 or node.ty.dtype != "float32":
        return False
    return node.attr("groups") != node.inputs[0].ty.shape[1]


def _channels(b: GraphBuilder, value: Node, axis: int, lo: int, hi: int, name: str) -> Node:
    """``value``'s channels [lo, hi) along ``axis``: sliced here when it is a constant."""
    if value.is_const:
        where = [slice(None)] * value.ty.ndim
        where[axis] = slice(lo, hi)
        return b.const(np.asarray(value.value)[tuple(where)], name)
    shape = value.ty.shape
    begin, end = [0] * len(shape), list(shape)
    begin[axis], end[axis] = lo, hi
    return b.call("strided_slice", [value], name, begin=tuple(begin), end=tuple(end),
                  strides=(1,) * len(shape))


def _per_group(b: GraphBuilder, op: str, inputs: list[Node], ops: tuple[str, ...],
               name: str, attrs: dict) -> Node:
    """``op`` (a grouped conv, its epilogue ``ops`` reading ``inputs``' bias and
    residual) as one conv per group, concatenated along the channels."""
    groups = attrs["groups"]
    data, weight, *extra = inputs
    cig, cog = data.ty.shape[1] // groups, weight.ty.shape[0] // groups
    outs = []
    for g in range(groups):
        at = f"{name}.g{g}"
        part = [_channels(b, data, 1, g * cig, (g + 1) * cig, at),
                _channels(b, weight, 0, g * cog, (g + 1) * cog, at)]
        part += [_channels(b, x, 0 if x.ty.ndim == 1 else 1, g * cog, (g + 1) * cog, at)
                 for x in extra]  # bias [co], residual [n, co, oh, ow]
        fused = {"epilogue": ops} if ops else {}
        outs.append(b.call(op, part, at, **{**attrs, "groups": 1, **fused}))
    return b.call("concatenate", outs, name, axis=1)


def fuse_ops(graph: Graph) -> Graph:
    users = graph.users()
    plans: dict[Node, tuple[Node, _Chain]] = {}
    claimed: set[Node] = set()
    for node in graph.nodes:
        if node.op in FUSABLE:
            chain = _grow(node, users, claimed)
            if chain.nodes or _split_groups(node):
                plans[chain.nodes[-1] if chain.nodes else node] = (node, chain)
                claimed.update(chain.nodes)

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        plan = plans.get(node)
        if plan is None:
            return None
        head, c = plan
        inputs = [b.mapping[x] for x in (*head.inputs, c.bias, c.residual) if x is not None]
        op = FUSABLE[head.op] if c.ops else head.op
        if _split_groups(head):
            return _per_group(b, op, inputs, tuple(c.ops), head.name, dict(head.attrs))
        extra = ({"shift": c.shift, "store_dtype": c.store_dtype}
                 if head.ty.dtype == "int32" else {})
        return b.call(FUSABLE[head.op], inputs, head.name, epilogue=tuple(c.ops), **extra,
                      **head.attrs)

    return rewrite(graph, visit)

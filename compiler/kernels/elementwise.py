"""Element-wise ops; either operand may broadcast (numpy rules), so a (C, 1, 1) constant
scale or a scalar needs no expand kernel.

Float ops whose C expressions hold for OpenCL vectors (``_VECTOR_OPS``) give each
work-item a run of 16 (or 8, 4, 2) consecutive elements over which every broadcast
operand is one value: OpenCL loads, computes and stores them as one floatN (PoCL runs
the one-element-per-work-item form far slower, slower even than a plain copy of the
same tensor); CUDA runs the same run as a loop. Others take one work-item per element.
``chain_blocked`` writes a chain in NCHW[b]c for the blocked convolution reading it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from compiler.ir import Node
from compiler.kernels.common import NoKernelError, linear, per_item, unravel
from compiler.templates.activations import activation_c
from compiler.templates.base import Kernel
from compiler.templates.emit import C_TYPES, c_float, indent

# op -> C expression over the loaded operands a0, a1
_BINARY = {"add": "a0 + a1", "multiply": "a0 * a1", "subtract": "a0 - a1", "divide": "a0 / a1",
           "right_shift": "a0 >> a1",
           # in float whatever the operands' types; the store converts to the base's type
           "power": "pow((float)a0, (float)a1)",
           # a NaN in either operand gives NaN, as numpy's maximum / minimum (fmax does not)
           "maximum": "((a0 > a1 || a0 != a0) ? a0 : a1)",
           "minimum": "((a0 < a1 || a0 != a0) ? a0 : a1)",
           "nn.prelu": "(a0 > 0.0f ? a0 : a0 * a1)",
           "equal": "(a0 == a1)", "greater": "(a0 > a1)", "less": "(a0 < a1)"}
# integer operands: no NaN to test for
_INT_BINARY = {"maximum": "(a0 > a1 ? a0 : a1)", "minimum": "(a0 < a1 ? a0 : a1)"}
# operands load as float (float32) or int (int32, int8 and bool: C's promotion, made
# explicit); the store converts to the output's C type (a cast's whole work)
_LOAD = {"float32": "float", "int32": "int", "int8": "int", "bool": "int"}
# log(1 + e^x) without overflow, as numpy's logaddexp(0, x)
_SOFTPLUS = "(fmax(a0, 0.0f) + log1p(exp(-fabs(a0))))"


def _gelu(attrs: dict[str, Any]) -> str:
    if attrs["approximate"] == "tanh":
        inner = f"{c_float(math.sqrt(2.0 / math.pi))} * (a0 + 0.044715f * a0 * a0 * a0)"
        return f"(0.5f * a0 * (1.0f + tanh({inner})))"
    return f"(0.5f * a0 * (1.0f + erf(a0 * {c_float(1.0 / math.sqrt(2.0))})))"


def _elu(alpha: float) -> str:
    return f"(a0 > 0.0f ? a0 : {c_float(alpha)} * expm1(a0))"


# float-only unary ops: op -> C expression over a0, from the op's attributes
_FLOAT_UNARY: dict[str, Callable[[dict[str, Any]], str]] = {
    "nn.leaky_relu": lambda a: activation_c("leaky_relu", (a["alpha"],), "a0"),
    "sigmoid": lambda a: "1.0f / (1.0f + exp(-a0))",
    "round": lambda a: "round(a0)",
    **{op: (lambda a, op=op: f"{op}(a0)") for op in ("tanh", "exp", "log", "sqrt", "erf")},
    "softplus": lambda a: _SOFTPLUS,
    "mish": lambda a: f"(a0 * tanh({_SOFTPLUS}))",
    "gelu": _gelu,
    "hard_sigmoid": lambda a: activation_c("hard_sigmoid", (a["alpha"], a["beta"]), "a0"),
    "hard_swish": lambda a: activation_c("hard_swish", (), "a0"),
    "nn.elu": lambda a: _elu(a["alpha"]),
    "selu": lambda a: f"({c_float(a['gamma'])} * {_elu(a['alpha'])})",
}


def _binary_expr(op: str, dtype: str) -> str:
    """The C expression of a binary op whose first operand has ``dtype``."""
    return _INT_BINARY.get(op, _BINARY[op]) if dtype != "float32" else _BINARY[op]


def _unary_expr(op: str, attrs: dict[str, Any], dtype: str = "float32") -> str:
    integer = dtype != "float32"
    if op in _FLOAT_UNARY:
        return _FLOAT_UNARY[op](attrs)
    if op == "nn.relu":
        return "max(a0, 0)" if integer else activation_c("relu", (), "a0")
    if op == "clip":
        if integer:
            lo, hi = math.ceil(attrs["a_min"]), math.floor(attrs["a_max"])
            return f"min(max(a0, {lo}), {hi})"
        return activation_c("clip", (attrs["a_min"], attrs["a_max"]), "a0")
    if op == "abs":
        return "(a0 < 0 ? -a0 : a0)" if integer else "fabs(a0)"
    if op == "negative":
        return "(-a0)"
    if op in ("copy", "cast"):
        return "a0"  # the store converts
    raise NoKernelError(f"{op}: no element-wise C expression")


def _aligned(shape: Sequence[int], ndim: int) -> tuple[int, ...]:
    """``shape`` as numpy broadcasts it against ``ndim`` dimensions (leading ones)."""
    return (1,) * (ndim - len(shape)) + tuple(shape)


def _on_axis(length: int, ndim: int, axis: int) -> tuple[int, ...]:
    """A per-channel vector as a broadcastable shape along ``axis``."""
    shape = [1] * ndim
    shape[axis % ndim] = length
    return tuple(shape)


# ops whose C expressions (``_BINARY``, ``_unary_expr``) are also valid on OpenCL float
# vectors: arithmetic, comparisons inside ternaries, overloaded math built-ins; not the
# ones that cast to scalar (power, cast) or yield bool
_VECTOR_OPS = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum",
                         "nn.prelu", "nn.bias_add", "nn.relu", "clip", "abs", "negative",
                         "copy", "nn.leaky_relu", "sigmoid", "tanh", "exp", "log", "sqrt",
                         "hard_sigmoid", "hard_swish", "nn.elu", "selu", "softplus",
                         "mish", "erf"})
_WIDTHS = (16, 8, 4, 2)


def _vector_safe(node: Node, ops: Sequence[str]) -> bool:
    """Float operands and result, every op vector-safe (``_VECTOR_OPS``)."""
    return (node.ty.dtype == "float32" and all(a.ty.dtype == "float32" for a in node.inputs)
            and all(op in _VECTOR_OPS for op in ops))


def _vector_width(node: Node, shapes: Sequence[tuple[int, ...]], ops: Sequence[str]) -> int:
    """Lanes per work-item for a float element-wise kernel: the widest of ``_WIDTHS``
    that divides every broadcast operand's run (the trailing output extent over which
    it is one value); 1 when no width does or an op is not vector-safe."""
    out = node.ty.shape
    if not node.ty.size or not _vector_safe(node, ops):
        return 1
    runs = [node.ty.size]
    for shape in shapes:
        if shape != out:
            k = len(out)
            while k and shape[k - 1] == 1:
                k -= 1
            runs.append(math.prod(out[k:]))
    run = math.gcd(*runs)
    return next((w for w in _WIDTHS if run % w == 0), 1)


def _elementwise(node: Node, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 lines: Sequence[str], value: str, ops: Sequence[str]) -> Kernel:
    """``lines`` (statements over the loaded operands ``a{k}``; ``{T}`` names their
    working type) then ``value`` stored: vectorised where ``_vector_width`` allows."""
    width = _vector_width(node, shapes, ops)
    if width == 1:
        scalar = _LOAD[node.ty.dtype]
        return _kernel(node, names, shapes,
                       [*(line.replace("{T}", scalar) for line in lines),
                        _store(node, value)])
    out_shape = node.ty.shape
    body = [f"const int e = i * {width};"]
    if any(s != out_shape for s in shapes):
        body += unravel("e", out_shape)
    coords = [f"c{k}" for k in range(len(out_shape))]
    vector, scalar = [], []
    for k, (name, shape) in enumerate(zip(names, shapes)):
        if shape == out_shape:
            vector.append(f"const float{width} a{k} = vload{width}(i, {name});")
            scalar.append(f"const float a{k} = {name}[e + l];")
        else:  # one value over the run
            load = f"const float a{k} = {name}[{linear(coords, shape)}];"
            vector.append(load)
            scalar.append(load)
    body += ["#ifdef __OPENCL_VERSION__",
             *vector,
             *(line.replace("{T}", f"float{width}") for line in lines),
             f"vstore{width}({value}, i, out);",
             "#else",
             f"for (int l = 0; l < {width}; ++l) {{",
             *indent([*scalar, *(line.replace("{T}", "float") for line in lines),
                      f"out[e + l] = {value};"]),
             "}",
             "#endif"]
    return per_item(node, names, node.ty.size // width, body)


def blocks_output(node: Node, block: int) -> bool:
    """Whether ``chain_blocked`` can write ``node`` (a float ``fused.elementwise`` on
    NCHW) in NCHW[block]c: ``block`` is a vector width dividing C, every op is
    vector-safe, and each other operand is full-shape or one value per (n, c)."""
    if node.op != "fused.elementwise" or node.ty.ndim != 4 or block not in _WIDTHS \
            or node.ty.shape[1] % block:
        return False
    out = node.ty.shape
    shapes = [_aligned(a.ty.shape, 4) for a in node.inputs]
    if not _vector_safe(node, [op for op, _, _ in node.attrs["chain"]]):
        return False
    return all(s == out or (s[2:] == (1, 1) and s[0] in (1, out[0]) and s[1] in (1, out[1]))
               for s in _chain_shapes(node, shapes))


def _kernel(node: Node, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
            result: Sequence[str]) -> Kernel:
    """Load operand k (as broadcast ``shapes[k]``) into ``a{k}``, then run ``result``."""
    out_shape = node.ty.shape
    body = unravel("i", out_shape) if any(s != out_shape for s in shapes) else []
    coords = [f"c{k}" for k in range(len(out_shape))]
    for k, (name, shape, arg) in enumerate(zip(names, shapes, node.inputs)):
        index = "i" if shape == out_shape else linear(coords, shape)
        body.append(f"const {_LOAD[arg.ty.dtype]} a{k} = {name}[{index}];")
    return per_item(node, names, node.ty.size, [*body, *result])


def _store(node: Node, value: str) -> str:
    if node.ty.dtype == "bool":  # C's conversion to bool: 0 or 1
        return f"out[i] = (BOOL_T)(({value}) != 0);"
    return f"out[i] = ({C_TYPES[node.ty.dtype]})({value});"


def binary(node: Node) -> Kernel:
    ndim = node.ty.ndim
    shapes = [_aligned(a.ty.shape, ndim) for a in node.inputs]
    expr = _binary_expr(node.op, node.inputs[0].ty.dtype)
    return _elementwise(node, ("lhs", "rhs"), shapes, [], expr, [node.op])


def where(node: Node) -> Kernel:
    ndim = node.ty.ndim
    shapes = [_aligned(a.ty.shape, ndim) for a in node.inputs]
    return _kernel(node, ("condition", "x", "y"), shapes, [_store(node, "(a0 ? a1 : a2)")])


def unary(node: Node) -> Kernel:
    expr = _unary_expr(node.op, node.attrs, node.inputs[0].ty.dtype)
    return _elementwise(node, ("data",), [node.ty.shape], [], expr, [node.op])


def bias_add(node: Node) -> Kernel:
    data, bias = node.inputs
    shape = _on_axis(bias.ty.size, data.ty.ndim, node.attrs["axis"])
    return _kernel(node, ("data", "bias"), [data.ty.shape, shape], [_store(node, "a0 + a1")])


def batch_norm(node: Node) -> Kernel:
    """Inference batch-norm as ``x * scale + shift``, the IR's formulation."""
    data = node.inputs[0]
    vec = _on_axis(node.inputs[1].ty.size, data.ty.ndim, node.attrs["axis"])
    eps = c_float(node.attrs["epsilon"])
    return _kernel(node, ("data", "gamma", "beta", "moving_mean", "moving_var"),
                   [data.ty.shape, vec, vec, vec, vec],
                   [f"const float scale = a1 / sqrt(a4 + {eps});",
                    "out[i] = a0 * scale + (a2 - a3 * scale);"])


def _step_expr(op: str, attrs: dict[str, Any], dtype: str) -> str:
    """One chain step over the running value ``a0`` and its operand ``a1``."""
    if op == "nn.bias_add":
        return "a0 + a1"
    return _binary_expr(op, dtype) if op in _BINARY else _unary_expr(op, attrs, dtype)


def _chain_shapes(node: Node, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each operand's broadcast shape (a bias_add's vector lies along its axis)."""
    for op, operand, items in node.attrs["chain"]:
        if op == "nn.bias_add":
            shapes[operand] = _on_axis(node.inputs[operand].ty.size, node.ty.ndim,
                                       dict(items)["axis"])
    return shapes


def _chain_lines(node: Node) -> list[str]:
    """The chain's statements over ``a0`` .. (``{T}`` the working type); result in v."""
    dtype = node.ty.dtype  # a chain keeps its running value's type
    body = ["{T} v = a0;"]
    for op, operand, items in node.attrs["chain"]:
        expr = _step_expr(op, dict(items), dtype).replace("a0", "v")
        if operand >= 0:
            expr = expr.replace("a1", f"a{operand}")
        # int8 arithmetic wraps at every step, as numpy's does
        body.append(f"v = (INT8_T)({expr});" if dtype == "int8" else f"v = {expr};")
    return body


def chain_blocked(node: Node, block: int) -> Kernel:
    """``fused.elementwise`` read in NCHW, written in NCHW[block]c (``blocks_output``):
    the chain and the layout transform its reader (a blocked-io convolution) would need
    in one pass. A work-item computes one pixel's ``block`` channels: the running value
    gathered down the channels, per-channel operands loaded as one vector, one vector
    store (a loop over the channels in CUDA)."""
    if not blocks_output(node, block):
        raise NoKernelError(f"{node.op} {node.name or '(unnamed)'}: cannot be written in "
                            f"NCHW[{block}]c")
    n, c, h, w = node.ty.shape
    hw, cb = h * w, c // block
    names = [f"in{k}" for k in range(len(node.inputs))]
    shapes = _chain_shapes(node, [_aligned(a.ty.shape, 4) for a in node.inputs])
    body = [f"const int p = i % {hw}, cb = (i / {hw}) % {cb}, n = i / {hw * cb};",
            f"const int src = (n * {c} + cb * {block}) * {hw} + p;"]
    vector, scalar = [], []
    for k, (name, shape) in enumerate(zip(names, shapes)):
        if shape == node.ty.shape:  # plain NCHW: the block's channels lie hw apart
            lanes = ", ".join(f"{name}[src + {lane * hw}]" for lane in range(block))
            vector.append(f"const float{block} a{k} = (float{block})({lanes});")
            scalar.append(f"const float a{k} = {name}[src + l * {hw}];")
            continue
        row = f"n * {shape[1]}" if shape[0] > 1 else "0"
        if shape[1] > 1:  # one value per channel: the block's are contiguous
            vector.append(f"const float{block} a{k} = vload{block}(0, {name} + {row} + "
                          f"cb * {block});")
            scalar.append(f"const float a{k} = {name}[{row} + cb * {block} + l];")
        else:
            load = f"const float a{k} = {name}[{row}];"
            vector.append(load)
            scalar.append(load)
    lines = _chain_lines(node)
    body += ["#ifdef __OPENCL_VERSION__",
             *vector,
             *(line.replace("{T}", f"float{block}") for line in lines),
             f"vstore{block}(v, i, out);",
             "#else",
             f"for (int l = 0; l < {block}; ++l) {{",
             *indent([*scalar, *(line.replace("{T}", "float") for line in lines),
                      f"out[i * {block} + l] = v;"]),
             "}",
             "#endif"]
    kernel = per_item(node, names, n * cb * hw, body)
    out = kernel.buffers[-1]
    return dataclasses.replace(kernel, buffers=(
        *kernel.buffers[:-1], dataclasses.replace(out, shape=(n, cb, h, w, block))))


def chain(node: Node) -> Kernel:
    """``fused.elementwise``: every step of the chain on one loaded value, one store."""
    ndim = node.ty.ndim
    shapes = _chain_shapes(node, [_aligned(a.ty.shape, ndim) for a in node.inputs])
    names = [f"in{k}" for k in range(len(node.inputs))]
    return _elementwise(node, names, shapes, _chain_lines(node), "v",
                        [op for op, _, _ in node.attrs["chain"]])


# ops that can write their output in NCHW[b]c: op -> (can it, for this node and b; kernel)
BLOCKED_KERNELS: dict[str, tuple[Callable[[Node, int], bool],
                                 Callable[[Node, int], Kernel]]] = {
    "fused.elementwise": (blocks_output, chain_blocked),
}

KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "fused.elementwise": chain,
    **{op: binary for op in _BINARY},
    **{op: unary for op in (*_FLOAT_UNARY, "nn.relu", "clip", "abs", "negative", "copy",
                            "cast")},
    "where": where,
    "nn.bias_add": bias_add,
    "nn.batch_norm": batch_norm,
}

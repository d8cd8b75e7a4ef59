"""Element-wise ops, one work-item per output element; either operand may broadcast
(numpy rules), so a (C, 1, 1) constant scale or a scalar needs no expand kernel."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from compiler.ir import Node
from compiler.kernels.common import NoKernelError, linear, per_item, unravel
from compiler.templates.activations import activation_c
from compiler.templates.base import Kernel
from compiler.templates.emit import C_TYPES, c_float

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
    return _kernel(node, ("lhs", "rhs"), shapes, [_store(node, expr)])


def where(node: Node) -> Kernel:
    ndim = node.ty.ndim
    shapes = [_aligned(a.ty.shape, ndim) for a in node.inputs]
    return _kernel(node, ("condition", "x", "y"), shapes, [_store(node, "(a0 ? a1 : a2)")])


def unary(node: Node) -> Kernel:
    return _kernel(node, ("data",), [node.ty.shape],
                   [_store(node, _unary_expr(node.op, node.attrs, node.inputs[0].ty.dtype))])


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


def chain(node: Node) -> Kernel:
    """``fused.elementwise``: every step of the chain on one loaded value, one store."""
    ndim = node.ty.ndim
    shapes = [_aligned(a.ty.shape, ndim) for a in node.inputs]
    for op, operand, items in node.attrs["chain"]:
        if op == "nn.bias_add":
            shapes[operand] = _on_axis(node.inputs[operand].ty.size, ndim, dict(items)["axis"])
    names = [f"in{k}" for k in range(len(node.inputs))]
    dtype = node.ty.dtype  # a chain keeps its running value's type
    body = [f"{_LOAD[dtype]} v = a0;"]
    for op, operand, items in node.attrs["chain"]:
        expr = _step_expr(op, dict(items), dtype).replace("a0", "v")
        if operand >= 0:
            expr = expr.replace("a1", f"a{operand}")
        # int8 arithmetic wraps at every step, as numpy's does
        body.append(f"v = (INT8_T)({expr});" if dtype == "int8" else f"v = {expr};")
    return _kernel(node, names, shapes, [*body, _store(node, "v")])


KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "fused.elementwise": chain,
    **{op: binary for op in _BINARY},
    **{op: unary for op in (*_FLOAT_UNARY, "nn.relu", "clip", "abs", "negative", "copy",
                            "cast")},
    "where": where,
    "nn.bias_add": bias_add,
    "nn.batch_norm": batch_norm,
}

"""Element-wise ops, one work-item per output element; either operand may broadcast
(numpy rules), so a (C, 1, 1) constant scale or a scalar needs no expand kernel."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from compiler.ir import Node
from compiler.kernels.common import c_float, linear, per_item, unravel
from compiler.templates.base import Kernel

# op -> C expression over the loaded operands a0, a1
_BINARY = {"add": "a0 + a1", "multiply": "a0 * a1", "subtract": "a0 - a1", "divide": "a0 / a1",
           "right_shift": "a0 >> a1"}
# operands load as float (float32) or int (int32 and int8: C's promotion, made explicit);
# the store converts to the output's C type (a cast's whole work)
_LOAD = {"float32": "float", "int32": "int", "int8": "int"}
_STORE = {"float32": "float", "int32": "int", "int8": "INT8_T"}


def _unary_expr(op: str, attrs: dict[str, Any], dtype: str = "float32") -> str:
    integer = dtype != "float32"
    if op == "nn.relu":
        return "max(a0, 0)" if integer else "fmax(a0, 0.0f)"
    if op == "nn.leaky_relu":
        return f"(a0 >= 0.0f ? a0 : a0 * {c_float(attrs['alpha'])})"
    if op == "sigmoid":
        return "1.0f / (1.0f + exp(-a0))"
    if op == "round":
        return "round(a0)"
    if op == "clip":
        if integer:
            lo, hi = math.ceil(attrs["a_min"]), math.floor(attrs["a_max"])
            return f"min(max(a0, {lo}), {hi})"
        return f"fmin(fmax(a0, {c_float(attrs['a_min'])}), {c_float(attrs['a_max'])})"
    return "a0"  # copy, cast (the store converts)


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
    return f"out[i] = ({_STORE[node.ty.dtype]})({value});"


def binary(node: Node) -> Kernel:
    ndim = node.ty.ndim
    shapes = [_aligned(a.ty.shape, ndim) for a in node.inputs]
    return _kernel(node, ("lhs", "rhs"), shapes, [_store(node, _BINARY[node.op])])


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
    return _BINARY[op] if op in _BINARY else _unary_expr(op, attrs, dtype)


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
    **{op: unary for op in ("nn.relu", "nn.leaky_relu", "sigmoid", "copy", "round", "clip",
                            "cast")},
    "nn.bias_add": bias_add,
    "nn.batch_norm": batch_norm,
}

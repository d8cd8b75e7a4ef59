"""Element-wise operators: activations, arithmetic and comparisons (numpy broadcasting),
Where, Cast, and the variadic Sum / Mean / Max / Min.

When every input of one of them is known at import time, it is computed here in numpy
(shape arithmetic stays out of the graph, where Reshape and Slice can read it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from compiler.frontend.onnx.importer import (
    Converter,
    Importer,
    NodeError,
    OnnxNode,
    Value,
)
from compiler.ir.ops import evaluate_op, get_op
from compiler.ir.ops.elementwise import CASTABLE

# Clip before version 11: the attributes' defaults (float32's lowest and highest)
FLOAT_MAX = float(np.finfo(np.float32).max)


def _apply(imp: Importer, node: OnnxNode, op: str, inputs: Sequence[tuple[Value, str]],
           **attrs: Any) -> Value:
    """``op`` on the (value, ONNX name) pairs: in numpy when all are arrays, else an IR
    node (arrays become constants)."""
    values = [value for value, _ in inputs]
    if all(isinstance(v, np.ndarray) for v in values):
        return evaluate_op(op, values, get_op(op).normalize(attrs))
    return imp.call(op, [imp.node(v, name) for v, name in inputs], node, **attrs)


def _args(imp: Importer, node: OnnxNode, count: int) -> list[tuple[Value, str]]:
    names = [node.arg(i) for i in range(count)]
    return [(imp.value(name), name) for name in names]


def _unary(op: str, *attributes: str) -> Converter:
    """A one-input op whose ONNX ``attributes`` are the IR op's (the IR's defaults are
    ONNX's)."""
    def convert(imp: Importer, node: OnnxNode) -> Sequence[Value]:
        attrs = {k: node.attrs[k] for k in attributes if k in node.attrs}
        return [_apply(imp, node, op, _args(imp, node, 1), **attrs)]
    return convert


def _binary(op: str) -> Converter:
    def convert(imp: Importer, node: OnnxNode) -> Sequence[Value]:
        return [_apply(imp, node, op, _args(imp, node, 2))]
    return convert


def _bound(imp: Importer, node: OnnxNode, index: int, what: str) -> Value | None:
    """Clip's optional min / max input (version 11 on): a scalar, or None when absent."""
    name = node.optional(index)
    if name is None:
        return None
    value = imp.value(name)
    shape = value.shape if isinstance(value, np.ndarray) else value.ty.shape
    if tuple(shape) not in ((), (1,)):
        raise NodeError(f"{what} must be a scalar, got shape {list(shape)}")
    return value


def _clip(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """``clip`` for bounds known at import time; maximum / minimum with computed ones."""
    data, name = imp.value(node.arg(0)), node.arg(0)
    if node.version < 11:
        bounds: list[Value | None] = [
            np.array(node.attrs.get("min", -FLOAT_MAX), np.float32),
            np.array(node.attrs.get("max", FLOAT_MAX), np.float32)]
    else:
        bounds = [_bound(imp, node, 1, "min"), _bound(imp, node, 2, "max")]
    if all(b is None for b in bounds):
        return [data]
    if all(b is None or isinstance(b, np.ndarray) for b in bounds):
        dtype = np.dtype(data.dtype if isinstance(data, np.ndarray) else data.ty.dtype)
        limits = np.iinfo(dtype) if dtype.kind in "iu" else None  # an absent bound: none
        lo, hi = (float(np.asarray(b).reshape(())) if b is not None
                  else float(getattr(limits, side, sign * np.inf))
                  for b, side, sign in zip(bounds, ("min", "max"), (-1, 1)))
        # min > max: every value becomes max (numpy's clip, ONNX's definition)
        return [_apply(imp, node, "clip", [(data, name)], a_min=min(lo, hi), a_max=hi)]
    for op, bound, which in (("maximum", bounds[0], "min"), ("minimum", bounds[1], "max")):
        if bound is not None:
            operand = bound.reshape(()) if isinstance(bound, np.ndarray) else bound
            data = imp.call(op, [imp.node(data, name), imp.node(operand, f"{name}.{which}")],
                            node)
    return [data]


def _narrowed(value: Value, what: str) -> Value:
    """A constant of a type the kernels lack (int64 and other integers, float64 / float16)
    as int32 / float32; other values unchanged."""
    if not isinstance(value, np.ndarray) or value.dtype in (np.float32, np.int32, np.int8):
        return value
    if value.dtype.kind == "f":
        return value.astype(np.float32)
    info = np.iinfo(np.int32)
    if value.dtype.kind not in "iu" or (value.size and not (info.min <= value.min()
                                                          and value.max() <= info.max)):
        raise NodeError(f"the {value.dtype} {what} is not supported: only float and integer "
                        "constants, integers within int32's range")
    return value.astype(np.int32)


def _pow(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """The result has the base's type; a constant base or exponent of a type the kernels
    lack computes as int32 / float32 (when every operand is known at import time, numpy
    computes it in the operands' own types)."""
    (base, base_name), (exponent, exp_name) = _args(imp, node, 2)
    if isinstance(base, np.ndarray) and isinstance(exponent, np.ndarray):
        return [evaluate_op("power", [base, exponent], {})]
    return [_apply(imp, node, "power", [(_narrowed(base, "base"), base_name),
                                        (_narrowed(exponent, "exponent"), exp_name)])]


def _variadic(op: str) -> Converter:
    """Sum, Max, Min: the binary op folded over every input, left to right."""
    def convert(imp: Importer, node: OnnxNode) -> Sequence[Value]:
        return [_fold(imp, node, op)]
    return convert


def _fold(imp: Importer, node: OnnxNode, op: str) -> Value:
    terms = [(imp.value(name), name) for name in node.inputs if name]
    if not terms:
        raise NodeError("needs at least one input")
    total = terms[0]
    for k, term in enumerate(terms[1:], start=1):
        total = (_apply(imp, node, op, [total, term]), f"{node.name}.{op}{k}")
    return total[0]


def _mean(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    total = _fold(imp, node, "add")
    count = sum(1 for name in node.inputs if name)
    if count == 1:
        return [total]
    dtype = total.dtype if isinstance(total, np.ndarray) else total.ty.dtype
    divisor = np.array(count, dtype=dtype)
    return [_apply(imp, node, "divide", [(total, f"{node.name}.sum"),
                                         (divisor, f"{node.name}.count")])]


def _where(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    return [_apply(imp, node, "where", _args(imp, node, 3))]


def _cast(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Import-time constants to any type numpy has; computed tensors between float32,
    int32, int8 and bool (float -> int truncates toward zero, as ONNX and C do)."""
    dtype = str(onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])))
    value = imp.value(node.arg(0))
    if isinstance(value, np.ndarray):
        return [value.astype(dtype)]
    if value.ty.dtype == dtype:
        return [value]
    if dtype not in CASTABLE:
        raise NodeError(f"casting a computed {value.ty.dtype} tensor to {dtype} is not "
                        f"supported; only between {', '.join(CASTABLE)} (import-time "
                        "constants cast to any type)")
    return [imp.call("cast", [value], node, dtype=dtype)]


_UNARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "Abs": ("abs", ()),
    "Elu": ("nn.elu", ("alpha",)),
    "Erf": ("erf", ()),
    "Exp": ("exp", ()),
    "Gelu": ("gelu", ("approximate",)),
    "HardSigmoid": ("hard_sigmoid", ("alpha", "beta")),
    "HardSwish": ("hard_swish", ()),
    "LeakyRelu": ("nn.leaky_relu", ("alpha",)),
    "Log": ("log", ()),
    "Mish": ("mish", ()),
    "Neg": ("negative", ()),
    "Relu": ("nn.relu", ()),
    "Selu": ("selu", ("alpha", "gamma")),
    "Sigmoid": ("sigmoid", ()),
    "Softplus": ("softplus", ()),
    "Sqrt": ("sqrt", ()),
    "Tanh": ("tanh", ()),
}
_BINARY = {"Add": "add", "Div": "divide", "Equal": "equal", "Greater": "greater",
           "Less": "less", "Mul": "multiply", "PRelu": "nn.prelu", "Sub": "subtract"}
_OTHERS: dict[str, Converter] = {
    "Cast": _cast,
    "Clip": _clip,
    "Max": _variadic("maximum"),
    "Mean": _mean,
    "Min": _variadic("minimum"),
    "Pow": _pow,
    "Sum": _variadic("add"),
    "Where": _where,
}

CONVERTERS: dict[str, Converter] = {
    **{name: _unary(op, *attributes) for name, (op, attributes) in _UNARY.items()},
    **{name: _binary(op) for name, op in _BINARY.items()},
    **_OTHERS,
}

"""Element-wise ops (numpy broadcasting), per-channel bias and batch-norm, and the
fused element-wise chain.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import (
    NUMERIC,
    OpDef,
    binary_infer,
    check_axis,
    define,
    expand_to_axis,
    float_only,
    get_op,
    keep_dtype,
    numeric,
    same_float,
)
from compiler.ir.types import TensorType

ADD = define("add", binary_infer, keep_dtype(lambda x, a: x[0] + x[1]), (2, 2), elementwise=True)
MULTIPLY = define("multiply", binary_infer, keep_dtype(lambda x, a: x[0] * x[1]), (2, 2),
               elementwise=True)
define("subtract", binary_infer, keep_dtype(lambda x, a: x[0] - x[1]), (2, 2), elementwise=True)
define("divide", binary_infer, keep_dtype(lambda x, a: x[0] / x[1]), (2, 2), elementwise=True)
define("nn.relu", numeric, keep_dtype(lambda x, a: np.maximum(x[0], 0)), elementwise=True)
define("nn.leaky_relu", same_float,
    keep_dtype(lambda x, a: np.where(x[0] >= 0, x[0], x[0] * np.float32(a["alpha"]))),
    elementwise=True, alpha=0.01)
define("sigmoid", same_float, keep_dtype(lambda x, a: 1.0 / (1.0 + np.exp(-x[0].astype(np.float64)))),
    elementwise=True)
define("copy", lambda t, a: t[0], lambda x, a: x[0].copy(), elementwise=True)
# Quantization (TVM v0.5's realize): round half away from zero as C's round() does,
# clip, cast (float -> int truncates toward zero, as C), arithmetic right shift.
def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's round(): to the nearest integer, ties away from zero (numpy's rounds to even;
    floor(|x| + 0.5) is wrong just below a tie in float32)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


define("round", same_float, keep_dtype(lambda x, a: round_half_away(x[0])), elementwise=True)


def _clip_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    if attrs["a_min"] > attrs["a_max"]:
        raise IRError(f"a_min {attrs['a_min']} > a_max {attrs['a_max']}")
    return numeric(types, attrs)


def _clip(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    lo, hi = attrs["a_min"], attrs["a_max"]
    if np.issubdtype(xs[0].dtype, np.integer):  # integer bounds inside [a_min, a_max]
        lo, hi = math.ceil(lo), math.floor(hi)
    return np.clip(xs[0], lo, hi).astype(xs[0].dtype)


define("clip", _clip_infer, _clip, elementwise=True, a_min=0.0, a_max=0.0)


def _cast_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    numeric(types, attrs)
    if attrs["dtype"] not in NUMERIC:
        raise IRError(f"cannot cast to {attrs['dtype']!r}: one of {', '.join(NUMERIC)}")
    return TensorType(types[0].shape, attrs["dtype"])


define("cast", _cast_infer, lambda x, a: x[0].astype(a["dtype"]), dtype="float32")


def _shift_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    out = binary_infer(types, attrs)
    if out.dtype not in ("int32", "int8"):
        raise IRError(f"right_shift takes integers, got {out.dtype}")
    return out


define("right_shift", _shift_infer, keep_dtype(lambda x, a: x[0] >> x[1]), (2, 2), elementwise=True)

# Heterogeneous execution: moves a value from the device that computed it to the one
# that reads it (TVM's device_copy); its numpy semantics are the identity.
define("device_copy", lambda t, a: t[0], lambda x, a: x[0].copy(), src_device="",
    dst_device="")





def _bias_add_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    data, bias = types
    if data.dtype not in ("float32", "int32") or bias.dtype != data.dtype:
        raise IRError(f"expects float32 or int32 data and a bias of its dtype, got "
                      f"{data.dtype} and {bias.dtype}")
    axis = check_axis(attrs["axis"], data.ndim)
    if bias.shape != (data.shape[axis],):
        raise IRError(f"bias of shape {list(bias.shape)} for axis {axis} of {list(data.shape)}")
    return data



define("nn.bias_add", _bias_add_infer,
    keep_dtype(lambda x, a: x[0] + expand_to_axis(x[1], x[0].ndim, a["axis"])), (2, 2),
    elementwise=True, axis=1)


def _batch_norm_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    float_only(types)
    data = types[0]
    channels = data.shape[check_axis(attrs["axis"], data.ndim)]
    for name, t in zip(("gamma", "beta", "moving_mean", "moving_var"), types[1:]):
        if t.shape != (channels,):
            raise IRError(f"{name} has shape {list(t.shape)}, expected [{channels}]")
    return data


def batch_norm_scale_shift(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                           var: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Inference batch-norm as y = x * scale + shift, per channel (float64 then float32)."""
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    shift = beta.astype(np.float64) - mean.astype(np.float64) * scale
    return scale.astype(np.float32), shift.astype(np.float32)


def _batch_norm(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    scale, shift = batch_norm_scale_shift(*xs[1:], attrs["epsilon"])
    ndim, axis = xs[0].ndim, attrs["axis"]
    return (xs[0] * expand_to_axis(scale, ndim, axis)
            + expand_to_axis(shift, ndim, axis)).astype(np.float32)


define("nn.batch_norm", _batch_norm_infer, _batch_norm, (5, 5), axis=1, epsilon=1e-5)


# A chain of element-wise ops run as one kernel. ``chain`` lists (op, operand, attrs):
# each op applies to the running value (input 0 to start with) and, for binary ops, to
# input ``operand`` (-1 for unary ops); the running value is always the op's first
# operand, so subtract and divide keep their order.


def _chain_steps(attrs: dict[str, Any]) -> list[tuple[OpDef, int, dict[str, Any]]]:
    steps = []
    for op, operand, items in attrs["chain"]:
        opdef = get_op(op)
        if not opdef.elementwise:
            raise IRError(f"{op} is not element-wise")
        steps.append((opdef, operand, opdef.normalize(dict(items))))
    return steps


def _chain_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    running = types[0]
    for opdef, operand, op_attrs in _chain_steps(attrs):
        args = [running] if operand < 0 else [running, types[operand]]
        out = opdef.infer(args, op_attrs)
        if out != running:
            raise IRError(f"{opdef.name} would change the running value's type to {out}")
    return running


def _chain(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    value = xs[0]
    for opdef, operand, op_attrs in _chain_steps(attrs):
        value = opdef.compute([value] if operand < 0 else [value, xs[operand]], op_attrs)
    return value


define("fused.elementwise", _chain_infer, _chain, (1, 1 << 16), chain=())

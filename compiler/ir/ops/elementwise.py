"""Element-wise ops (numpy broadcasting), per-channel bias and batch-norm, and the
fused element-wise chain. Activations that templates' epilogues also compute take their
numpy semantics from compiler.templates.activations (where their C is too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import (
    NUMERIC,
    Compute,
    OpDef,
    binary_infer,
    broadcast_shape,
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
from compiler.templates.activations import activation_np

ADD = define("add", binary_infer, keep_dtype(lambda x, a: x[0] + x[1]), (2, 2), elementwise=True)
MULTIPLY = define("multiply", binary_infer, keep_dtype(lambda x, a: x[0] * x[1]), (2, 2),
               elementwise=True)
define("subtract", binary_infer, keep_dtype(lambda x, a: x[0] - x[1]), (2, 2), elementwise=True)
define("divide", binary_infer, keep_dtype(lambda x, a: x[0] / x[1]), (2, 2), elementwise=True)
define("nn.relu", numeric, keep_dtype(lambda x, a: np.maximum(x[0], 0)), elementwise=True)
define("nn.leaky_relu", same_float,
    keep_dtype(lambda x, a: activation_np("leaky_relu", (a["alpha"],), x[0])),
    elementwise=True, alpha=0.01)
define("copy", lambda t, a: t[0], lambda x, a: x[0].copy(), elementwise=True)


def _float64(fn: Callable[[np.ndarray, dict[str, Any]], np.ndarray]) -> Compute:
    """A float op computed in float64, then rounded to the input dtype; domain errors
    give NaN / inf silently, as the kernels do."""
    def compute(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(xs[0].astype(np.float64), attrs)).astype(xs[0].dtype)
    return compute


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu_approximate(attrs: dict[str, Any]) -> str:
    if attrs["approximate"] not in ("none", "tanh"):
        raise IRError(f"approximate must be 'none' or 'tanh', got {attrs['approximate']!r}")
    return str(attrs["approximate"])


def _gelu(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    if _gelu_approximate(attrs) == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _gelu_approximate(attrs)
    return same_float(types, attrs)


def _float_unary(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    define(name, same_float, _float64(lambda x, a: fn(x)), elementwise=True)


_float_unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)))
_float_unary("tanh", np.tanh)
_float_unary("exp", np.exp)
_float_unary("log", np.log)
_float_unary("sqrt", np.sqrt)
_float_unary("erf", _erf)
_float_unary("softplus", _softplus)
_float_unary("mish", lambda x: x * np.tanh(_softplus(x)))
_float_unary("hard_swish", lambda x: activation_np("hard_swish", (), x))
define("gelu", _gelu_infer, _float64(_gelu), elementwise=True, approximate="none")
define("hard_sigmoid", same_float,
    _float64(lambda x, a: activation_np("hard_sigmoid", (a["alpha"], a["beta"]), x)),
    elementwise=True, alpha=0.2, beta=0.5)
define("nn.elu", same_float,
    _float64(lambda x, a: np.where(x > 0, x, np.float32(a["alpha"]) * np.expm1(x))),
    elementwise=True, alpha=1.0)
# the defaults are ONNX's (SELU's constants rounded to float32), as for every
# activation here: the ONNX frontend passes only the attributes a node sets
define("selu", same_float,
    _float64(lambda x, a: np.float32(a["gamma"])
             * np.where(x > 0, x, np.float32(a["alpha"]) * np.expm1(x))),
    elementwise=True, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875)
define("abs", numeric, keep_dtype(lambda x, a: np.abs(x[0])), elementwise=True)
define("negative", numeric, keep_dtype(lambda x, a: np.negative(x[0])), elementwise=True)


def _prelu_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """The slope broadcasts to the data (ONNX's unidirectional broadcasting)."""
    float_only(types)
    data, slope = types
    if broadcast_shape(data.shape, slope.shape) != data.shape:
        raise IRError(f"slope of shape {list(slope.shape)} does not broadcast to the data's "
                      f"{list(data.shape)}")
    return data


define("nn.prelu", _prelu_infer,
    keep_dtype(lambda x, a: np.where(x[0] > 0, x[0], x[0] * x[1])), (2, 2), elementwise=True)


def _numeric_binary(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    numeric(types, attrs)
    return binary_infer(types, attrs)


define("maximum", _numeric_binary, keep_dtype(lambda x, a: np.maximum(x[0], x[1])), (2, 2),
    elementwise=True)
define("minimum", _numeric_binary, keep_dtype(lambda x, a: np.minimum(x[0], x[1])), (2, 2),
    elementwise=True)


def _power_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """Any numeric base and exponent; the result has the base's dtype (ONNX's Pow)."""
    numeric(types, attrs)
    base, exponent = types
    return TensorType(broadcast_shape(base.shape, exponent.shape), base.dtype)


def _power(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    # in float64: numpy refuses integers to negative integer powers, C's pow does not
    with np.errstate(all="ignore"):
        return np.power(xs[0].astype(np.float64), xs[1].astype(np.float64)).astype(xs[0].dtype)


define("power", _power_infer, _power, (2, 2), elementwise=True)


def _compare_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """Operands of one dtype, a bool result: not ``elementwise`` (a fused chain keeps its
    running value's type)."""
    return TensorType(binary_infer(types, attrs).shape, "bool")


define("equal", _compare_infer, lambda x, a: np.equal(x[0], x[1]), (2, 2))
define("greater", _compare_infer, lambda x, a: np.greater(x[0], x[1]), (2, 2))
define("less", _compare_infer, lambda x, a: np.less(x[0], x[1]), (2, 2))


def _where_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    cond, x, y = types
    if cond.dtype != "bool":
        raise IRError(f"the condition must be bool, got {cond.dtype}")
    if x.dtype != y.dtype:
        raise IRError(f"dtypes differ: {x.dtype} and {y.dtype}")
    return TensorType(broadcast_shape(cond.shape, x.shape, y.shape), x.dtype)


define("where", _where_infer, lambda x, a: np.where(x[0], x[1], x[2]).astype(x[1].dtype), (3, 3))


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


CASTABLE = (*NUMERIC, "bool")


def _cast_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """Between float32, the integers and bool: float -> int truncates toward zero (as C
    and ONNX do), anything -> bool is ``!= 0``."""
    for dtype in (types[0].dtype, attrs["dtype"]):
        if dtype not in CASTABLE:
            raise IRError(f"cannot cast {types[0].dtype} to {attrs['dtype']!r}: only between "
                          f"{', '.join(CASTABLE)}")
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

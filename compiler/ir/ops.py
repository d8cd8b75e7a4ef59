"""The operators of the IR: attribute defaults, type inference and numpy semantics.

Names and attributes follow Relay (``nn.conv2d``, ``nn.max_pool2d``, ``add``...), so a
printed graph reads like TVM's. The numpy semantics are what constant folding computes,
what the host device runs and what every pass is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.types import TensorType
from compiler.templates.base import Epilogue
from compiler.templates.ops import conv2d_nchw_reference

Infer = Callable[[list[TensorType], dict[str, Any]], TensorType]
Compute = Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: Infer
    compute: Compute
    defaults: tuple[tuple[str, Any], ...] = ()
    arity: tuple[int, int] = (1, 1)  # min, max inputs
    # element-wise in every input (broadcasting): fusable into a kernel's epilogue
    elementwise: bool = False

    def normalize(self, attrs: dict[str, Any]) -> dict[str, Any]:
        known = dict(self.defaults)
        unknown = set(attrs) - set(known)
        if unknown:
            raise IRError(f"unknown attribute(s) {', '.join(sorted(unknown))}")
        known.update(attrs)
        return {k: _freeze(v) for k, v in known.items()}


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    OPS[opdef.name] = opdef
    return opdef


def get_op(name: str, node: str = "") -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise IRError(f"op {name!r} ({node or 'unnamed'}) is not an IR operator") from None


def _check_arity(types: list[TensorType], lo: int, hi: int) -> None:
    if not lo <= len(types) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise IRError(f"takes {want} inputs, got {len(types)}")


def _float(types: list[TensorType]) -> None:
    for t in types:
        if t.dtype != "float32":
            raise IRError(f"expects float32 inputs, got {t.dtype}")


def _op(name: str, infer: Infer, compute: Compute, arity: tuple[int, int] = (1, 1),
        elementwise: bool = False, **defaults: Any) -> OpDef:
    def checked(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        _check_arity(types, *arity)
        return infer(types, attrs)

    return register(OpDef(name, checked, compute, tuple(defaults.items()), arity, elementwise))


# ---------------------------------------------------------------- element-wise


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise IRError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not "
                      "broadcast") from None


def _binary_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    if types[0].dtype != types[1].dtype:
        raise IRError(f"dtypes differ: {types[0].dtype} and {types[1].dtype}")
    return TensorType(broadcast_shape(types[0].shape, types[1].shape), types[0].dtype)


def _same(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    _float(types)
    return types[0]


NUMERIC = ("float32", "int32", "int8")


def _numeric(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    for t in types:
        if t.dtype not in NUMERIC:
            raise IRError(f"expects {', '.join(NUMERIC)} inputs, got {t.dtype}")
    return types[0]


def _f32(fn: Callable[..., np.ndarray]) -> Compute:
    def compute(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        return np.asarray(fn(xs, attrs)).astype(xs[0].dtype, copy=False)
    return compute


ADD = _op("add", _binary_infer, _f32(lambda x, a: x[0] + x[1]), (2, 2), elementwise=True)
MULTIPLY = _op("multiply", _binary_infer, _f32(lambda x, a: x[0] * x[1]), (2, 2),
               elementwise=True)
_op("subtract", _binary_infer, _f32(lambda x, a: x[0] - x[1]), (2, 2), elementwise=True)
_op("divide", _binary_infer, _f32(lambda x, a: x[0] / x[1]), (2, 2), elementwise=True)
_op("nn.relu", _numeric, _f32(lambda x, a: np.maximum(x[0], 0)), elementwise=True)
_op("nn.leaky_relu", _same,
    _f32(lambda x, a: np.where(x[0] >= 0, x[0], x[0] * np.float32(a["alpha"]))),
    elementwise=True, alpha=0.01)
_op("sigmoid", _same, _f32(lambda x, a: 1.0 / (1.0 + np.exp(-x[0].astype(np.float64)))),
    elementwise=True)
_op("copy", lambda t, a: t[0], lambda x, a: x[0].copy(), elementwise=True)
# Quantization (TVM v0.5's realize): round half away from zero as C's round() does,
# clip, cast (float -> int truncates toward zero, as C), arithmetic right shift.
def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's round(): to the nearest integer, ties away from zero (numpy's rounds to even;
    floor(|x| + 0.5) is wrong just below a tie in float32)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


_op("round", _same, _f32(lambda x, a: round_half_away(x[0])), elementwise=True)


def _clip_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    if attrs["a_min"] > attrs["a_max"]:
        raise IRError(f"a_min {attrs['a_min']} > a_max {attrs['a_max']}")
    return _numeric(types, attrs)


def _clip(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    lo, hi = attrs["a_min"], attrs["a_max"]
    if np.issubdtype(xs[0].dtype, np.integer):  # integer bounds inside [a_min, a_max]
        lo, hi = math.ceil(lo), math.floor(hi)
    return np.clip(xs[0], lo, hi).astype(xs[0].dtype)


_op("clip", _clip_infer, _clip, elementwise=True, a_min=0.0, a_max=0.0)


def _cast_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _numeric(types, attrs)
    if attrs["dtype"] not in NUMERIC:
        raise IRError(f"cannot cast to {attrs['dtype']!r}: one of {', '.join(NUMERIC)}")
    return TensorType(types[0].shape, attrs["dtype"])


_op("cast", _cast_infer, lambda x, a: x[0].astype(a["dtype"]), dtype="float32")


def _shift_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    out = _binary_infer(types, attrs)
    if out.dtype not in ("int32", "int8"):
        raise IRError(f"right_shift takes integers, got {out.dtype}")
    return out


_op("right_shift", _shift_infer, _f32(lambda x, a: x[0] >> x[1]), (2, 2), elementwise=True)

# Heterogeneous execution: moves a value from the device that computed it to the one
# that reads it (TVM's device_copy); its numpy semantics are the identity.
_op("device_copy", lambda t, a: t[0], lambda x, a: x[0].copy(), src_device="",
    dst_device="")


def check_axis(axis: int, ndim: int) -> int:
    """``axis`` as a non-negative index, or IRError: numpy raises on it, so must we."""
    if not -ndim <= axis < ndim:
        raise IRError(f"axis {axis} out of range for {ndim} dimensions")
    return axis % ndim


def _bias_add_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    data, bias = types
    if data.dtype not in ("float32", "int32") or bias.dtype != data.dtype:
        raise IRError(f"expects float32 or int32 data and a bias of its dtype, got "
                      f"{data.dtype} and {bias.dtype}")
    axis = check_axis(attrs["axis"], data.ndim)
    if bias.shape != (data.shape[axis],):
        raise IRError(f"bias of shape {list(bias.shape)} for axis {axis} of {list(data.shape)}")
    return data


def _expand_to_axis(vec: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return vec.reshape(shape)


_op("nn.bias_add", _bias_add_infer,
    _f32(lambda x, a: x[0] + _expand_to_axis(x[1], x[0].ndim, a["axis"])), (2, 2),
    elementwise=True, axis=1)


def _batch_norm_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _float(types)
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
    return (xs[0] * _expand_to_axis(scale, ndim, axis)
            + _expand_to_axis(shift, ndim, axis)).astype(np.float32)


_op("nn.batch_norm", _batch_norm_infer, _batch_norm, (5, 5), axis=1, epsilon=1e-5)


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


_op("fused.elementwise", _chain_infer, _chain, (1, 1 << 16), chain=())


# ---------------------------------------------------------------- conv2d / dense


def conv2d_out_hw(h: int, w: int, kh: int, kw: int, attrs: dict[str, Any]) -> tuple[int, int]:
    pt, pl, pb, pr = attrs["padding"]
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    return ((h + pt + pb - (kh - 1) * dh - 1) // sh + 1,
            (w + pl + pr - (kw - 1) * dw - 1) // sw + 1)


def _conv_dtype(data: TensorType, weight: TensorType, out_dtype: str) -> str:
    """float32 x float32 -> float32; int8 x int8 -> int32 (``out_dtype`` "int32")."""
    if data.dtype == weight.dtype == "float32" and out_dtype in ("", "float32"):
        return "float32"
    if data.dtype == weight.dtype == "int8" and out_dtype == "int32":
        return "int32"
    raise IRError(f"{data.dtype} data and {weight.dtype} weight with out_dtype "
                  f"{out_dtype or 'unset'}: expects float32 (out_dtype float32 or unset) "
                  "or int8 (out_dtype int32)")


def _conv2d_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    data, weight = types[0], types[1]
    dtype = _conv_dtype(data, weight, attrs["out_dtype"])
    if data.ndim != 4 or weight.ndim != 4:
        raise IRError(f"expects NCHW data and OIHW weight, got {list(data.shape)} and "
                      f"{list(weight.shape)}")
    if len(attrs["padding"]) != 4:
        raise IRError(f"padding must be [top, left, bottom, right], got {attrs['padding']}")
    n, c, h, w = data.shape
    o, i, kh, kw = weight.shape
    groups = attrs["groups"]
    if c % groups or o % groups or i != c // groups:
        raise IRError(f"weight {list(weight.shape)} does not fit {c} input channels "
                      f"in {groups} group(s)")
    oh, ow = conv2d_out_hw(h, w, kh, kw, attrs)
    if oh < 1 or ow < 1:
        raise IRError(f"kernel {kh}x{kw} does not fit the padded {h}x{w} input")
    return TensorType((n, o, oh, ow), dtype)


def _conv2d(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return conv2d_nchw_reference(xs[0], xs[1], attrs["strides"], attrs["padding"],
                                 attrs["dilation"], attrs["groups"],
                                 attrs["out_dtype"] or "float32")


# out_dtype "" (unset) is the float conv; int8 data and weight take "int32" (TVM's)
CONV2D = _op("nn.conv2d", _conv2d_infer, _conv2d, (2, 2), strides=(1, 1),
             padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, out_dtype="")


def _dense_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    _float(types[:2])
    data, weight = types[0], types[1]
    if data.ndim != 2 or weight.ndim != 2 or data.shape[1] != weight.shape[1]:
        raise IRError(f"expects data [batch, k] and weight [units, k], got "
                      f"{list(data.shape)} and {list(weight.shape)}")
    return TensorType((data.shape[0], weight.shape[0]))


DENSE = _op("nn.dense", _dense_infer,
            lambda x, a: (x[0].astype(np.float64) @ x[1].astype(np.float64).T).astype(np.float32),
            (2, 2))

# A conv2d / dense with element-wise ops fused after it, computed by one template kernel.
# Inputs: data, weight, then bias if "bias" in epilogue, then residual if "add" in it.
# An int8 conv (int32 accumulators) may also requantize: "shift" is a rounding right
# shift by ``shift`` bits, and ``store_dtype`` "int8" stores the result clipped to
# [-127, 127] (``templates.base.Epilogue`` holds the semantics). Its bias is int32 and
# its residual int8 or int32.
EPILOGUE_OPS = ("bias", "relu", "add", "shift")


def _epilogue_arity(attrs: dict[str, Any]) -> int:
    ops = attrs["epilogue"]
    for op in ops:
        if op not in EPILOGUE_OPS:
            raise IRError(f"epilogue op {op!r} is not one of {', '.join(EPILOGUE_OPS)}")
    return 2 + ("bias" in ops) + ("add" in ops)


_FUSED_ONLY = ("epilogue", "shift", "store_dtype")


def fused_epilogue(attrs: dict[str, Any], residual_dtype: str = "") -> Epilogue:
    """The ``Epilogue`` a fused node's attributes (and its residual's dtype) describe."""
    try:
        return Epilogue(tuple(attrs["epilogue"]), attrs.get("shift", 0),
                        attrs.get("store_dtype", ""), residual_dtype)
    except ValueError as err:
        raise IRError(str(err)) from None


def node_epilogue(node: Any) -> Epilogue:
    """The epilogue of a fused conv2d / dense node (empty for the plain op)."""
    ops = tuple(node.attrs.get("epilogue", ()))
    residual = node.inputs[-1].ty.dtype if "add" in ops else ""
    return fused_epilogue({"epilogue": ops, **node.attrs}, residual)


def _fused_infer(base: Infer) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        want = _epilogue_arity(attrs)
        if len(types) != want:
            raise IRError(f"epilogue {'+'.join(attrs['epilogue'])} needs {want} inputs, "
                          f"got {len(types)}")
        epilogue = fused_epilogue(attrs)
        out = base(types[:2], {k: v for k, v in attrs.items() if k not in _FUSED_ONLY})
        integer = out.dtype == "int32"
        if not integer and (epilogue.shift or epilogue.out_dtype):
            raise IRError("shift and store_dtype are for int8 convolutions")
        stored = TensorType(out.shape, epilogue.out_dtype or out.dtype)
        extra = iter(types[2:])
        if "bias" in epilogue.ops:
            bias = next(extra)
            if bias.shape != (out.shape[1],) or bias.dtype != out.dtype:
                raise IRError(f"bias must be {out.shape[1]} values of {out.dtype}")
        if "add" in epilogue.ops:
            residual = next(extra)
            dtypes = ("int8", "int32") if integer else ("float32",)
            if residual.shape != out.shape or residual.dtype not in dtypes:
                raise IRError(f"residual must have the output's shape {list(out.shape)} "
                              f"and dtype {' or '.join(dtypes)}")
        return stored
    return infer


def apply_epilogue(out: np.ndarray, extra: list[np.ndarray], ops: tuple[str, ...]) -> np.ndarray:
    rest = iter(extra)
    for op in ops:
        if op == "bias":
            out = out + _expand_to_axis(next(rest), out.ndim, 1)
        elif op == "add":
            out = out + next(rest)
        else:
            out = np.maximum(out, 0)
    return out.astype(np.float32)


def _fused(base: Compute) -> Compute:
    def compute(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        inner = {k: v for k, v in attrs.items() if k not in _FUSED_ONLY}
        out = base(xs[:2], inner)
        if not np.issubdtype(out.dtype, np.integer):
            return apply_epilogue(out, xs[2:], attrs["epilogue"])
        epilogue = fused_epilogue(attrs)
        extra = iter(xs[2:])
        bias = next(extra) if "bias" in epilogue.ops else None
        residual = next(extra) if "add" in epilogue.ops else None
        return epilogue.apply(out, bias, residual, 1)
    return compute


_op("fused.conv2d", _fused_infer(CONV2D.infer), _fused(CONV2D.compute), (2, 4),
    epilogue=(), shift=0, store_dtype="", **dict(CONV2D.defaults))
_op("fused.dense", _fused_infer(DENSE.infer), _fused(DENSE.compute), (2, 4), epilogue=())


# ---------------------------------------------------------------- pooling, softmax, lrn


def pool_out(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int,
             ceil_mode: bool) -> int:
    span = (kernel - 1) * dilation + 1
    num = size + pad_lo + pad_hi - span
    out = (-(-num // stride) if ceil_mode else num // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1  # the last window must start inside the input or its leading pad
    return out


def _pool_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _float(types)
    (data,) = types
    if data.ndim != 4:
        raise IRError(f"expects NCHW data, got {list(data.shape)}")
    n, c, h, w = data.shape
    (kh, kw), (sh, sw) = attrs["pool_size"], attrs["strides"]
    pt, pl, pb, pr = attrs["padding"]
    dh, dw = attrs["dilation"]
    oh = pool_out(h, kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = pool_out(w, kw, sw, pl, pr, dw, attrs["ceil_mode"])
    if oh < 1 or ow < 1:
        raise IRError(f"window {kh}x{kw} does not fit the padded {h}x{w} input")
    return TensorType((n, c, oh, ow))


def _windows(x: np.ndarray, attrs: dict[str, Any], out_hw: tuple[int, int],
             fill: float) -> np.ndarray:
    """All pooling windows as an array [n, c, oh, ow, kh, kw], padding filled."""
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, _, _ = attrs["padding"]
    oh, ow = out_hw
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    h, w = x.shape[2:]
    padded = np.full(x.shape[:2] + (max(need_h, h + pt), max(need_w, w + pl)), fill,
                     dtype=np.float64)
    padded[:, :, pt:pt + h, pl:pl + w] = x
    out = np.empty(x.shape[:2] + (oh, ow, kh, kw), dtype=np.float64)
    for ky in range(kh):
        for kx in range(kw):
            out[..., ky, kx] = padded[:, :, ky * dh:ky * dh + sh * (oh - 1) + 1:sh,
                                      kx * dw:kx * dw + sw * (ow - 1) + 1:sw]
    return out


def _max_pool(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    out_hw = _pool_infer([TensorType.of(xs[0])], attrs).shape[2:]
    return _windows(xs[0], attrs, out_hw, -np.inf).max(axis=(4, 5)).astype(np.float32)


def _avg_pool(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    out_hw = _pool_infer([TensorType.of(xs[0])], attrs).shape[2:]
    total = _windows(xs[0], attrs, out_hw, 0.0).sum(axis=(4, 5))
    h, w = xs[0].shape[2:]
    if attrs["count_include_pad"]:
        # the declared padding counts; window parts beyond it (ceil mode) do not
        pt, pl, pb, pr = attrs["padding"]
        area = np.ones((1, 1, h + pt + pb, w + pl + pr))
        counts = _windows(area, {**attrs, "padding": (0, 0, 0, 0)}, out_hw, 0.0)
    else:
        counts = _windows(np.ones((1, 1, h, w)), attrs, out_hw, 0.0)
    counts = counts.sum(axis=(4, 5))
    return (total / counts).astype(np.float32)


_POOL_DEFAULTS = dict(pool_size=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                      ceil_mode=False)
_op("nn.max_pool2d", _pool_infer, _max_pool, **_POOL_DEFAULTS)
_op("nn.avg_pool2d", _pool_infer, _avg_pool, count_include_pad=False, **_POOL_DEFAULTS)


def _global_pool_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    _float(types)
    if types[0].ndim != 4:
        raise IRError(f"expects NCHW data, got {list(types[0].shape)}")
    n, c = types[0].shape[:2]
    return TensorType((n, c, 1, 1))


_op("nn.global_avg_pool2d", _global_pool_infer,
    _f32(lambda x, a: x[0].astype(np.float64).mean(axis=(2, 3), keepdims=True)))


def _axis_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _float(types)
    check_axis(attrs["axis"], types[0].ndim)
    return types[0]


def _softmax(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = xs[0].astype(np.float64)
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
    return (e / e.sum(axis=attrs["axis"], keepdims=True)).astype(np.float32)


_op("nn.softmax", _axis_infer, _softmax, axis=-1)


def _lrn(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = xs[0].astype(np.float64)
    axis, size = attrs["axis"] % x.ndim, attrs["size"]
    sq = np.moveaxis(x * x, axis, 0)
    lo, hi = (size - 1) // 2, size // 2  # ONNX: floor below, ceil above
    total = np.zeros_like(sq)
    for c in range(sq.shape[0]):
        total[c] = sq[max(0, c - lo):min(sq.shape[0], c + hi + 1)].sum(axis=0)
    denom = (attrs["bias"] + attrs["alpha"] / size * np.moveaxis(total, 0, axis)) ** attrs["beta"]
    return (x / denom).astype(np.float32)


_op("nn.lrn", _axis_infer, _lrn, size=5, axis=1, alpha=1e-4, beta=0.75, bias=1.0)


# ---------------------------------------------------------------- data movement


def _concat_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    first = types[0]
    axis = check_axis(attrs["axis"], first.ndim)
    for t in types[1:]:
        if t.ndim != first.ndim or t.dtype != first.dtype or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis
        ):
            raise IRError(f"cannot concatenate {list(t.shape)} with {list(first.shape)} "
                          f"on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), first.dtype)


_op("concatenate", _concat_infer, lambda x, a: np.concatenate(x, axis=a["axis"]), (1, 1 << 16),
    axis=0)


def _reshape_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    shape = tuple(attrs["newshape"])
    if int(np.prod(shape, dtype=np.int64)) != types[0].size or any(d < 0 for d in shape):
        raise IRError(f"cannot reshape {list(types[0].shape)} to {list(shape)}")
    return TensorType(shape, types[0].dtype)


RESHAPE = _op("reshape", _reshape_infer, lambda x, a: x[0].reshape(a["newshape"]),
              newshape=())


def _flatten_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    if t.ndim < 1:
        raise IRError("cannot flatten a scalar")
    return TensorType((t.shape[0], t.size // max(t.shape[0], 1)), t.dtype)


_op("nn.batch_flatten", _flatten_infer, lambda x, a: x[0].reshape(x[0].shape[0], -1))


def _transpose_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    axes = attrs["axes"] or tuple(reversed(range(t.ndim)))
    if sorted(axes) != list(range(t.ndim)):
        raise IRError(f"axes {list(axes)} are not a permutation of {t.ndim} dimensions")
    return TensorType(tuple(t.shape[a] for a in axes), t.dtype)


_op("transpose", _transpose_infer,
    lambda x, a: np.ascontiguousarray(np.transpose(x[0], a["axes"] or None)), axes=())


def _pad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    widths = attrs["pad_width"]
    if len(widths) != t.ndim or any(len(p) != 2 or min(p) < 0 for p in widths):
        raise IRError(f"pad_width {widths} must be one non-negative (before, after) pair "
                      f"per dimension of {list(t.shape)}")
    return TensorType(tuple(d + lo + hi for d, (lo, hi) in zip(t.shape, widths)), t.dtype)


_op("nn.pad", _pad_infer,
    lambda x, a: np.pad(x[0], a["pad_width"], constant_values=a["pad_value"]),
    pad_width=(), pad_value=0.0)


def _full_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


_op("full", _full_infer,
    lambda x, a: np.full(a["shape"], a["fill_value"], dtype=a["dtype"]), (0, 0),
    shape=(), fill_value=0.0, dtype="float32")


def evaluate_op(op: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return get_op(op).compute(inputs, attrs)


# ops whose output is the input's bytes under another shape: no kernel, no copy
ALIAS_OPS = frozenset({"reshape", "nn.batch_flatten"})

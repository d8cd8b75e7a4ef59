"""Convolution and dense (plain and with a fused epilogue), pooling, softmax and LRN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import (
    Compute,
    Infer,
    check_axis,
    define,
    expand_to_axis,
    float_only,
    keep_dtype,
)
from compiler.ir.types import TensorType
from compiler.templates.base import Epilogue
from compiler.templates.ops import conv2d_nchw_reference


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
CONV2D = define("nn.conv2d", _conv2d_infer, _conv2d, (2, 2), strides=(1, 1),
             padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, out_dtype="")


def _dense_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    float_only(types[:2])
    data, weight = types[0], types[1]
    if data.ndim != 2 or weight.ndim != 2 or data.shape[1] != weight.shape[1]:
        raise IRError(f"expects data [batch, k] and weight [units, k], got "
                      f"{list(data.shape)} and {list(weight.shape)}")
    return TensorType((data.shape[0], weight.shape[0]))


DENSE = define("nn.dense", _dense_infer,
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
            out = out + expand_to_axis(next(rest), out.ndim, 1)
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


define("fused.conv2d", _fused_infer(CONV2D.infer), _fused(CONV2D.compute), (2, 4),
    epilogue=(), shift=0, store_dtype="", **dict(CONV2D.defaults))
define("fused.dense", _fused_infer(DENSE.infer), _fused(DENSE.compute), (2, 4), epilogue=())


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
    float_only(types)
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
define("nn.max_pool2d", _pool_infer, _max_pool, **_POOL_DEFAULTS)
define("nn.avg_pool2d", _pool_infer, _avg_pool, count_include_pad=False, **_POOL_DEFAULTS)


def _global_pool_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    float_only(types)
    if types[0].ndim != 4:
        raise IRError(f"expects NCHW data, got {list(types[0].shape)}")
    n, c = types[0].shape[:2]
    return TensorType((n, c, 1, 1))


define("nn.global_avg_pool2d", _global_pool_infer,
    keep_dtype(lambda x, a: x[0].astype(np.float64).mean(axis=(2, 3), keepdims=True)))


def _axis_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    float_only(types)
    check_axis(attrs["axis"], types[0].ndim)
    return types[0]


def _softmax(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = xs[0].astype(np.float64)
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
    return (e / e.sum(axis=attrs["axis"], keepdims=True)).astype(np.float32)


define("nn.softmax", _axis_infer, _softmax, axis=-1)


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


define("nn.lrn", _axis_infer, _lrn, size=5, axis=1, alpha=1e-4, beta=0.75, bias=1.0)


"""Convolution and dense (plain and with a fused epilogue), transposed convolution,
batched matrix products, pooling (2-D and 3-D windows), softmax, log-softmax and LRN.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import (
    Compute,
    Infer,
    broadcast_shape,
    check_axis,
    define,
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
# [-127, 127] (``templates.base.Epilogue`` holds the semantics and the ops: bias, add,
# shift and the activations). Its bias is int32 and its residual int8 or int32.


def _epilogue_arity(attrs: dict[str, Any]) -> int:
    ops = fused_epilogue(attrs).ops
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
        if integer and any(op not in ("bias", "add", "relu", "shift") for op in epilogue.ops):
            raise IRError(f"epilogue {list(epilogue.ops)}: int8 convolutions take bias, add, "
                          "relu and shift only")
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


def apply_epilogue(out: np.ndarray, extra: list[np.ndarray], ops: tuple[str, ...],
                   shift: int = 0, store_dtype: str = "") -> np.ndarray:
    """A conv / dense output through epilogue ``ops`` (bias, then residual, in ``extra``);
    ``shift`` and ``store_dtype`` requantize an int32 output as the int8 kernels do."""
    epilogue = fused_epilogue({"epilogue": ops, "shift": shift, "store_dtype": store_dtype})
    rest = iter(extra)
    bias = next(rest) if "bias" in epilogue.ops else None
    residual = next(rest) if "add" in epilogue.ops else None
    return epilogue.apply(out, bias, residual, 1)


def _fused(base: Compute) -> Compute:
    def compute(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        out = base(xs[:2], {k: v for k, v in attrs.items() if k not in _FUSED_ONLY})
        return apply_epilogue(out, xs[2:], attrs["epilogue"], attrs.get("shift", 0),
                              attrs.get("store_dtype", ""))
    return compute


define("fused.conv2d", _fused_infer(CONV2D.infer), _fused(CONV2D.compute), (2, 4),
    epilogue=(), shift=0, store_dtype="", **dict(CONV2D.defaults))
define("fused.dense", _fused_infer(DENSE.infer), _fused(DENSE.compute), (2, 4), epilogue=())


# ---------------------------------------------------------------- transposed conv, batch matmul


def _conv_transpose_infer(rank: int) -> Infer:
    """data [n, c, *spatial], weight [c, o / groups, *kernel] (ONNX's and Relay's IOHW);
    ``padding`` (every begin, then every end) crops the full output and may be negative
    (extends it with zeros, as ONNX's output_shape can ask); ``output_padding`` adds
    positions at each dim's end."""
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        float_only(types)
        data, weight = types
        if data.ndim != 2 + rank or weight.ndim != 2 + rank:
            raise IRError(f"expects {rank}-D data and weight, got {list(data.shape)} and "
                          f"{list(weight.shape)}")
        groups, c = attrs["groups"], data.shape[1]
        if groups < 1 or c % groups or weight.shape[0] != c:
            raise IRError(f"weight {list(weight.shape)} does not fit {c} input channels in "
                          f"{groups} group(s)")
        strides, dilation, extra = attrs["strides"], attrs["dilation"], attrs["output_padding"]
        padding = attrs["padding"]
        if not len(strides) == len(dilation) == len(extra) == rank or len(padding) != 2 * rank:
            raise IRError(f"strides, dilation and output_padding need {rank} values and "
                          f"padding {2 * rank}")
        out = tuple(_conv_transpose_out(n, k, s, padding[d], padding[rank + d], dl, e)
                    for d, (n, k, s, dl, e) in enumerate(zip(data.shape[2:], weight.shape[2:],
                                                             strides, dilation, extra)))
        if min(out) < 1:
            raise IRError(f"padding {list(padding)} leaves no output")
        return TensorType((data.shape[0], weight.shape[1] * groups) + out)
    return infer


def _conv_transpose_out(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int,
                       dilation: int, output_padding: int) -> int:
    return stride * (size - 1) + output_padding + (kernel - 1) * dilation + 1 - pad_lo - pad_hi


def _conv_transpose(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """Each input position scatters its weighted kernel into the full output, which the
    padding then crops (or extends)."""
    data, weight = xs[0].astype(np.float64), xs[1].astype(np.float64)
    rank = data.ndim - 2
    out = _conv_transpose_infer(rank)([TensorType.of(xs[0]), TensorType.of(xs[1])],
                                      attrs).shape
    strides, dilation, padding = attrs["strides"], attrs["dilation"], attrs["padding"]
    groups = attrs["groups"]
    begin = padding[:rank]
    # full-output coordinate u = output position + begin; the buffer starts at lo
    lo = [min(0, b) for b in begin]
    size = [max(s * (n - 1) + (k - 1) * d + 1, b + o) - low for s, n, k, d, b, o, low
            in zip(strides, data.shape[2:], weight.shape[2:], dilation, begin, out[2:], lo)]
    full = np.zeros(out[:2] + tuple(size))
    cg, og = data.shape[1] // groups, weight.shape[1]
    for g in range(groups):
        part = data[:, g * cg:(g + 1) * cg]
        for tap in itertools.product(*(range(k) for k in weight.shape[2:])):
            w = weight[(slice(g * cg, (g + 1) * cg), slice(None), *tap)]
            where = tuple(slice(t * d - low, t * d - low + s * (n - 1) + 1, s) for t, d, low, s, n
                          in zip(tap, dilation, lo, strides, data.shape[2:]))
            full[(slice(None), slice(g * og, (g + 1) * og), *where)] += np.moveaxis(
                np.tensordot(part, w, axes=([1], [0])), -1, 1)
    crop = tuple(slice(b - low, b - low + o) for b, low, o in zip(begin, lo, out[2:]))
    return full[(slice(None), slice(None), *crop)].astype(np.float32)


for _rank in (2, 3):
    define(f"nn.conv{_rank}d_transpose", _conv_transpose_infer(_rank), _conv_transpose, (2, 2),
           strides=(1,) * _rank, padding=(0,) * (2 * _rank), dilation=(1,) * _rank, groups=1,
           output_padding=(0,) * _rank)


def _batch_matmul_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    float_only(types)
    a, b = types
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise IRError(f"expects [..., m, k] and [..., k, n], got {list(a.shape)} and "
                      f"{list(b.shape)}")
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (a.shape[-2], b.shape[-1]))


# numpy's matmul on operands of rank >= 2 (batch dims broadcast); the frontend turns
# 1-D operands into matrices
define("nn.batch_matmul", _batch_matmul_infer,
       lambda x, a: np.matmul(x[0].astype(np.float64), x[1].astype(np.float64)).astype(np.float32),
       (2, 2))


# ---------------------------------------------------------------- pooling, softmax, lrn


def pool_out(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int,
             ceil_mode: bool) -> int:
    span = (kernel - 1) * dilation + 1
    num = size + pad_lo + pad_hi - span
    out = (-(-num // stride) if ceil_mode else num // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1  # the last window must start inside the input or its leading pad
    return out


def _pool_infer(rank: int) -> Infer:
    """Type inference of a ``rank``-D window pooling: data [n, c, *spatial]; ``padding``
    is every begin, then every end (ONNX's order; 2-D: top, left, bottom, right)."""
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        float_only(types)
        (data,) = types
        if data.ndim != 2 + rank:
            raise IRError(f"expects {rank}-D data [n, c, {rank} spatial dims], got "
                          f"{list(data.shape)}")
        kernel, strides, dilation = attrs["pool_size"], attrs["strides"], attrs["dilation"]
        padding = attrs["padding"]
        if not len(kernel) == len(strides) == len(dilation) == rank or len(padding) != 2 * rank:
            raise IRError(f"pool_size, strides and dilation need {rank} values and padding "
                          f"{2 * rank}, got {kernel}, {strides}, {dilation} and {padding}")
        spatial = data.shape[2:]
        out = tuple(pool_out(spatial[d], kernel[d], strides[d], padding[d], padding[rank + d],
                             dilation[d], attrs["ceil_mode"]) for d in range(rank))
        if min(out) < 1:
            raise IRError(f"window {list(kernel)} does not fit the padded {list(spatial)} input")
        return TensorType(data.shape[:2] + out)
    return infer


def _windows(x: np.ndarray, attrs: dict[str, Any], out: tuple[int, ...],
             fill: float) -> np.ndarray:
    """All pooling windows as an array [n, c, *out, taps], padding filled."""
    kernel, strides, dilation = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    rank = len(kernel)
    begin = attrs["padding"][:rank]
    spatial = x.shape[2:]
    size = tuple(max((o - 1) * s + (k - 1) * d + 1, n + p)
                 for o, s, k, d, n, p in zip(out, strides, kernel, dilation, spatial, begin))
    padded = np.full(x.shape[:2] + size, fill, dtype=np.float64)
    padded[(slice(None), slice(None), *(slice(p, p + n) for p, n in zip(begin, spatial)))] = x
    taps = []
    for tap in itertools.product(*(range(k) for k in kernel)):
        taps.append(padded[(slice(None), slice(None),
                            *(slice(t * d, t * d + s * (o - 1) + 1, s)
                              for t, d, s, o in zip(tap, dilation, strides, out)))])
    return np.stack(taps, axis=-1)


def _max_pool(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    out = _pool_infer(len(attrs["pool_size"]))([TensorType.of(xs[0])], attrs).shape[2:]
    return _windows(xs[0], attrs, out, -np.inf).max(axis=-1).astype(np.float32)


def _avg_pool(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    rank = len(attrs["pool_size"])
    out = _pool_infer(rank)([TensorType.of(xs[0])], attrs).shape[2:]
    total = _windows(xs[0], attrs, out, 0.0).sum(axis=-1)
    spatial, padding = xs[0].shape[2:], attrs["padding"]
    if attrs["count_include_pad"]:
        # the declared padding counts; window parts beyond it (ceil mode) do not
        area = np.ones((1, 1, *(n + padding[d] + padding[rank + d]
                                for d, n in enumerate(spatial))))
        counts = _windows(area, {**attrs, "padding": (0,) * (2 * rank)}, out, 0.0)
    else:
        counts = _windows(np.ones((1, 1, *spatial)), attrs, out, 0.0)
    return (total / counts.sum(axis=-1)).astype(np.float32)


def _pool_defaults(rank: int) -> dict[str, Any]:
    return dict(pool_size=(1,) * rank, strides=(1,) * rank, padding=(0,) * (2 * rank),
                dilation=(1,) * rank, ceil_mode=False)


# 2-D and 3-D pooling share one N-D definition (1-D is 2-D with H = 1 in the frontend)
for _rank in (2, 3):
    define(f"nn.max_pool{_rank}d", _pool_infer(_rank), _max_pool, **_pool_defaults(_rank))
    define(f"nn.avg_pool{_rank}d", _pool_infer(_rank), _avg_pool, count_include_pad=False,
           **_pool_defaults(_rank))


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


def _log_softmax(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = xs[0].astype(np.float64)
    shifted = x - x.max(axis=attrs["axis"], keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=attrs["axis"], keepdims=True))
            ).astype(np.float32)


define("nn.log_softmax", _axis_infer, _log_softmax, axis=-1)


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


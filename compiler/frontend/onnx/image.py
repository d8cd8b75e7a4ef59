"""Image operators: Resize / Upsample, DepthToSpace, SpaceToDepth.

Resize (10, 11, 13, 18, 19) and Upsample (7, 9) become one ``image.resize``: resizing is
separable, so for each resized axis this module works out, at import and in float64,
which input indices every output index reads and with what weights, following ONNX's
reference (onnx/reference/ops/op_resize.py) step by step; the op carries those tap
tables as constants. Axes whose scale is 1 are not resized at all (the reference skips
them too). DepthToSpace and SpaceToDepth are reshape + transpose + reshape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.frontend.onnx.importer import (
    Converter,
    Importer,
    NodeError,
    OnnxNode,
    Value,
    reshaped,
    shape_of,
)
from compiler.ir.ops import check_axis, evaluate_op

_MODES = ("nearest", "linear", "cubic")
_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                     "align_corners", "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")
# Resize-10 and Upsample predate nearest_mode: floor when an axis grows, ceil when it
# shrinks (onnxruntime's rule, and what ONNX's opset-10 test data expect)
_LEGACY_NEAREST = "legacy"


@dataclass(frozen=True)
class _Sampling:
    """How a resize maps output coordinates to input ones and weighs the neighbours."""

    mode: str  # nearest, linear or cubic
    coordinates: str  # coordinate_transformation_mode
    nearest: str = "round_prefer_floor"  # nearest_mode, or _LEGACY_NEAREST
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False


@dataclass(frozen=True)
class _AxisResize:
    axis: int
    length: int  # the output's
    scale: float
    # (start, end) for tf_crop_and_resize, numpy scalars of the roi's dtype: the
    # reference computes with them as they are (in float32, mostly)
    roi: tuple[np.floating, np.floating] | None


def _source_coordinates(s: _Sampling, length: int, r: _AxisResize
                        ) -> tuple[np.ndarray, np.ndarray]:
    """x_original of every output index, and which of them fall outside the input
    (tf_crop_and_resize only); the reference's ``_compute_x_ori``."""
    y = np.arange(r.length, dtype=np.float64)
    width = r.scale * length  # the output length, fractional when it comes from a scale
    outside = np.zeros(r.length, dtype=bool)
    mode = s.coordinates
    if mode == "align_corners":
        x = np.zeros(r.length) if width == 1 else y * (length - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / r.scale
    elif mode == "tf_crop_and_resize":
        assert r.roi is not None
        start, end = r.roi
        if width == 1:
            x = np.full(r.length, (end - start) * (length - 1) / 2)
        else:
            x = y * (end - start) * (length - 1) / (width - 1)
        x = x + start * (length - 1)
        outside = (x < 0) | (x > length - 1)
    elif mode == "pytorch_half_pixel":
        # -0.5 for a single output, as the reference has it (the spec's text says 0)
        x = np.full(r.length, -0.5) if width == 1 else (y + 0.5) / r.scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / r.scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = length / 2 * (1 - r.length / width)
        x = offset + (y + 0.5) / r.scale - 0.5
    else:  # tf_half_pixel_for_nn (Resize-11 only)
        x = (y + 0.5) / r.scale
    return x, outside


def _weights(s: _Sampling, ratios: np.ndarray, scale: float) -> np.ndarray:
    """[outputs, taps] weights of the window left of each x_original, ``ratios`` its
    distance to it in (0, 1]; the reference's ``_*_coeffs`` functions, vectorized."""
    ratio = ratios[:, None]
    if s.mode == "nearest":
        mode = s.nearest
        if mode == _LEGACY_NEAREST:
            mode = "floor" if scale >= 1 else "ceil"
        right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": np.zeros_like(ratio, dtype=bool),
                 "ceil": np.ones_like(ratio, dtype=bool)}[mode] | (ratio == 1.0)
        return np.concatenate([~right, right], axis=1).astype(np.float64)
    # linear and cubic: the filter, stretched by 1 / scale when antialiasing a downscale
    reach = min(scale, 1.0) if s.antialias else 1.0
    if s.mode == "linear":
        start = int(np.floor(-1 / reach) + 1)
        x = (np.arange(start, 2 - start) - ratio) * reach
        weights = np.clip(1 - np.abs(x), 0, 1)
    else:
        start = int(np.floor(-2 / reach) + 1)
        x = np.abs(reach * (np.arange(start, 2 - start) - ratio))
        a = s.cubic_a
        weights = np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                           np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))
    return weights / weights.sum(axis=1, keepdims=True)


def _tables(s: _Sampling, length: int, r: _AxisResize) -> tuple[np.ndarray, np.ndarray]:
    """The axis's int32 index and float32 weight tables for ``image.resize``: the
    reference's ``_interpolate_1d_along_axis`` up to the gather, zero weights dropped."""
    x, outside = _source_coordinates(s, length, r)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)  # the pixel left of x is preferred
    weights = _weights(s, ratios, r.scale)
    taps = weights.shape[1]
    # the window of ``taps`` indices nearest x (ties to the smaller), edge-padded
    pad = -(-taps // 2)
    padded = x + pad
    base = np.floor(padded).astype(np.int64)
    frac = padded - base
    if taps % 2 == 0:
        start = base + np.where(frac == 0, -(taps // 2), 1 - taps // 2)
    else:
        start = base + np.where(frac <= 0.5, -((taps - 1) // 2), 1 - (taps - 1) // 2)
    index = (start - pad)[:, None] + np.arange(taps)
    if s.exclude_outside:
        weights = np.where((index < 0) | (index >= length), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, length - 1)
    # keep the taps that weigh something (nearest: one), in order, padded with zeros
    kept = weights != 0
    order = np.argsort(~kept, axis=1, kind="stable")[:, :max(1, int(kept.sum(1).max()))]
    index = np.take_along_axis(index, order, axis=1)
    weights = np.take_along_axis(weights, order, axis=1)
    index[outside] = -1
    weights[outside] = 0.0
    return index.astype(np.int32), weights.astype(np.float32)


def _resized(imp: Importer, node: OnnxNode, name: str, s: _Sampling,
             plan: Sequence[_AxisResize], extrapolation_value: float = 0.0) -> Value:
    """The value ``name`` resized along every axis of ``plan`` that changes."""
    value = imp.value(name)
    shape = shape_of(value)
    plan = sorted((r for r in plan if not _is_identity(r, shape[r.axis])),
                  key=lambda r: r.axis)
    if not plan:
        return value
    named: list[tuple[str, np.ndarray]] = []
    for r in plan:
        index, weight = _tables(s, shape[r.axis], r)
        named += [(f"{node.name}.index{r.axis}", index), (f"{node.name}.weight{r.axis}", weight)]
    attrs = {"axes": tuple(r.axis for r in plan),
             "extrapolation_value": float(extrapolation_value)}
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        return evaluate_op("image.resize", [value, *(t for _, t in named)], attrs)
    constants = [imp.constant(table, table_name) for table_name, table in named]
    return imp.call("image.resize", [imp.tensor(name), *constants], node, **attrs)


def _is_identity(r: _AxisResize, length: int) -> bool:
    """The reference's test for an axis it leaves alone."""
    return (math.isclose(r.scale, 1.0) and r.length == length
            and (r.roi is None or (math.isclose(float(r.roi[0]), 0.0)
                                   and math.isclose(float(r.roi[1]), 1.0))))


def _from_scales(shape: tuple[int, ...], axes: Sequence[int], scales: np.ndarray,
                 roi: np.ndarray | None = None) -> list[_AxisResize]:
    """Output length floor(scale * input length), as the reference computes it (the
    roi does not shrink it)."""
    if scales.size != len(axes):
        raise NodeError(f"{scales.size} scales for {len(axes)} axes")
    if not np.all(scales > 0):
        raise NodeError(f"scales {scales.tolist()} must be positive")
    plan = []
    for k, (axis, scale) in enumerate(zip(axes, scales.astype(np.float64).tolist())):
        length = int(scale * shape[axis])
        if length < 1:
            raise NodeError(f"scale {scale} leaves axis {axis} (length {shape[axis]}) "
                            "empty")
        plan.append(_AxisResize(axis, length, scale, _roi_of(roi, k, len(axes))))
    return plan


def _from_sizes(shape: tuple[int, ...], axes: Sequence[int], sizes: np.ndarray,
                policy: str, roi: np.ndarray | None = None) -> list[_AxisResize]:
    """Output lengths from ``sizes``; not_larger / not_smaller keep the aspect ratio
    with one scale for every axis, rounding lengths half up."""
    if sizes.size != len(axes):
        raise NodeError(f"{sizes.size} sizes for {len(axes)} axes")
    lengths = [int(v) for v in sizes.reshape(-1)]
    if min(lengths) < 1:
        raise NodeError(f"sizes {lengths} must be positive")
    if any(shape[a] == 0 for a in axes):
        raise NodeError(f"input shape {list(shape)} is empty along a resized axis")
    scales = [n / shape[a] for n, a in zip(lengths, axes)]
    if policy != "stretch":
        scale = min(scales) if policy == "not_larger" else max(scales)
        scales = [scale] * len(axes)
        lengths = [int(scale * shape[a] + 0.5) for a in axes]
    return [_AxisResize(a, n, sc, _roi_of(roi, k, len(axes)))
            for k, (a, n, sc) in enumerate(zip(axes, lengths, scales))]


def _roi_of(roi: np.ndarray | None, k: int, count: int
            ) -> tuple[np.floating, np.floating] | None:
    """The k-th of ``count`` resized axes' (start, end): roi lists the starts, then the ends."""
    return None if roi is None else (roi[k], roi[k + count])


def _choice(node: OnnxNode, key: str, default: str, allowed: Sequence[str]) -> str:
    value = node.attrs.get(key, default)
    if value not in allowed:
        raise NodeError(f"{key} {value!r} is not supported; only {', '.join(allowed)}")
    return str(value)


def _optional_array(imp: Importer, node: OnnxNode, index: int, what: str) -> np.ndarray | None:
    """An optional input known at import time; an empty tensor counts as omitted."""
    name = node.optional(index)
    if name is None:
        return None
    array = imp.array(name, what).reshape(-1)
    return array if array.size else None


def _resize(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    shape = shape_of(imp.value(node.arg(0)))
    if node.version == 10:
        scales = imp.array(node.arg(1), "scales").reshape(-1)
        s = _Sampling(_choice(node, "mode", "nearest", _MODES[:2]), "asymmetric",
                      _LEGACY_NEAREST)
        return [_resized(imp, node, node.arg(0), s,
                         _from_scales(shape, range(len(shape)), scales))]
    coordinate_modes = _COORDINATE_MODES + (("tf_half_pixel_for_nn",)
                                            if node.version == 11 else ())
    s = _Sampling(
        _choice(node, "mode", "nearest", _MODES),
        _choice(node, "coordinate_transformation_mode", "half_pixel", coordinate_modes),
        _choice(node, "nearest_mode", "round_prefer_floor", _NEAREST_MODES),
        float(node.attrs.get("cubic_coeff_a", -0.75)),
        bool(node.attrs.get("exclude_outside", 0)),
        bool(node.attrs.get("antialias", 0)))
    policy = _choice(node, "keep_aspect_ratio_policy", "stretch", _ASPECT_POLICIES)
    axes = [check_axis(a, len(shape)) for a in node.ints("axes", range(len(shape)))]
    if len(set(axes)) != len(axes):
        raise NodeError(f"axes {node.attrs['axes']} repeat an axis")
    roi = None
    if s.coordinates == "tf_crop_and_resize":
        roi = _optional_array(imp, node, 1, "roi")
        if roi is None or roi.size != 2 * len(axes):
            raise NodeError(f"tf_crop_and_resize needs a roi of {2 * len(axes)} values "
                            "(starts, then ends, per resized axis)")
    scales = _optional_array(imp, node, 2, "scales")
    sizes = _optional_array(imp, node, 3, "sizes")
    if scales is not None and sizes is None:
        plan = _from_scales(shape, axes, scales, roi)
    elif sizes is not None and scales is None:
        plan = _from_sizes(shape, axes, sizes, policy, roi)
    else:
        raise NodeError("exactly one of scales and sizes must be given (non-empty)")
    extrapolation = float(node.attrs.get("extrapolation_value", 0.0))
    return [_resized(imp, node, node.arg(0), s, plan, extrapolation)]


def _upsample(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Upsample-7 takes its scales as an attribute, 9 (and the deprecated 10) as an
    input; both sample as Resize-10 does."""
    shape = shape_of(imp.value(node.arg(0)))
    if node.version < 9:
        scales = np.array(node.attrs["scales"], dtype=np.float32)
    else:
        scales = imp.array(node.arg(1), "scales").reshape(-1)
    s = _Sampling(_choice(node, "mode", "nearest", _MODES[:2]), "asymmetric", _LEGACY_NEAREST)
    return [_resized(imp, node, node.arg(0), s, _from_scales(shape, range(len(shape)), scales))]


def _blocks(node: OnnxNode, shape: tuple[int, ...], mode_since: int) -> tuple[int, str]:
    """(blocksize, mode) of DepthToSpace / SpaceToDepth, checked against 4-D data; the
    mode is DCR before the version ``mode_since`` that added the attribute."""
    if len(shape) != 4:
        raise NodeError(f"expects NCHW (4-D) data, got shape {list(shape)}")
    block = int(node.attrs["blocksize"])
    if block < 1:
        raise NodeError(f"blocksize {block} must be positive")
    if node.version < mode_since:
        return block, "DCR"
    return block, _choice(node, "mode", "DCR", ("DCR", "CRD"))


def _permuted(imp: Importer, node: OnnxNode, value: Value, axes: Sequence[int]) -> Value:
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(np.transpose(value, axes))
    return imp.call("transpose", [value], node, axes=tuple(axes))


def _depth_to_space(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    block, mode = _blocks(node, shape_of(value), mode_since=11)
    b, c, h, w = shape_of(value)
    if c % (block * block):
        raise NodeError(f"{c} channels do not split into {block}x{block} blocks")
    depth = c // (block * block)
    if mode == "DCR":
        split, perm = (b, block, block, depth, h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (b, depth, block, block, h, w), (0, 1, 4, 2, 5, 3)
    moved = _permuted(imp, node, reshaped(imp, node, value, split), perm)
    return [reshaped(imp, node, moved, (b, depth, h * block, w * block))]


def _space_to_depth(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    block, mode = _blocks(node, shape_of(value), mode_since=28)
    b, c, h, w = shape_of(value)
    if h % block or w % block:
        raise NodeError(f"{h}x{w} does not split into {block}x{block} blocks")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    split = reshaped(imp, node, value, (b, c, h // block, block, w // block, block))
    moved = _permuted(imp, node, split, perm)
    return [reshaped(imp, node, moved, (b, c * block * block, h // block, w // block))]


CONVERTERS: dict[str, Converter] = {
    "DepthToSpace": _depth_to_space,
    "Resize": _resize,
    "SpaceToDepth": _space_to_depth,
    "Upsample": _upsample,
}

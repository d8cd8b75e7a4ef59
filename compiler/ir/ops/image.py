"""Image ops: ``image.resize``, separable resampling by per-axis tap tables.

Every resize (nearest, linear, cubic, antialiased; any coordinate transformation) is
separable: output index ``o`` along a resized axis reads ``taps`` input indices with
weights that depend only on ``o``. The frontend works those tables out once, at import
(in float64, following ONNX's reference), and the op carries them as constant inputs:
``data, index_0, weight_0, index_1, weight_1, ...`` for ``axes[0], axes[1], ...``.
``index_k`` (int32) and ``weight_k`` (float32) are [output length, taps]; a row whose
first index is negative is outside the input (tf_crop_and_resize): every output element
on it is ``extrapolation_value``. Axes not listed are copied.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import define
from compiler.ir.types import TensorType


def _resize_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    data, tables = types[0], types[1:]
    axes = attrs["axes"]
    if data.dtype != "float32":
        raise IRError(f"expects float32 data, got {data.dtype}")
    if len(tables) != 2 * len(axes):
        raise IRError(f"takes an index and a weight table per axis: {len(axes)} axes need "
                      f"{2 * len(axes)} tables, got {len(tables)}")
    if len(set(axes)) != len(axes) or not all(0 <= a < data.ndim for a in axes):
        raise IRError(f"axes {list(axes)} must be distinct axes of {data.ndim}-D data")
    shape = list(data.shape)
    for axis, index, weight in zip(axes, tables[::2], tables[1::2]):
        if index.dtype != "int32" or weight.dtype != "float32":
            raise IRError(f"axis {axis}: expects int32 indices and float32 weights, got "
                          f"{index.dtype} and {weight.dtype}")
        if index.ndim != 2 or index.shape != weight.shape or 0 in index.shape:
            raise IRError(f"axis {axis}: index and weight tables must be the same non-empty "
                          f"[output length, taps], got {list(index.shape)} and "
                          f"{list(weight.shape)}")
        if data.shape[axis] == 0:
            raise IRError(f"axis {axis} of the data is empty: nothing to resample")
        shape[axis] = index.shape[0]
    return TensorType(tuple(shape), "float32")


def _resize(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """Axis by axis, in float64: gather the taps, weight them, sum them."""
    out = xs[0].astype(np.float64)
    for k, axis in enumerate(attrs["axes"]):
        index, weight = xs[1 + 2 * k], xs[2 + 2 * k]
        around = (1,) * axis, (1,) * (out.ndim - axis - 1)
        gathered = np.take(out, np.maximum(index, 0), axis=axis)  # taps after the axis
        out = (gathered * weight.reshape(around[0] + weight.shape + around[1])).sum(axis + 1)
        outside = (index[:, 0] < 0).reshape(around[0] + (-1,) + around[1])
        out = np.where(outside, attrs["extrapolation_value"], out)
    return out.astype(np.float32)


define("image.resize", _resize_infer, _resize, (1, 1 << 8), axes=(), extrapolation_value=0.0)

"""Data movement: concatenate, reshape, flatten, transpose, strided slices, pad, tile,
broadcast, take (gather with constant indices), and the ``full`` fill.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import check_axis, define
from compiler.ir.types import TensorType


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


define("concatenate", _concat_infer, lambda x, a: np.concatenate(x, axis=a["axis"]), (1, 1 << 16),
    axis=0)


def _reshape_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    shape = tuple(attrs["newshape"])
    if int(np.prod(shape, dtype=np.int64)) != types[0].size or any(d < 0 for d in shape):
        raise IRError(f"cannot reshape {list(types[0].shape)} to {list(shape)}")
    return TensorType(shape, types[0].dtype)


RESHAPE = define("reshape", _reshape_infer, lambda x, a: x[0].reshape(a["newshape"]),
              newshape=())


def _flatten_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    if t.ndim < 1:
        raise IRError("cannot flatten a scalar")
    return TensorType((t.shape[0], t.size // max(t.shape[0], 1)), t.dtype)


define("nn.batch_flatten", _flatten_infer, lambda x, a: x[0].reshape(x[0].shape[0], -1))


def _transpose_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    axes = attrs["axes"] or tuple(reversed(range(t.ndim)))
    if sorted(axes) != list(range(t.ndim)):
        raise IRError(f"axes {list(axes)} are not a permutation of {t.ndim} dimensions")
    return TensorType(tuple(t.shape[a] for a in axes), t.dtype)


define("transpose", _transpose_infer,
    lambda x, a: np.ascontiguousarray(np.transpose(x[0], a["axes"] or None)), axes=())


PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    widths, mode = attrs["pad_width"], attrs["pad_mode"]
    if len(widths) != t.ndim or any(len(p) != 2 or min(p) < 0 for p in widths):
        raise IRError(f"pad_width {widths} must be one non-negative (before, after) pair "
                      f"per dimension of {list(t.shape)}")
    if mode not in PAD_MODES:
        raise IRError(f"pad_mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    if mode != "constant" and any(d == 0 and (lo or hi) for d, (lo, hi) in zip(t.shape, widths)):
        raise IRError(f"{mode} padding needs a non-empty dimension to copy from")
    return TensorType(tuple(d + lo + hi for d, (lo, hi) in zip(t.shape, widths)), t.dtype)


def _pad_compute(x: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    if a["pad_mode"] == "constant":
        return np.pad(x[0], a["pad_width"], constant_values=a["pad_value"])
    return np.pad(x[0], a["pad_width"], mode=a["pad_mode"])


define("nn.pad", _pad_infer, _pad_compute, pad_width=(), pad_value=0.0, pad_mode="constant")


def _slices(attrs: dict[str, Any]) -> tuple[slice, ...]:
    return tuple(slice(b, e, s) for b, e, s in zip(attrs["begin"], attrs["end"], attrs["strides"]))


def slice_ranges(shape: tuple[int, ...], attrs: dict[str, Any]) -> list[range]:
    """The source indices each output axis of a ``strided_slice`` reads, per axis."""
    return [range(*s.indices(d)) for s, d in zip(_slices(attrs), shape)]


def _strided_slice_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    n = t.ndim
    if not len(attrs["begin"]) == len(attrs["end"]) == len(attrs["strides"]) == n:
        raise IRError(f"begin, end and strides need one value per dimension of {list(t.shape)}")
    if 0 in attrs["strides"]:
        raise IRError("strides must not be 0")
    return TensorType(tuple(len(r) for r in slice_ranges(t.shape, attrs)), t.dtype)


# numpy basic slicing x[begin:end:strides] per axis (negative values count from the end)
define("strided_slice", _strided_slice_infer,
    lambda x, a: np.ascontiguousarray(x[0][_slices(a)]), begin=(), end=(), strides=())


def _tile_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t, reps = types[0], attrs["reps"]
    if len(reps) != t.ndim or min(reps, default=0) < 0:
        raise IRError(f"reps {list(reps)} must be one non-negative count per dimension of "
                      f"{list(t.shape)}")
    return TensorType(tuple(d * r for d, r in zip(t.shape, reps)), t.dtype)


define("tile", _tile_infer, lambda x, a: np.tile(x[0], a["reps"]), reps=())


def _broadcast_to_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t, shape = types[0], tuple(attrs["shape"])
    if len(shape) != t.ndim or any(d not in (1, s) for d, s in zip(t.shape, shape)):
        raise IRError(f"cannot broadcast {list(t.shape)} to {list(shape)} (same rank, "
                      "dimensions equal or 1)")
    return TensorType(shape, t.dtype)


define("broadcast_to", _broadcast_to_infer,
    lambda x, a: np.ascontiguousarray(np.broadcast_to(x[0], a["shape"])), shape=())


def _take_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t, indices = types
    axis = check_axis(attrs["axis"], t.ndim)
    if indices.dtype != "int32":
        raise IRError(f"expects int32 indices, got {indices.dtype}")
    return TensorType(t.shape[:axis] + indices.shape + t.shape[axis + 1:], t.dtype)


def _take_compute(x: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.asarray(np.take(x[0], x[1], axis=a["axis"]))


# numpy.take(data, indices, axis) with int32 indices in [0, extent): the kernel reads
# where they point unchecked, so the importer makes them (a constant input) from Gather's
define("take", _take_infer, _take_compute, (2, 2), axis=0)


def _full_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


define("full", _full_infer,
    lambda x, a: np.full(a["shape"], a["fill_value"], dtype=a["dtype"]), (0, 0),
    shape=(), fill_value=0.0, dtype="float32")


# ops whose output is the input's bytes under another shape: no kernel, no copy
ALIAS_OPS = frozenset({"reshape", "nn.batch_flatten"})

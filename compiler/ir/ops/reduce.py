"""Reductions over axes: sum, mean, max, min and prod."""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.ops.base import check_axis, define
from compiler.ir.types import TensorType

# what a reduction over no element gives (ONNX's empty-set results); mean is 0 / 0
REDUCE_KINDS = {"sum": 0.0, "mean": float("nan"), "max": float("-inf"),
                "min": float("inf"), "prod": 1.0}


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...],
                  keepdims: bool) -> tuple[int, ...]:
    """``shape`` after reducing ``axes`` (non-negative): kept as 1s or dropped."""
    if keepdims:
        return tuple(1 if k in axes else d for k, d in enumerate(shape))
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def _reduce_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (data,) = types
    if data.dtype != "float32":  # the kernel accumulates in C float
        raise IRError(f"expects float32 data, got {data.dtype}")
    if attrs["kind"] not in REDUCE_KINDS:
        raise IRError(f"kind {attrs['kind']!r} is not one of {', '.join(REDUCE_KINDS)}")
    axes = attrs["axes"]
    if sorted({check_axis(a, data.ndim) for a in axes}) != list(axes):
        raise IRError(f"axes {list(axes)} must be distinct, non-negative and ascending "
                      f"for {data.ndim} dimensions")
    return TensorType(reduced_shape(data.shape, axes, attrs["keepdims"]), data.dtype)


def _reduce(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """In float64, rounded to float32 once; an empty reduction gives the kind's identity
    (nan for mean)."""
    x, axes, keepdims, kind = xs[0], attrs["axes"], attrs["keepdims"], attrs["kind"]
    wide = x.astype(np.float64)
    if wide.size == 0 or any(x.shape[a] == 0 for a in axes):
        shape = reduced_shape(x.shape, axes, keepdims)
        out = np.full(shape, REDUCE_KINDS[kind])
    elif kind == "mean":
        out = wide.mean(axis=axes, keepdims=keepdims)
    else:
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[kind]
        out = ufunc.reduce(wide, axis=axes, keepdims=keepdims)
    return np.asarray(out).astype(x.dtype)


define("reduce", _reduce_infer, _reduce, kind="sum", axes=(), keepdims=True)

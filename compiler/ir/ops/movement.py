"""Data movement: concatenate, reshape, flatten, transpose, pad, and the ``full`` fill.
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


def _pad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    t = types[0]
    widths = attrs["pad_width"]
    if len(widths) != t.ndim or any(len(p) != 2 or min(p) < 0 for p in widths):
        raise IRError(f"pad_width {widths} must be one non-negative (before, after) pair "
                      f"per dimension of {list(t.shape)}")
    return TensorType(tuple(d + lo + hi for d, (lo, hi) in zip(t.shape, widths)), t.dtype)


define("nn.pad", _pad_infer,
    lambda x, a: np.pad(x[0], a["pad_width"], constant_values=a["pad_value"]),
    pad_width=(), pad_value=0.0)


def _full_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


define("full", _full_infer,
    lambda x, a: np.full(a["shape"], a["fill_value"], dtype=a["dtype"]), (0, 0),
    shape=(), fill_value=0.0, dtype="float32")



# ops whose output is the input's bytes under another shape: no kernel, no copy
ALIAS_OPS = frozenset({"reshape", "nn.batch_flatten"})

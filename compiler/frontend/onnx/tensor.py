"""Tensor operators: shapes and constants (evaluated at import where known), and
data movement (concat, reshape, transpose, slice, split, pad, expand, tile, gather...).

Every movement of an import-time array is done in numpy at import (the IR op's own numpy
semantics), and so is any movement whose result is empty: an empty tensor is known."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
from compiler.ir import Node, get_op
from compiler.ir.ops import check_axis
from compiler.ir.ops.movement import PAD_MODES
from compiler.ir.types import DTYPES, TensorType


def _axes(imp: Importer, node: OnnxNode) -> tuple[int, ...] | None:
    """Unsqueeze/Squeeze axes: an attribute before opset 13, an input from 13 on."""
    if node.version < 13:
        axes = node.attrs.get("axes")
    else:
        name = node.optional(1)
        axes = None if name is None else imp.array(name, "axes").reshape(-1).tolist()
    return None if axes is None else tuple(int(a) for a in axes)


def _moved(imp: Importer, node: OnnxNode, op: str, value: Value, *tables: np.ndarray,
           **attrs: Any) -> Value:
    """IR op ``op`` applied to ``value`` (and to constant ``tables``, e.g. take's indices):
    in numpy when ``value`` is an array, an empty array when the result is empty, else an
    IR node."""
    opdef = get_op(op)
    attrs = opdef.normalize(attrs)
    if isinstance(value, np.ndarray):
        return opdef.compute([value, *tables], attrs)
    ty = opdef.infer([value.ty, *(TensorType.of(t) for t in tables)], attrs)
    if ty.size == 0:
        return np.zeros(ty.shape, ty.dtype)
    constants = [imp.constant(t, f"{node.name}.{k}") for k, t in enumerate(tables)]
    return imp.call(op, [value, *constants], node, **attrs)


def _int_list(imp: Importer, node: OnnxNode, index: int, what: str) -> list[int] | None:
    """An optional input that must be known at import, as ints; None when omitted."""
    name = node.optional(index)
    return None if name is None else [int(v) for v in imp.array(name, what).reshape(-1)]


def _slice_bounds(d: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice's start and end on an axis of extent ``d`` (negatives count from the
    end, then clamped: to [0, d] stepping forward, start to [0, d-1] and end to [-1, d-1]
    stepping back) as numpy slice bounds; an end before index 0 becomes -d-1, which
    numpy reads as "past the front"."""
    start = start + d if start < 0 else start
    end = end + d if end < 0 else end
    if step > 0:
        return min(max(start, 0), d), min(max(end, 0), d)
    start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
    return start, end if end >= 0 else -d - 1


def _sliced(imp: Importer, node: OnnxNode, value: Value, begin: Sequence[int],
            end: Sequence[int], strides: Sequence[int]) -> Value:
    """A strided slice of ``value``; the value itself when the slice keeps all of it."""
    shape = shape_of(value)
    if list(begin) == [0] * len(shape) and list(end) == list(shape) and set(strides) <= {1}:
        return value
    return _moved(imp, node, "strided_slice", value, begin=tuple(begin), end=tuple(end),
                  strides=tuple(strides))


def _concat(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    names = [name for name in node.inputs if name]
    values = [imp.value(name) for name in names]
    axis = int(node.attrs["axis"])
    if all(isinstance(v, np.ndarray) for v in values):
        return [np.concatenate(values, axis=axis)]
    return [imp.call("concatenate", [imp.tensor(name) for name in names], node, axis=axis)]


def _flatten(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    axis = int(node.attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise NodeError(f"axis {node.attrs['axis']} is out of range for {len(shape)} dimensions")
    if axis == 1 and isinstance(value, Node):
        return [imp.call("nn.batch_flatten", [value], node)]
    return [reshaped(imp, node, value,
                      (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))]


def _reshape_target(shape: tuple[int, ...], target: list[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's target made concrete: 0 copies the input's dimension (unless
    allowzero), one -1 takes what is left."""
    out = list(target)
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(shape):
                raise NodeError(f"0 at position {i} of {target} has no input dimension to copy")
            out[i] = shape[i]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise NodeError(f"shape {target} has more than one -1 or a negative dimension")
    size = int(np.prod(shape))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or size % known:
            raise NodeError(f"cannot reshape {list(shape)} to {target}")
        out[out.index(-1)] = size // known
    if int(np.prod(out)) != size:
        raise NodeError(f"cannot reshape {list(shape)} to {target}")
    return out


def _reshape(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    target = imp.array(node.arg(1), "the target shape").reshape(-1).tolist()
    newshape = _reshape_target(shape_of(value), [int(d) for d in target],
                               bool(node.attrs.get("allowzero", 0)))
    return [reshaped(imp, node, value, newshape)]


def _transpose(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    perm = node.ints("perm", tuple(reversed(range(len(shape_of(value))))))
    if isinstance(value, np.ndarray):
        return [np.ascontiguousarray(np.transpose(value, perm))]
    return [imp.call("transpose", [value], node, axes=perm)]


def _unsqueeze(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    axes = _axes(imp, node)
    if axes is None:
        raise NodeError("axes are required")
    rank = len(shape) + len(axes)
    inserted = {check_axis(a, rank) for a in axes}
    if len(inserted) != len(axes):
        raise NodeError(f"axes {list(axes)} repeat a dimension")
    rest = iter(shape)
    return [reshaped(imp, node, value, [1 if i in inserted else next(rest) for i in range(rank)])]


def _squeeze(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    axes = _axes(imp, node)
    dropped = ({i for i, d in enumerate(shape) if d == 1} if axes is None
               else {check_axis(a, len(shape)) for a in axes})
    if any(shape[i] != 1 for i in dropped):
        raise NodeError(f"cannot squeeze axes {sorted(dropped)} of shape {list(shape)}")
    return [reshaped(imp, node, value, [d for i, d in enumerate(shape) if i not in dropped])]


def _identity(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    return [imp.value(node.arg(0))]


def _pad(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """pads and the fill are attributes before opset 11, inputs from 11; the axes input
    comes in 18. Negative pads crop (done first, as a slice)."""
    mode = node.attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise NodeError(f"mode {mode!r} is not supported; only {', '.join(PAD_MODES)}")
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    ndim = len(shape)
    if node.version < 11:
        pads = list(node.ints("pads"))
        fill = float(node.attrs.get("value", 0.0))
        axes = None
    else:
        pads = _int_list(imp, node, 1, "pads") or []
        fill_name = node.optional(2)
        fill = (0.0 if fill_name is None
                else float(imp.array(fill_name, "constant_value").reshape(-1)[0]))
        axes = _int_list(imp, node, 3, "axes") if node.version >= 18 else None
    axes = list(range(ndim)) if axes is None else [check_axis(a, ndim) for a in axes]
    if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
        raise NodeError(f"pads {pads} must be 2 values per padded axis {axes}")
    width = [[0, 0] for _ in shape]
    for k, axis in enumerate(axes):
        width[axis] = [pads[k], pads[k + len(axes)]]
    cropped = _sliced(imp, node, value, [max(-lo, 0) for lo, _ in width],
                      [d - max(-hi, 0) for d, (_, hi) in zip(shape, width)], [1] * ndim)
    kept = tuple((max(lo, 0), max(hi, 0)) for lo, hi in width)
    if not any(lo or hi for lo, hi in kept):
        return [cropped]
    return [_moved(imp, node, "nn.pad", cropped, pad_width=kept, pad_value=fill,
                   pad_mode=mode)]


_CONSTANT_ATTRS: dict[str, Callable[[Any], np.ndarray]] = {
    "value": np.asarray,
    "value_float": lambda v: np.array(v, dtype=np.float32),
    "value_floats": lambda v: np.array(v, dtype=np.float32).reshape(-1),
    "value_int": lambda v: np.array(v, dtype=np.int64),
    "value_ints": lambda v: np.array(v, dtype=np.int64).reshape(-1),
}


def _constant(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    for key, make in _CONSTANT_ATTRS.items():
        if key in node.attrs:
            return [make(node.attrs[key])]
    raise NodeError(f"attribute(s) {', '.join(sorted(node.attrs)) or '(none)'} not supported; "
                     f"only {', '.join(_CONSTANT_ATTRS)}")


def _constant_of_shape(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """A ``full`` node, so large filled weights cost nothing until something folds them;
    an empty one is an (empty) array."""
    shape = tuple(int(d) for d in imp.array(node.arg(0), "the shape").reshape(-1))
    value = np.asarray(node.attrs.get("value", np.zeros(1, dtype=np.float32)))
    if str(value.dtype) not in DTYPES:
        raise NodeError(f"value of dtype {value.dtype} is not supported ({', '.join(DTYPES)})")
    if 0 in shape:
        return [np.zeros(shape, value.dtype)]
    return [imp.call("full", [], node, shape=shape, fill_value=value.reshape(-1)[0].item(),
                     dtype=str(value.dtype))]


def _shape_of(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Always known at import: every IR value has a static shape."""
    shape = shape_of(imp.value(node.arg(0)))
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    return [np.array(shape[start:end], dtype=np.int64)]


def _gather(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Indices must be known at import (any rank, negatives count from the end); the data
    may be computed at run time (an IR ``take``)."""
    data = imp.value(node.arg(0))
    shape = shape_of(data)
    indices = imp.array(node.arg(1), "indices (Gather takes only constant indices)")
    axis = check_axis(int(node.attrs.get("axis", 0)), len(shape))
    extent = shape[axis]
    if indices.size and not (-extent <= indices.min() and indices.max() < extent):
        raise NodeError(f"indices must lie in [{-extent}, {extent}) on axis {axis}")
    indices = np.where(indices < 0, indices + extent, indices).astype(np.int32)
    return [_moved(imp, node, "take", data, indices, axis=axis)]


def _slice(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """starts/ends/axes are attributes before opset 10; from 10 they, and steps, are inputs."""
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    if node.version < 10:
        starts, ends = list(node.ints("starts")), list(node.ints("ends"))
        axes: list[int] | None = list(node.ints("axes", range(len(starts))))
        steps: list[int] | None = None
    else:
        starts = _int_list(imp, node, 1, "starts") or []
        ends = _int_list(imp, node, 2, "ends") or []
        axes = _int_list(imp, node, 3, "axes")
        steps = _int_list(imp, node, 4, "steps")
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise NodeError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                        "must have one value per sliced axis")
    begin, end, strides = [0] * len(shape), list(shape), [1] * len(shape)
    seen: set[int] = set()
    for axis, first, last, step in zip(axes, starts, ends, steps):
        k = check_axis(axis, len(shape))
        if k in seen:
            raise NodeError(f"axes {axes} repeat a dimension")
        if step == 0:
            raise NodeError("steps must not be 0")
        seen.add(k)
        begin[k], end[k] = _slice_bounds(shape[k], first, last, step)
        strides[k] = step
    return [_sliced(imp, node, value, begin, end, strides)]


def _split_sizes(imp: Importer, node: OnnxNode, extent: int) -> list[int]:
    """The parts' extents: given (an attribute before opset 13, an input from 13), or as
    many equal parts as outputs (``num_outputs`` from 18), the last one smaller when the
    extent does not divide evenly."""
    if node.version < 13:
        sizes = [int(v) for v in node.attrs.get("split", [])] or None
    else:
        sizes = _int_list(imp, node, 1, "split")
    if sizes is None:
        count = int(node.attrs.get("num_outputs", len(node.outputs)))
        chunk = -(-extent // count) if count else 0
        sizes = [chunk] * (count - 1) + [extent - chunk * (count - 1)]
        if count == 0 or sizes[-1] < 0:
            raise NodeError(f"cannot split an extent of {extent} into {count} parts")
    if sum(sizes) != extent or min(sizes) < 0:
        raise NodeError(f"split {sizes} does not add up to the axis extent {extent}")
    return sizes


def _split(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    axis = check_axis(int(node.attrs.get("axis", 0)), len(shape))
    parts, start = [], 0
    for size in _split_sizes(imp, node, shape[axis]):
        begin, end = [0] * len(shape), list(shape)
        begin[axis], end[axis] = start, start + size
        parts.append(_sliced(imp, node, value, begin, end, [1] * len(shape)))
        start += size
    return parts


def _expand(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """numpy broadcasting of the input and the shape, both ways (a 1 in the shape keeps
    the input's dimension)."""
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    target = tuple(int(d) for d in imp.array(node.arg(1), "the shape").reshape(-1))
    try:
        out = tuple(int(d) for d in np.broadcast_shapes(shape, target))
    except ValueError:
        raise NodeError(f"cannot broadcast {list(shape)} to {list(target)}") from None
    value = reshaped(imp, node, value, (1,) * (len(out) - len(shape)) + shape)
    return [value if shape_of(value) == out else
            _moved(imp, node, "broadcast_to", value, shape=out)]


def _tile(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    reps = tuple(int(r) for r in imp.array(node.arg(1), "repeats").reshape(-1))
    if len(reps) != len(shape_of(value)):
        raise NodeError(f"repeats {list(reps)} need one count per dimension of "
                        f"{list(shape_of(value))}")
    return [value if set(reps) <= {1} else _moved(imp, node, "tile", value, reps=reps)]


CONVERTERS: dict[str, Converter] = {
    "Concat": _concat,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Flatten": _flatten,
    "Gather": _gather,
    "Identity": _identity,
    "Pad": _pad,
    "Reshape": _reshape,
    "Shape": _shape_of,
    "Slice": _slice,
    "Split": _split,
    "Squeeze": _squeeze,
    "Tile": _tile,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
}

"""Tensor operators: shapes and constants (evaluated at import where known), and
data movement (concat, reshape, transpose, pad, gather...)."""

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
    normalize_axis,
    reshaped,
    shape_of,
)
from compiler.ir import Node
from compiler.ir.types import DTYPES


def _axes(imp: Importer, node: OnnxNode) -> tuple[int, ...] | None:
    """Unsqueeze/Squeeze axes: an attribute before opset 13, an input from 13 on."""
    if node.version < 13:
        axes = node.attrs.get("axes")
    else:
        name = node.optional(1)
        axes = None if name is None else imp.array(name, "axes").reshape(-1).tolist()
    return None if axes is None else tuple(int(a) for a in axes)



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
    inserted = {normalize_axis(a, rank) for a in axes}
    if len(inserted) != len(axes):
        raise NodeError(f"axes {list(axes)} repeat a dimension")
    rest = iter(shape)
    return [reshaped(imp, node, value, [1 if i in inserted else next(rest) for i in range(rank)])]


def _squeeze(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = shape_of(value)
    axes = _axes(imp, node)
    dropped = ({i for i, d in enumerate(shape) if d == 1} if axes is None
               else {normalize_axis(a, len(shape)) for a in axes})
    if any(shape[i] != 1 for i in dropped):
        raise NodeError(f"cannot squeeze axes {sorted(dropped)} of shape {list(shape)}")
    return [reshaped(imp, node, value, [d for i, d in enumerate(shape) if i not in dropped])]


def _identity(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    return [imp.value(node.arg(0))]



def _pad(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Constant mode only; pads (and the fill) are attributes before opset 11, inputs from 11."""
    mode = node.attrs.get("mode", "constant")
    if mode != "constant":
        raise NodeError(f"mode {mode!r} is not supported; only 'constant'")
    data = imp.tensor(node.arg(0))
    if node.version < 11:
        pads = node.ints("pads")
        fill = float(node.attrs.get("value", 0.0))
    else:
        pads = tuple(int(p) for p in imp.array(node.arg(1), "pads").reshape(-1))
        fill_name = node.optional(2)
        fill = (0.0 if fill_name is None
                else float(imp.array(fill_name, "constant_value").reshape(-1)[0]))
    ndim = data.ty.ndim
    if len(pads) != 2 * ndim or min(pads, default=0) < 0:
        raise NodeError(f"pads {list(pads)} must be {2 * ndim} non-negative values")
    width = tuple((pads[i], pads[i + ndim]) for i in range(ndim))
    return [imp.call("nn.pad", [data], node, pad_width=width, pad_value=fill)]


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
    """A ``full`` node, so large filled weights cost nothing until something folds them."""
    shape = tuple(int(d) for d in imp.array(node.arg(0), "the shape").reshape(-1))
    value = np.asarray(node.attrs.get("value", np.zeros(1, dtype=np.float32)))
    if str(value.dtype) not in DTYPES:
        raise NodeError(f"value of dtype {value.dtype} is not supported ({', '.join(DTYPES)})")
    return [imp.call("full", [], node, shape=shape, fill_value=value.reshape(-1)[0].item(),
                     dtype=str(value.dtype))]


def _shape_of(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Always known at import: every IR value has a static shape."""
    shape = shape_of(imp.value(node.arg(0)))
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    return [np.array(shape[start:end], dtype=np.int64)]


def _gather(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Import-time constants only (shape arithmetic); the IR has no gather op."""
    data = imp.array(node.arg(0), "data (Gather runs only at import)")
    indices = imp.array(node.arg(1), "indices (Gather runs only at import)")
    return [np.asarray(np.take(data, indices, axis=int(node.attrs.get("axis", 0))))]





CONVERTERS: dict[str, Converter] = {
    "Concat": _concat,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Flatten": _flatten,
    "Gather": _gather,
    "Identity": _identity,
    "Pad": _pad,
    "Reshape": _reshape,
    "Shape": _shape_of,
    "Squeeze": _squeeze,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
}

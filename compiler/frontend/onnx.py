"""ONNX import (default domain, opsets 9 to 17) into the IR.

Every ONNX value becomes either an IR node or, when it is known at import time, a numpy
array: initializers, Constant nodes, Shape of any (statically shaped) value, and
Gather / Cast / Concat / Unsqueeze / Squeeze / Reshape / Flatten / Transpose / Identity
applied to such arrays are evaluated in numpy here. That is how shape-like inputs
(Reshape's shape, Pad's pads, Unsqueeze's axes, ConstantOfShape's shape...) are resolved,
and why they never reach the graph: an array becomes an IR constant only when an op
reads it as data. Shapes are static; a dynamic leading (batch) dimension of a graph
input is imported as 1.

Anything the IR cannot express (an op, an attribute value, a used optional output)
raises FrontendError naming the op type and the node, never a silent skip.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from compiler.ir import Graph, GraphBuilder, IRError, Node
from compiler.ir.ops import evaluate_op
from compiler.ir.types import DTYPES

MIN_OPSET, MAX_OPSET = 9, 17

# An ONNX value: an IR node, or an array known at import time.
Value = Node | np.ndarray


class FrontendError(ValueError):
    """A model the importer cannot express in the IR; the message names the ONNX node."""


class _NodeError(Exception):
    """Raised inside a converter; the importer prefixes the node it was converting."""


@dataclass(frozen=True)
class _OnnxNode:
    """An ONNX node with its attributes parsed once into Python values."""

    op_type: str
    name: str  # the ONNX node name, or its first output's when it has none
    described: str  # how errors refer to it
    inputs: tuple[str, ...]  # "" marks an omitted optional input
    outputs: tuple[str, ...]
    attrs: dict[str, Any]

    @classmethod
    def of(cls, proto: onnx.NodeProto) -> _OnnxNode:
        first = proto.output[0] if proto.output else ""
        described = (f"{proto.op_type} node {proto.name!r}" if proto.name
                     else f"{proto.op_type} node (output {first!r})")
        return cls(proto.op_type, proto.name or first, described, tuple(proto.input),
                   tuple(proto.output), {a.name: _attribute(a) for a in proto.attribute})

    def arg(self, index: int) -> str:
        name = self.optional(index)
        if name is None:
            raise _NodeError(f"input {index} is missing")
        return name

    def optional(self, index: int) -> str | None:
        return self.inputs[index] if index < len(self.inputs) and self.inputs[index] else None

    def ints(self, key: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
        value = self.attrs.get(key, default)
        if value is None:
            raise _NodeError(f"attribute {key!r} is required")
        return tuple(int(v) for v in value)


def _attribute(attr: onnx.AttributeProto) -> Any:
    """An attribute as plain Python: tensors as arrays, strings decoded, lists as lists."""
    value = onnx.helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == onnx.AttributeProto.STRING:
        return value.decode()
    if attr.type == onnx.AttributeProto.STRINGS:
        return [v.decode() for v in value]
    if attr.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(value)
    return value


def _shape(value: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape) if isinstance(value, np.ndarray) else value.ty.shape


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise _NodeError(f"axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


class _Importer:
    """The values made so far, keyed by ONNX name, and the builder that makes new ones."""

    def __init__(self, opset: int, used: set[str]) -> None:
        self.builder = GraphBuilder()
        self.opset = opset
        self.used = used  # every value name a node or a graph output reads
        self.values: dict[str, Value] = {}
        self._constants: dict[str, Node] = {}  # arrays already made IR constants

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise _NodeError(f"input {name!r} is not a graph input, an initializer or the "
                             "output of an earlier node") from None

    def tensor(self, name: str) -> Node:
        """The value as an IR node; an array becomes one shared constant per ONNX name."""
        value = self.value(name)
        if isinstance(value, Node):
            return value
        if name not in self._constants:
            self._constants[name] = self.constant(value, name)
        return self._constants[name]

    def constant(self, array: np.ndarray, name: str) -> Node:
        if str(array.dtype) not in DTYPES:
            raise _NodeError(f"constant {name!r} has dtype {array.dtype}, which the IR does "
                             f"not support ({', '.join(DTYPES)})")
        return self.builder.const(array, name)

    def node(self, value: Value, name: str) -> Node:
        """The ONNX value ``name``, or a value derived from it, as an IR node: a derived
        array becomes a fresh constant, the value itself the shared one."""
        if isinstance(value, Node):
            return value
        return self.tensor(name) if value is self.values.get(name) else self.constant(value, name)

    def array(self, name: str, what: str) -> np.ndarray:
        """A value that must be known at import time, e.g. a shape-like input."""
        value = self.value(name)
        if isinstance(value, np.ndarray):
            return value
        if value.op == "full":
            return np.full(value.attrs["shape"], value.attrs["fill_value"], value.attrs["dtype"])
        raise _NodeError(f"{what} ({name!r}) must be a constant known at import time")

    def call(self, op: str, inputs: Sequence[Node], node: _OnnxNode, **attrs: Any) -> Node:
        return self.builder.call(op, inputs, name=node.name, **attrs)

    def scalar(self, value: float) -> Node:
        return self.builder.const(np.array(value, dtype=np.float32))


Converter = Callable[[_Importer, _OnnxNode], Sequence[Value]]


# ---------------------------------------------------------------- shared lowerings


def _reshaped(imp: _Importer, node: _OnnxNode, value: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if _shape(value) == shape:
        return value
    if isinstance(value, np.ndarray):
        return value.reshape(shape)
    return imp.call("reshape", [value], node, newshape=shape)


def _transposed(imp: _Importer, node: _OnnxNode, value: Value, name: str) -> Node:
    """A matrix transposed; done at import when it is a constant or a ``full`` fill."""
    if isinstance(value, np.ndarray):
        return imp.constant(np.ascontiguousarray(value.T), f"{name}.T")
    if value.op == "full":
        return imp.builder.call("full", [], name=value.name,
                                **{**value.attrs, "shape": value.ty.shape[::-1]})
    return imp.call("transpose", [value], node, axes=(1, 0))


def _spatial(node: _OnnxNode, key: str) -> tuple[int, int]:
    value = node.ints(key, (1, 1))
    if len(value) != 2:
        raise _NodeError(f"{key} {list(value)} is not 2-D; only 2-D windows are supported")
    return value[0], value[1]


def _check_nchw(data: Node) -> None:
    if data.ty.ndim != 4:
        raise _NodeError(f"only 2-D (NCHW) inputs are supported, got shape {list(data.ty.shape)}")


def _padding(node: _OnnxNode, size: tuple[int, ...], kernel: tuple[int, ...],
             strides: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads`` or ``auto_pad``; ONNX's pads order is the
    IR's: all begins, then all ends."""
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = node.ints("pads", (0, 0, 0, 0))
        if len(pads) != 4 or min(pads) < 0:
            raise _NodeError(f"pads {list(pads)} must be 4 non-negative values")
        return pads[0], pads[1], pads[2], pads[3]
    if auto_pad == "VALID":
        return 0, 0, 0, 0
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise _NodeError(f"auto_pad {auto_pad!r} is not supported")
    begin, end = [], []
    for n, k, s, d in zip(size, kernel, strides, dilation):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin[0], begin[1], end[0], end[1]


def _axes(imp: _Importer, node: _OnnxNode) -> tuple[int, ...] | None:
    """Unsqueeze/Squeeze axes: an attribute before opset 13, an input from 13 on."""
    if imp.opset < 13:
        axes = node.attrs.get("axes")
    else:
        name = node.optional(1)
        axes = None if name is None else imp.array(name, "axes").reshape(-1).tolist()
    return None if axes is None else tuple(int(a) for a in axes)


# ---------------------------------------------------------------- converters


def _unary(op: str) -> Converter:
    def convert(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
        return [imp.call(op, [imp.tensor(node.arg(0))], node)]
    return convert


def _binary(op: str) -> Converter:
    def convert(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
        lhs, rhs = imp.value(node.arg(0)), imp.value(node.arg(1))
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            # shape arithmetic (PyTorch exports: Shape -> Gather -> Mul -> Reshape)
            # stays at import time, where Reshape can read the result
            return [evaluate_op(op, [lhs, rhs], {})]
        return [imp.call(op, [imp.tensor(node.arg(0)), imp.tensor(node.arg(1))], node)]
    return convert


def _leaky_relu(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    return [imp.call("nn.leaky_relu", [imp.tensor(node.arg(0))], node,
                     alpha=float(node.attrs.get("alpha", 0.01)))]


def _sum(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    terms = [imp.tensor(name) for name in node.inputs if name]
    if not terms:
        raise _NodeError("needs at least one input")
    total = terms[0]
    for term in terms[1:]:
        total = imp.call("add", [total, term], node)
    return [total]


def _conv(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    data, weight = imp.tensor(node.arg(0)), imp.tensor(node.arg(1))
    _check_nchw(data)
    kernel = weight.ty.shape[2:]
    if "kernel_shape" in node.attrs and node.ints("kernel_shape") != kernel:
        raise _NodeError(f"kernel_shape {node.attrs['kernel_shape']} does not match the "
                         f"weight's {list(weight.ty.shape)}")
    strides, dilation = _spatial(node, "strides"), _spatial(node, "dilations")
    out = imp.call("nn.conv2d", [data, weight], node, strides=strides,
                   padding=_padding(node, data.ty.shape[2:], kernel, strides, dilation),
                   dilation=dilation, groups=int(node.attrs.get("group", 1)))
    bias = node.optional(2)
    if bias is not None:
        out = imp.call("nn.bias_add", [out, imp.tensor(bias)], node, axis=1)
    return [out]


def _pool_attrs(node: _OnnxNode, data: Node) -> dict[str, Any]:
    _check_nchw(data)
    kernel = node.ints("kernel_shape")
    if len(kernel) != 2:
        raise _NodeError(f"kernel_shape {list(kernel)} is not 2-D")
    strides, dilation = _spatial(node, "strides"), _spatial(node, "dilations")
    return dict(pool_size=kernel, strides=strides, dilation=dilation,
                padding=_padding(node, data.ty.shape[2:], kernel, strides, dilation),
                ceil_mode=bool(node.attrs.get("ceil_mode", 0)))


def _max_pool(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    if node.attrs.get("storage_order", 0) != 0:
        raise _NodeError("storage_order=1 (column-major indices) is not supported")
    data = imp.tensor(node.arg(0))
    return [imp.call("nn.max_pool2d", [data], node, **_pool_attrs(node, data))]


def _avg_pool(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    data = imp.tensor(node.arg(0))
    return [imp.call("nn.avg_pool2d", [data], node, **_pool_attrs(node, data),
                     count_include_pad=bool(node.attrs.get("count_include_pad", 0)))]


def _global_avg_pool(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    data = imp.tensor(node.arg(0))
    _check_nchw(data)
    return [imp.call("nn.global_avg_pool2d", [data], node)]


def _batch_norm(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    if node.attrs.get("spatial", 1) != 1:
        raise _NodeError("spatial=0 (per-activation statistics) is not supported")
    if node.attrs.get("training_mode", 0):
        raise _NodeError("training_mode=1 is not supported; only inference")
    inputs = [imp.tensor(node.arg(i)) for i in range(5)]
    return [imp.call("nn.batch_norm", inputs, node, axis=1,
                     epsilon=float(node.attrs.get("epsilon", 1e-5)))]


def _gemm(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """alpha * A' B' + beta * C as dense (weight [N, K] = B'^T) plus scale and bias."""
    a, b = imp.value(node.arg(0)), imp.value(node.arg(1))
    if len(_shape(a)) != 2 or len(_shape(b)) != 2:
        raise _NodeError(f"A and B must be matrices, got {list(_shape(a))} and {list(_shape(b))}")
    data = (_transposed(imp, node, a, node.arg(0)) if node.attrs.get("transA", 0)
            else imp.tensor(node.arg(0)))
    weight = (imp.tensor(node.arg(1)) if node.attrs.get("transB", 0)
              else _transposed(imp, node, b, node.arg(1)))
    out = imp.call("nn.dense", [data, weight], node)
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    if alpha != 1.0:
        out = imp.call("multiply", [out, imp.scalar(alpha)], node)
    c_name = node.optional(2)
    if c_name is None or beta == 0.0:
        return [out]
    bias = imp.value(c_name)
    if beta != 1.0:
        bias = (bias * np.float32(beta) if isinstance(bias, np.ndarray)
                else imp.call("multiply", [bias, imp.scalar(beta)], node))
    units = out.ty.shape[1]
    if _shape(bias) in ((units,), (1, units)):
        bias = _reshaped(imp, node, bias, (units,))
        return [imp.call("nn.bias_add", [out, imp.node(bias, c_name)], node, axis=1)]
    return [imp.call("add", [out, imp.node(bias, c_name)], node)]


def _matmul(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """A [..., K] x B [K, N] as a dense on A viewed as a matrix."""
    a, b = imp.value(node.arg(0)), imp.value(node.arg(1))
    a_shape, b_shape = _shape(a), _shape(b)
    if len(b_shape) != 2 or len(a_shape) < 2:
        raise _NodeError(f"only an N-D (N >= 2) by 2-D product is supported, got "
                         f"{list(a_shape)} x {list(b_shape)}")
    weight = _transposed(imp, node, b, node.arg(1))
    rows = int(np.prod(a_shape[:-1]))
    data = imp.node(_reshaped(imp, node, a, (rows, a_shape[-1])), node.arg(0))
    out = imp.call("nn.dense", [data, weight], node)
    return [_reshaped(imp, node, out, a_shape[:-1] + (b_shape[1],))]


def _concat(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    names = [name for name in node.inputs if name]
    values = [imp.value(name) for name in names]
    axis = int(node.attrs["axis"])
    if all(isinstance(v, np.ndarray) for v in values):
        return [np.concatenate(values, axis=axis)]
    return [imp.call("concatenate", [imp.tensor(name) for name in names], node, axis=axis)]


def _flatten(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = _shape(value)
    axis = int(node.attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise _NodeError(f"axis {node.attrs['axis']} is out of range for {len(shape)} dimensions")
    if axis == 1 and isinstance(value, Node):
        return [imp.call("nn.batch_flatten", [value], node)]
    return [_reshaped(imp, node, value,
                      (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))]


def _reshape_target(shape: tuple[int, ...], target: list[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's target made concrete: 0 copies the input's dimension (unless
    allowzero), one -1 takes what is left."""
    out = list(target)
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(shape):
                raise _NodeError(f"0 at position {i} of {target} has no input dimension to copy")
            out[i] = shape[i]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise _NodeError(f"shape {target} has more than one -1 or a negative dimension")
    size = int(np.prod(shape))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or size % known:
            raise _NodeError(f"cannot reshape {list(shape)} to {target}")
        out[out.index(-1)] = size // known
    if int(np.prod(out)) != size:
        raise _NodeError(f"cannot reshape {list(shape)} to {target}")
    return out


def _reshape(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    target = imp.array(node.arg(1), "the target shape").reshape(-1).tolist()
    newshape = _reshape_target(_shape(value), [int(d) for d in target],
                               bool(node.attrs.get("allowzero", 0)))
    return [_reshaped(imp, node, value, newshape)]


def _transpose(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    perm = node.ints("perm", tuple(reversed(range(len(_shape(value))))))
    if isinstance(value, np.ndarray):
        return [np.ascontiguousarray(np.transpose(value, perm))]
    return [imp.call("transpose", [value], node, axes=perm)]


def _unsqueeze(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = _shape(value)
    axes = _axes(imp, node)
    if axes is None:
        raise _NodeError("axes are required")
    rank = len(shape) + len(axes)
    inserted = {_normalize_axis(a, rank) for a in axes}
    if len(inserted) != len(axes):
        raise _NodeError(f"axes {list(axes)} repeat a dimension")
    rest = iter(shape)
    return [_reshaped(imp, node, value, [1 if i in inserted else next(rest) for i in range(rank)])]


def _squeeze(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    value = imp.value(node.arg(0))
    shape = _shape(value)
    axes = _axes(imp, node)
    dropped = ({i for i, d in enumerate(shape) if d == 1} if axes is None
               else {_normalize_axis(a, len(shape)) for a in axes})
    if any(shape[i] != 1 for i in dropped):
        raise _NodeError(f"cannot squeeze axes {sorted(dropped)} of shape {list(shape)}")
    return [_reshaped(imp, node, value, [d for i, d in enumerate(shape) if i not in dropped])]


def _identity(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    return [imp.value(node.arg(0))]


def _dropout(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """Inference: the identity, whatever the ratio; the mask output is not supported."""
    training = node.optional(2) if imp.opset >= 12 else None
    if training is not None and imp.array(training, "training_mode").reshape(-1).any():
        raise _NodeError("training_mode=True is not supported; only inference")
    return [imp.value(node.arg(0))]


def _softmax(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """From opset 13 one axis (default -1); before, the input is seen as 2-D, flattened
    at ``axis`` (default 1), and normalized over the whole second part."""
    data = imp.tensor(node.arg(0))
    if imp.opset >= 13:
        return [imp.call("nn.softmax", [data], node, axis=int(node.attrs.get("axis", -1)))]
    shape = data.ty.shape
    axis = _normalize_axis(int(node.attrs.get("axis", 1)), len(shape))
    if axis == len(shape) - 1:
        return [imp.call("nn.softmax", [data], node, axis=-1)]
    flat = _reshaped(imp, node, data, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))
    out = imp.call("nn.softmax", [flat], node, axis=-1)
    return [_reshaped(imp, node, out, shape)]


def _lrn(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    if "size" not in node.attrs:
        raise _NodeError("attribute 'size' is required")
    return [imp.call("nn.lrn", [imp.tensor(node.arg(0))], node, axis=1,
                     size=int(node.attrs["size"]), alpha=float(node.attrs.get("alpha", 1e-4)),
                     beta=float(node.attrs.get("beta", 0.75)),
                     bias=float(node.attrs.get("bias", 1.0)))]


def _pad(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """Constant mode only; pads (and the fill) are attributes before opset 11, inputs from 11."""
    mode = node.attrs.get("mode", "constant")
    if mode != "constant":
        raise _NodeError(f"mode {mode!r} is not supported; only 'constant'")
    data = imp.tensor(node.arg(0))
    if imp.opset < 11:
        pads = node.ints("pads")
        fill = float(node.attrs.get("value", 0.0))
    else:
        pads = tuple(int(p) for p in imp.array(node.arg(1), "pads").reshape(-1))
        fill_name = node.optional(2)
        fill = (0.0 if fill_name is None
                else float(imp.array(fill_name, "constant_value").reshape(-1)[0]))
    ndim = data.ty.ndim
    if len(pads) != 2 * ndim or min(pads, default=0) < 0:
        raise _NodeError(f"pads {list(pads)} must be {2 * ndim} non-negative values")
    width = tuple((pads[i], pads[i + ndim]) for i in range(ndim))
    return [imp.call("nn.pad", [data], node, pad_width=width, pad_value=fill)]


_CONSTANT_ATTRS: dict[str, Callable[[Any], np.ndarray]] = {
    "value": np.asarray,
    "value_float": lambda v: np.array(v, dtype=np.float32),
    "value_floats": lambda v: np.array(v, dtype=np.float32).reshape(-1),
    "value_int": lambda v: np.array(v, dtype=np.int64),
    "value_ints": lambda v: np.array(v, dtype=np.int64).reshape(-1),
}


def _constant(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    for key, make in _CONSTANT_ATTRS.items():
        if key in node.attrs:
            return [make(node.attrs[key])]
    raise _NodeError(f"attribute(s) {', '.join(sorted(node.attrs)) or '(none)'} not supported; "
                     f"only {', '.join(_CONSTANT_ATTRS)}")


def _constant_of_shape(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """A ``full`` node, so large filled weights cost nothing until something folds them."""
    shape = tuple(int(d) for d in imp.array(node.arg(0), "the shape").reshape(-1))
    value = np.asarray(node.attrs.get("value", np.zeros(1, dtype=np.float32)))
    if str(value.dtype) not in DTYPES:
        raise _NodeError(f"value of dtype {value.dtype} is not supported ({', '.join(DTYPES)})")
    return [imp.call("full", [], node, shape=shape, fill_value=value.reshape(-1)[0].item(),
                     dtype=str(value.dtype))]


def _shape_of(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """Always known at import: every IR value has a static shape."""
    shape = _shape(imp.value(node.arg(0)))
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    return [np.array(shape[start:end], dtype=np.int64)]


def _gather(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """Import-time constants only (shape arithmetic); the IR has no gather op."""
    data = imp.array(node.arg(0), "data (Gather runs only at import)")
    indices = imp.array(node.arg(1), "indices (Gather runs only at import)")
    return [np.asarray(np.take(data, indices, axis=int(node.attrs.get("axis", 0))))]


def _cast(imp: _Importer, node: _OnnxNode) -> Sequence[Value]:
    """Import-time constants, or a tensor already of the target type (a no-op)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"]))
    value = imp.value(node.arg(0))
    if isinstance(value, np.ndarray):
        return [value.astype(dtype)]
    if value.ty.dtype != str(dtype):
        raise _NodeError(f"casting a computed {value.ty.dtype} tensor to {dtype} is not "
                         "supported; only import-time constants are cast")
    return [value]


_CONVERTERS: dict[str, Converter] = {
    "Add": _binary("add"),
    "AveragePool": _avg_pool,
    "BatchNormalization": _batch_norm,
    "Cast": _cast,
    "Concat": _concat,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Conv": _conv,
    "Div": _binary("divide"),
    "Dropout": _dropout,
    "Flatten": _flatten,
    "Gather": _gather,
    "Gemm": _gemm,
    "GlobalAveragePool": _global_avg_pool,
    "Identity": _identity,
    "LRN": _lrn,
    "LeakyRelu": _leaky_relu,
    "MatMul": _matmul,
    "MaxPool": _max_pool,
    "Mul": _binary("multiply"),
    "Pad": _pad,
    "Relu": _unary("nn.relu"),
    "Reshape": _reshape,
    "Shape": _shape_of,
    "Sigmoid": _unary("sigmoid"),
    "Softmax": _softmax,
    "Squeeze": _squeeze,
    "Sub": _binary("subtract"),
    "Sum": _sum,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
}


# ---------------------------------------------------------------- the model


def _load(model: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"expected a path or an onnx.ModelProto, got {type(model).__name__}")
    try:
        return onnx.load(os.fspath(model))
    except DecodeError as err:
        raise FrontendError(f"{os.fspath(model)}: not an ONNX model ({err})") from None


def _opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise FrontendError("the model imports no version of the default ONNX domain")
    if not MIN_OPSET <= versions[0] <= MAX_OPSET:
        raise FrontendError(f"opset {versions[0]} is not supported; only {MIN_OPSET} to "
                            f"{MAX_OPSET}")
    return versions[0]


def _input_shape(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    """A float32 graph input's static shape; a dynamic leading (batch) dimension is 1."""
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        raise FrontendError(f"graph input {info.name!r} is not a tensor")
    if tensor.elem_type != onnx.TensorProto.FLOAT:
        kind = onnx.TensorProto.DataType.Name(tensor.elem_type)
        raise FrontendError(f"graph input {info.name!r} has element type {kind}; only "
                            "FLOAT (float32) inputs are supported")
    if not tensor.HasField("shape"):
        raise FrontendError(f"graph input {info.name!r} has no shape; shapes must be static")
    dims = []
    for i, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif i == 0:
            dims.append(1)
        else:
            raise FrontendError(f"graph input {info.name!r}: dimension {i} "
                                f"({dim.dim_param or 'unknown'}) is dynamic; only the leading "
                                "(batch) dimension may be, and it is imported as 1")
    return tuple(dims)


def import_onnx(model: str | os.PathLike[str] | onnx.ModelProto) -> Graph:
    """The model's main graph as an IR graph: non-initializer graph inputs become inputs,
    initializers constants, graph outputs the outputs (in order)."""
    proto = _load(model)
    graph = proto.graph
    used = {name for node in graph.node for name in node.input if name}
    used.update(out.name for out in graph.output)
    imp = _Importer(_opset(proto), used)
    for init in graph.initializer:
        imp.values[init.name] = numpy_helper.to_array(init)
    for info in graph.input:
        if info.name not in imp.values:
            imp.values[info.name] = imp.builder.input(info.name, _input_shape(info))
    for node_proto in graph.node:
        _convert(imp, node_proto)
    outputs = []
    for out in graph.output:
        try:
            outputs.append(imp.tensor(out.name))
        except _NodeError as err:
            raise FrontendError(f"graph output {out.name!r}: {err}") from None
    return imp.builder.finish(outputs)


def _convert(imp: _Importer, proto: onnx.NodeProto) -> None:
    node = _OnnxNode.of(proto)
    if proto.domain not in ("", "ai.onnx"):
        raise FrontendError(f"{node.described}: domain {proto.domain!r} is not supported")
    convert = _CONVERTERS.get(node.op_type)
    if convert is None:
        raise FrontendError(f"{node.described}: op type {node.op_type!r} is not supported")
    try:
        results = convert(imp, node)
    except (_NodeError, IRError) as err:
        raise FrontendError(f"{node.described}: {err}") from None
    except KeyError as err:  # a required attribute the model left out
        raise FrontendError(f"{node.described}: missing attribute {err}") from None
    except (IndexError, ValueError) as err:  # numpy on malformed constants
        raise FrontendError(f"{node.described}: {err}") from None
    for index, name in enumerate(node.outputs):
        if index < len(results):
            if name:
                imp.values[name] = results[index]
        elif name in imp.used:
            raise FrontendError(f"{node.described}: output {index} ({name!r}) is used, but only "
                                f"the first {len(results)} output(s) of {node.op_type} are "
                                "supported")

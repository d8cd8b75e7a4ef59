"""What every ONNX converter shares: the parsed node, the importer's values, and the
lowerings several operators use.

Every ONNX value becomes either an IR node or, when it is known at import time, a numpy
array: initializers, Constant nodes, Shape of any (statically shaped) value, and the
shape arithmetic applied to such arrays are evaluated in numpy here. That is how
shape-like inputs (Reshape's shape, Slice's starts, Resize's scales...) are resolved, and
why they never reach the graph: an array becomes an IR constant only when an op reads it
as data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.ir import INPUT, GraphBuilder, Node
from compiler.ir.types import DTYPES

# An ONNX value: an IR node, or an array known at import time.
Value = Node | np.ndarray


class NodeError(Exception):
    """Raised inside a converter; the importer prefixes the node it was converting."""


@dataclass(frozen=True)
class OnnxNode:
    """An ONNX node with its attributes parsed once into Python values."""

    op_type: str
    name: str  # the ONNX node name, or its first output's when it has none
    described: str  # how errors refer to it
    inputs: tuple[str, ...]  # "" marks an omitted optional input
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    # the operator's version at the model's opset (its schema's since_version), which
    # is what decides its inputs and attributes; 0 for an operator ONNX does not define
    version: int

    @classmethod
    def of(cls, proto: onnx.NodeProto, opset: int) -> OnnxNode:
        first = proto.output[0] if proto.output else ""
        try:
            version = onnx.defs.get_schema(proto.op_type, opset, proto.domain).since_version
        except onnx.defs.SchemaError:
            version = 0
        label = f"{proto.op_type}-{version}" if version else proto.op_type
        described = (f"{label} node {proto.name!r}" if proto.name
                     else f"{label} node (output {first!r})")
        return cls(proto.op_type, proto.name or first, described, tuple(proto.input),
                   tuple(proto.output), {a.name: _attribute(a) for a in proto.attribute},
                   version)

    def arg(self, index: int) -> str:
        name = self.optional(index)
        if name is None:
            raise NodeError(f"input {index} is missing")
        return name

    def optional(self, index: int) -> str | None:
        return self.inputs[index] if index < len(self.inputs) and self.inputs[index] else None

    def ints(self, key: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
        value = self.attrs.get(key, default)
        if value is None:
            raise NodeError(f"attribute {key!r} is required")
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


def shape_of(value: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape) if isinstance(value, np.ndarray) else value.ty.shape


class Importer:
    """The values made so far, keyed by ONNX name, and the builder that makes new ones."""

    def __init__(self, opset: int, used: set[str]) -> None:
        self.builder = GraphBuilder()
        self.opset = opset
        self.used = used  # every value name a node or a graph output reads
        self.values: dict[str, Value] = {}
        self._constants: dict[str, Node] = {}  # arrays already made IR constants
        # graph inputs a converter needed as import-time constants (shape-like inputs)
        self.needs_constant: set[str] = set()

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise NodeError(f"input {name!r} is not a graph input, an initializer or the "
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
            raise NodeError(f"constant {name!r} has dtype {array.dtype}, which the IR does "
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
        if value.op == INPUT:
            self.needs_constant.add(name)
            raise NodeError(f"{what} (graph input {name!r}) must be known at import time: "
                            "make it an initializer, or bind it (import_onnx(..., "
                            f"constants={{{name!r}: array}}))")
        raise NodeError(f"{what} ({name!r}) must be a constant known at import time")

    def call(self, op: str, inputs: Sequence[Node], node: OnnxNode, **attrs: Any) -> Node:
        return self.builder.call(op, inputs, name=node.name, **attrs)

    def scalar(self, value: float) -> Node:
        return self.builder.const(np.array(value, dtype=np.float32))


Converter = Callable[[Importer, OnnxNode], Sequence[Value]]


# ---------------------------------------------------------------- shared lowerings


def reshaped(imp: Importer, node: OnnxNode, value: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape_of(value) == shape:
        return value
    if isinstance(value, np.ndarray):
        return value.reshape(shape)
    return imp.call("reshape", [value], node, newshape=shape)


def transposed(imp: Importer, node: OnnxNode, value: Value, name: str) -> Node:
    """A matrix transposed; done at import when it is a constant or a ``full`` fill."""
    if isinstance(value, np.ndarray):
        return imp.constant(np.ascontiguousarray(value.T), f"{name}.T")
    if value.op == "full":
        return imp.builder.call("full", [], name=value.name,
                                **{**value.attrs, "shape": value.ty.shape[::-1]})
    return imp.call("transpose", [value], node, axes=(1, 0))


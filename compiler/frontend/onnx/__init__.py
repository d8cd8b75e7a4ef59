"""ONNX import (default domain, opsets 7 to the newest the installed onnx defines) into
the IR: ``import_onnx(model)``.

Shapes are static; a dynamic leading (batch) dimension of a graph input is imported as
1. Graph inputs the model needs at import time (a shape fed as an input) can be bound
with ``constants=``. Anything the IR cannot express (an op, an attribute value, a used
optional output) is a FrontendError naming the node, its operator version and what is
supported; the import goes on past it, so one error lists every such node of the model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from compiler.frontend.onnx import elementwise, image, nn, normalization, tensor
from compiler.frontend.onnx.importer import Converter, Importer, NodeError, OnnxNode
from compiler.ir import Graph, IRError

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
DEFAULT_DOMAINS = ("", "ai.onnx")

CONVERTERS: dict[str, Converter] = {
    **elementwise.CONVERTERS,
    **nn.CONVERTERS,
    **image.CONVERTERS,
    **normalization.CONVERTERS,
    **tensor.CONVERTERS,
}
SUPPORTED_OPS = tuple(sorted(CONVERTERS))


class FrontendError(ValueError):
    """A model the importer cannot express in the IR; the message names each ONNX node.

    ``needs_constant``: graph inputs that must be known at import time (bind them with
    ``import_onnx(..., constants=...)``).
    """

    def __init__(self, message: str, needs_constant: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.needs_constant = needs_constant


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
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise FrontendError("the model imports no version of the default ONNX domain")
    if not MIN_OPSET <= versions[0] <= MAX_OPSET:
        raise FrontendError(f"opset {versions[0]} of the default domain is not supported; "
                            f"only {MIN_OPSET} to {MAX_OPSET} (the newest onnx "
                            f"{onnx.__version__} defines)")
    return versions[0]


def _input_shape(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    """A float32 graph input's static shape; a dynamic leading (batch) dimension is 1."""
    tensor_type = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        raise FrontendError(f"graph input {info.name!r} is not a tensor")
    if tensor_type.elem_type != onnx.TensorProto.FLOAT:
        kind = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise FrontendError(f"graph input {info.name!r} has element type {kind}; only "
                            "FLOAT (float32) inputs are supported (bind other inputs with "
                            "constants=)")
    if not tensor_type.HasField("shape"):
        raise FrontendError(f"graph input {info.name!r} has no shape; shapes must be static")
    dims = []
    for i, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif i == 0:
            dims.append(1)
        else:
            raise FrontendError(f"graph input {info.name!r}: dimension {i} "
                                f"({dim.dim_param or 'unknown'}) is dynamic; only the leading "
                                "(batch) dimension may be, and it is imported as 1")
    return tuple(dims)


class _Failed:
    """The outputs of a node that could not be imported: whatever reads them is skipped
    (its own error would only repeat the first)."""


_FAILED = _Failed()


def import_onnx(model: str | os.PathLike[str] | onnx.ModelProto,
                constants: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The model's main graph as an IR graph: non-initializer graph inputs become inputs
    (those in ``constants`` become constants with the given values), initializers
    constants, graph outputs the outputs (in order)."""
    proto = _load(model)
    graph = proto.graph
    used = {name for node in graph.node for name in node.input if name}
    used.update(out.name for out in graph.output)
    imp = Importer(_opset(proto), used)
    for init in graph.initializer:
        imp.values[init.name] = numpy_helper.to_array(init)
    for name, value in (constants or {}).items():
        imp.values[name] = np.asarray(value)
    for info in graph.input:
        if info.name not in imp.values:
            imp.values[info.name] = imp.builder.input(info.name, _input_shape(info))
    errors: list[str] = []
    for node_proto in graph.node:
        error = _convert(imp, node_proto)
        if error is not None:
            errors.append(error)
    outputs = []
    for out in graph.output:
        if imp.values.get(out.name) is _FAILED:
            continue
        try:
            outputs.append(imp.tensor(out.name))
        except NodeError as err:
            errors.append(f"graph output {out.name!r}: {err}")
    if errors:
        raise FrontendError(_summary(errors, imp.opset), frozenset(imp.needs_constant))
    return imp.builder.finish(outputs)


def _summary(errors: list[str], opset: int) -> str:
    """One error per line; the supported operators once, when an operator was the
    problem."""
    lines = errors if len(errors) == 1 else [
        f"{len(errors)} nodes cannot be imported (default domain opset {opset}):",
        *(f"  {error}" for error in errors)]
    if any(error.endswith(": not supported") for error in errors):
        lines.append(f"supported operators: {', '.join(SUPPORTED_OPS)}")
    return "\n".join(lines)


def _convert(imp: Importer, proto: onnx.NodeProto) -> str | None:
    """Import one node; its error message, or None."""
    node = OnnxNode.of(proto, imp.opset)
    if any(imp.values.get(name) is _FAILED for name in node.inputs if name):
        return _fail(imp, node, None)
    where = f"{node.described} (opset {imp.opset})"
    if proto.domain not in DEFAULT_DOMAINS:
        return _fail(imp, node, f"{where}: domain {proto.domain!r} is not supported; only "
                                "the default ONNX domain (ai.onnx)")
    convert = CONVERTERS.get(node.op_type)
    if convert is None:
        known = "an operator ONNX does not define" if not node.version else "not supported"
        return _fail(imp, node, f"{where}: {known}")
    try:
        results = convert(imp, node)
    except (NodeError, IRError) as err:
        return _fail(imp, node, f"{where}: {err}")
    except KeyError as err:  # a required attribute the model left out
        return _fail(imp, node, f"{where}: missing attribute {err}")
    except (IndexError, ValueError) as err:  # numpy on malformed constants
        return _fail(imp, node, f"{where}: {err}")
    for index, name in enumerate(node.outputs):
        if index < len(results):
            if name:
                imp.values[name] = results[index]
        elif name in imp.used:
            return _fail(imp, node, f"{where}: output {index} ({name!r}) is used, but only "
                                    f"the first {len(results)} output(s) of {node.op_type} "
                                    "are supported")
    return None


def _fail(imp: Importer, node: OnnxNode, message: str | None) -> str | None:
    for name in node.outputs:
        if name:
            imp.values[name] = _FAILED  # type: ignore[assignment]
    return message


__all__ = ["MAX_OPSET", "MIN_OPSET", "SUPPORTED_OPS", "FrontendError", "import_onnx"]

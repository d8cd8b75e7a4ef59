"""Element-wise operators: activations, arithmetic (numpy broadcasting), and the
variadic Sum / Mean / Max / Min."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from compiler.frontend.onnx.importer import (
    Converter,
    Importer,
    NodeError,
    OnnxNode,
    Value,
)
from compiler.ir.ops import evaluate_op


def _unary(op: str) -> Converter:
    def convert(imp: Importer, node: OnnxNode) -> Sequence[Value]:
        return [imp.call(op, [imp.tensor(node.arg(0))], node)]
    return convert


def _binary(op: str) -> Converter:
    def convert(imp: Importer, node: OnnxNode) -> Sequence[Value]:
        lhs, rhs = imp.value(node.arg(0)), imp.value(node.arg(1))
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            # shape arithmetic (PyTorch exports: Shape -> Gather -> Mul -> Reshape)
            # stays at import time, where Reshape can read the result
            return [evaluate_op(op, [lhs, rhs], {})]
        return [imp.call(op, [imp.tensor(node.arg(0)), imp.tensor(node.arg(1))], node)]
    return convert


def _leaky_relu(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    return [imp.call("nn.leaky_relu", [imp.tensor(node.arg(0))], node,
                     alpha=float(node.attrs.get("alpha", 0.01)))]


def _sum(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    terms = [imp.tensor(name) for name in node.inputs if name]
    if not terms:
        raise NodeError("needs at least one input")
    total = terms[0]
    for term in terms[1:]:
        total = imp.call("add", [total, term], node)
    return [total]


def _cast(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Import-time constants, or a tensor already of the target type (a no-op)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"]))
    value = imp.value(node.arg(0))
    if isinstance(value, np.ndarray):
        return [value.astype(dtype)]
    if value.ty.dtype != str(dtype):
        raise NodeError(f"casting a computed {value.ty.dtype} tensor to {dtype} is not "
                         "supported; only import-time constants are cast")
    return [value]


CONVERTERS: dict[str, Converter] = {
    "Add": _binary("add"),
    "Cast": _cast,
    "Div": _binary("divide"),
    "LeakyRelu": _leaky_relu,
    "Mul": _binary("multiply"),
    "Relu": _unary("nn.relu"),
    "Sigmoid": _unary("sigmoid"),
    "Sub": _binary("subtract"),
    "Sum": _sum,
}

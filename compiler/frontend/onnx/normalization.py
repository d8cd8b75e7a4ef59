"""Reductions (ReduceMean / ReduceMax / ReduceSum..., global max pooling), softmax and
the normalizations (batch, instance, layer, LRN)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.frontend.onnx.importer import (
    Converter,
    Importer,
    NodeError,
    OnnxNode,
    Value,
    normalize_axis,
    reshaped,
)


def _batch_norm(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    if node.attrs.get("spatial", 1) != 1:
        raise NodeError("spatial=0 (per-activation statistics) is not supported")
    if node.attrs.get("training_mode", 0):
        raise NodeError("training_mode=1 is not supported; only inference")
    inputs = [imp.tensor(node.arg(i)) for i in range(5)]
    return [imp.call("nn.batch_norm", inputs, node, axis=1,
                     epsilon=float(node.attrs.get("epsilon", 1e-5)))]


def _softmax(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """From opset 13 one axis (default -1); before, the input is seen as 2-D, flattened
    at ``axis`` (default 1), and normalized over the whole second part."""
    data = imp.tensor(node.arg(0))
    if node.version >= 13:
        return [imp.call("nn.softmax", [data], node, axis=int(node.attrs.get("axis", -1)))]
    shape = data.ty.shape
    axis = normalize_axis(int(node.attrs.get("axis", 1)), len(shape))
    if axis == len(shape) - 1:
        return [imp.call("nn.softmax", [data], node, axis=-1)]
    flat = reshaped(imp, node, data, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))
    out = imp.call("nn.softmax", [flat], node, axis=-1)
    return [reshaped(imp, node, out, shape)]


def _lrn(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    if "size" not in node.attrs:
        raise NodeError("attribute 'size' is required")
    return [imp.call("nn.lrn", [imp.tensor(node.arg(0))], node, axis=1,
                     size=int(node.attrs["size"]), alpha=float(node.attrs.get("alpha", 1e-4)),
                     beta=float(node.attrs.get("beta", 0.75)),
                     bias=float(node.attrs.get("bias", 1.0)))]


CONVERTERS: dict[str, Converter] = {
    "BatchNormalization": _batch_norm,
    "LRN": _lrn,
    "Softmax": _softmax,
}

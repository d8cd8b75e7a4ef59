"""Reductions (ReduceMean / ReduceMax / ReduceSum, global max pooling), softmax and
log-softmax, and the normalizations (batch, instance, layer, LRN).

Instance and layer normalization, and batch normalization's per-activation form, are
decomposed at import into ``reduce`` and element-wise IR ops (two passes: the mean, then
the mean of squared deviations, as ONNX's reference computes them)."""

from __future__ import annotations

from collections.abc import Sequence

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
from compiler.ir import Node
from compiler.ir.ops import check_axis, evaluate_op

# ---------------------------------------------------------------- reductions

_REDUCE_KINDS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max"}
# the operator version from which the axes are an optional input, not an attribute
_AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18}


def _reduce(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Empty axes reduce every axis, or nothing with ``noop_with_empty_axes``."""
    data = imp.value(node.arg(0))
    ndim = len(shape_of(data))
    if node.version >= _AXES_INPUT_SINCE[node.op_type]:
        name = node.optional(1)
        axes = [int(a) for a in imp.array(name, "axes").ravel()] if name else []
    else:
        axes = list(node.ints("axes", ()))
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return [data]
        axes = list(range(ndim))
    attrs = {"kind": _REDUCE_KINDS[node.op_type],
             "axes": tuple(sorted({check_axis(a, ndim) for a in axes})),
             "keepdims": bool(node.attrs.get("keepdims", 1))}
    if isinstance(data, np.ndarray):
        return [evaluate_op("reduce", [data], attrs)]
    return [imp.call("reduce", [data], node, **attrs)]


def _global_max_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """The maximum over every spatial axis (any rank), kept as size-1 axes."""
    data = imp.tensor(node.arg(0))
    if data.ty.ndim < 3:
        raise NodeError(f"expects [N, C, spatial...] data, got {list(data.ty.shape)}")
    return [imp.call("reduce", [data], node, kind="max", axes=tuple(range(2, data.ty.ndim)),
                     keepdims=True)]


# ---------------------------------------------------------------- softmax


def _softmax(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """From opset 13 one axis (default -1); before, the input is seen as 2-D, flattened
    at ``axis`` (default 1), and normalized over the whole second part."""
    op = "nn.softmax" if node.op_type == "Softmax" else "nn.log_softmax"
    data = imp.tensor(node.arg(0))
    if node.version >= 13:
        return [imp.call(op, [data], node, axis=int(node.attrs.get("axis", -1)))]
    shape = data.ty.shape
    axis = check_axis(int(node.attrs.get("axis", 1)), len(shape))
    if axis == len(shape) - 1:
        return [imp.call(op, [data], node, axis=-1)]
    flat = reshaped(imp, node, data, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))
    out = imp.call(op, [flat], node, axis=-1)
    return [reshaped(imp, node, out, shape)]


# ---------------------------------------------------------------- normalizations


def _inv_std(imp: Importer, node: OnnxNode, var: Node, epsilon: float) -> Node:
    """``1 / sqrt(var + epsilon)``."""
    std = imp.call("sqrt", [imp.call("add", [var, imp.scalar(epsilon)], node)], node)
    return imp.call("divide", [imp.scalar(1.0), std], node)


def _moments(imp: Importer, node: OnnxNode, data: Node,
             axes: tuple[int, ...]) -> tuple[Node, Node, Node]:
    """(mean, data - mean, variance) over ``axes``, the statistics kept as size-1 axes."""
    mean = imp.call("reduce", [data], node, kind="mean", axes=axes, keepdims=True)
    centered = imp.call("subtract", [data, mean], node)
    square = imp.call("multiply", [centered, centered], node)
    var = imp.call("reduce", [square], node, kind="mean", axes=axes, keepdims=True)
    return mean, centered, var


def _affine(imp: Importer, node: OnnxNode, normalized: Node, scale: Value,
            bias: Value | None, shape: Sequence[int] | None = None) -> Node:
    """``normalized * scale + bias``, the parameters reshaped to ``shape`` (when given)
    to broadcast."""
    if shape is not None:
        scale, bias = (v if v is None else reshaped(imp, node, v, shape) for v in (scale, bias))
    out = imp.call("multiply", [normalized, imp.node(scale, node.arg(1))], node)
    if bias is None:
        return out
    bias_node = imp.node(bias, node.arg(2))
    return imp.call("add", [out, bias_node], node)


def _batch_norm(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Inference only. Version 7's ``spatial=0`` (statistics per activation, shaped like
    one sample) is decomposed into element-wise ops."""
    if node.attrs.get("training_mode", 0):
        raise NodeError("training_mode=1 (batch statistics, running mean/var outputs) is "
                        "not supported; only inference (training_mode=0)")
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    if node.attrs.get("spatial", 1):
        inputs = [imp.tensor(node.arg(i)) for i in range(5)]
        return [imp.call("nn.batch_norm", inputs, node, axis=1, epsilon=epsilon)]
    data = imp.tensor(node.arg(0))
    scale, bias, mean, var = (imp.tensor(node.arg(i)) for i in range(1, 5))
    for t in (scale, bias, mean, var):
        if t.ty.shape != data.ty.shape[1:]:
            raise NodeError(f"spatial=0 needs scale, B, mean and var shaped like one "
                            f"sample {list(data.ty.shape[1:])}, got {list(t.ty.shape)}")
    centered = imp.call("subtract", [data, mean], node)
    normalized = imp.call("multiply", [centered, _inv_std(imp, node, var, epsilon)], node)
    return [_affine(imp, node, normalized, scale, bias)]


def _instance_norm(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Per sample and channel over the spatial axes; scale and B are per channel."""
    data = imp.tensor(node.arg(0))
    ndim = data.ty.ndim
    if ndim < 3:
        raise NodeError(f"expects [N, C, spatial...] data, got {list(data.ty.shape)}")
    _, centered, var = _moments(imp, node, data, tuple(range(2, ndim)))
    inv_std = _inv_std(imp, node, var, float(node.attrs.get("epsilon", 1e-5)))
    normalized = imp.call("multiply", [centered, inv_std], node)
    per_channel = (data.ty.shape[1],) + (1,) * (ndim - 2)
    return [_affine(imp, node, normalized, imp.value(node.arg(1)), imp.value(node.arg(2)),
                    per_channel)]


def _layer_norm(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Over the axes from ``axis`` on; outputs Y, Mean and InvStdDev (statistics with
    the normalized axes kept as 1s). Statistics in float32 (stash_type 1) only."""
    if int(node.attrs.get("stash_type", 1)) != 1:
        raise NodeError(f"stash_type={node.attrs['stash_type']} is not supported; only 1 "
                        "(float32 statistics)")
    data = imp.tensor(node.arg(0))
    ndim = data.ty.ndim
    axis = check_axis(int(node.attrs.get("axis", -1)), ndim)
    mean, centered, var = _moments(imp, node, data, tuple(range(axis, ndim)))
    inv_std = _inv_std(imp, node, var, float(node.attrs.get("epsilon", 1e-5)))
    normalized = imp.call("multiply", [centered, inv_std], node)
    bias = node.optional(2)
    y = _affine(imp, node, normalized, imp.value(node.arg(1)),
                imp.value(bias) if bias else None)
    return [y, mean, inv_std]


def _lrn(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    if "size" not in node.attrs:
        raise NodeError("attribute 'size' is required")
    return [imp.call("nn.lrn", [imp.tensor(node.arg(0))], node, axis=1,
                     size=int(node.attrs["size"]), alpha=float(node.attrs.get("alpha", 1e-4)),
                     beta=float(node.attrs.get("beta", 0.75)),
                     bias=float(node.attrs.get("bias", 1.0)))]


CONVERTERS: dict[str, Converter] = {
    "BatchNormalization": _batch_norm,
    "GlobalMaxPool": _global_max_pool,
    "InstanceNormalization": _instance_norm,
    "LRN": _lrn,
    "LayerNormalization": _layer_norm,
    "LogSoftmax": _softmax,
    "ReduceMax": _reduce,
    "ReduceMean": _reduce,
    "ReduceSum": _reduce,
    "Softmax": _softmax,
}

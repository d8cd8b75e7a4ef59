"""Neural-network operators: convolution, pooling, normalization, Gemm / MatMul,
dropout."""

from __future__ import annotations

from collections.abc import Sequence
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
    transposed,
)
from compiler.ir import Node


def _spatial(node: OnnxNode, key: str) -> tuple[int, int]:
    value = node.ints(key, (1, 1))
    if len(value) != 2:
        raise NodeError(f"{key} {list(value)} is not 2-D; only 2-D windows are supported")
    return value[0], value[1]


def _check_nchw(data: Node) -> None:
    if data.ty.ndim != 4:
        raise NodeError(f"only 2-D (NCHW) inputs are supported, got shape {list(data.ty.shape)}")


def _padding(node: OnnxNode, size: tuple[int, ...], kernel: tuple[int, ...],
             strides: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads`` or ``auto_pad``; ONNX's pads order is the
    IR's: all begins, then all ends."""
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = node.ints("pads", (0, 0, 0, 0))
        if len(pads) != 4 or min(pads) < 0:
            raise NodeError(f"pads {list(pads)} must be 4 non-negative values")
        return pads[0], pads[1], pads[2], pads[3]
    if auto_pad == "VALID":
        return 0, 0, 0, 0
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise NodeError(f"auto_pad {auto_pad!r} is not supported")
    begin, end = [], []
    for n, k, s, d in zip(size, kernel, strides, dilation):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin[0], begin[1], end[0], end[1]


def _conv(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    data, weight = imp.tensor(node.arg(0)), imp.tensor(node.arg(1))
    _check_nchw(data)
    kernel = weight.ty.shape[2:]
    if "kernel_shape" in node.attrs and node.ints("kernel_shape") != kernel:
        raise NodeError(f"kernel_shape {node.attrs['kernel_shape']} does not match the "
                         f"weight's {list(weight.ty.shape)}")
    strides, dilation = _spatial(node, "strides"), _spatial(node, "dilations")
    out = imp.call("nn.conv2d", [data, weight], node, strides=strides,
                   padding=_padding(node, data.ty.shape[2:], kernel, strides, dilation),
                   dilation=dilation, groups=int(node.attrs.get("group", 1)))
    bias = node.optional(2)
    if bias is not None:
        out = imp.call("nn.bias_add", [out, imp.tensor(bias)], node, axis=1)
    return [out]


def _pool_attrs(node: OnnxNode, data: Node) -> dict[str, Any]:
    _check_nchw(data)
    kernel = node.ints("kernel_shape")
    if len(kernel) != 2:
        raise NodeError(f"kernel_shape {list(kernel)} is not 2-D")
    strides, dilation = _spatial(node, "strides"), _spatial(node, "dilations")
    return dict(pool_size=kernel, strides=strides, dilation=dilation,
                padding=_padding(node, data.ty.shape[2:], kernel, strides, dilation),
                ceil_mode=bool(node.attrs.get("ceil_mode", 0)))


def _max_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    if node.attrs.get("storage_order", 0) != 0:
        raise NodeError("storage_order=1 (column-major indices) is not supported")
    data = imp.tensor(node.arg(0))
    return [imp.call("nn.max_pool2d", [data], node, **_pool_attrs(node, data))]


def _avg_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    data = imp.tensor(node.arg(0))
    return [imp.call("nn.avg_pool2d", [data], node, **_pool_attrs(node, data),
                     count_include_pad=bool(node.attrs.get("count_include_pad", 0)))]


def _global_avg_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    data = imp.tensor(node.arg(0))
    _check_nchw(data)
    return [imp.call("nn.global_avg_pool2d", [data], node)]




def _gemm(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """alpha * A' B' + beta * C as dense (weight [N, K] = B'^T) plus scale and bias."""
    a, b = imp.value(node.arg(0)), imp.value(node.arg(1))
    if len(shape_of(a)) != 2 or len(shape_of(b)) != 2:
        raise NodeError(f"A and B must be matrices, got {list(shape_of(a))} and {list(shape_of(b))}")
    data = (transposed(imp, node, a, node.arg(0)) if node.attrs.get("transA", 0)
            else imp.tensor(node.arg(0)))
    weight = (imp.tensor(node.arg(1)) if node.attrs.get("transB", 0)
              else transposed(imp, node, b, node.arg(1)))
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
    if shape_of(bias) in ((units,), (1, units)):
        bias = reshaped(imp, node, bias, (units,))
        return [imp.call("nn.bias_add", [out, imp.node(bias, c_name)], node, axis=1)]
    return [imp.call("add", [out, imp.node(bias, c_name)], node)]


def _matmul(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """A [..., K] x B [K, N] as a dense on A viewed as a matrix."""
    a, b = imp.value(node.arg(0)), imp.value(node.arg(1))
    a_shape, b_shape = shape_of(a), shape_of(b)
    if len(b_shape) != 2 or len(a_shape) < 2:
        raise NodeError(f"only an N-D (N >= 2) by 2-D product is supported, got "
                         f"{list(a_shape)} x {list(b_shape)}")
    weight = transposed(imp, node, b, node.arg(1))
    rows = int(np.prod(a_shape[:-1]))
    data = imp.node(reshaped(imp, node, a, (rows, a_shape[-1])), node.arg(0))
    out = imp.call("nn.dense", [data, weight], node)
    return [reshaped(imp, node, out, a_shape[:-1] + (b_shape[1],))]



def _dropout(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Inference: the identity, whatever the ratio; the mask output is not supported."""
    training = node.optional(2) if node.version >= 12 else None
    if training is not None and imp.array(training, "training_mode").reshape(-1).any():
        raise NodeError("training_mode=True is not supported; only inference")
    return [imp.value(node.arg(0))]







CONVERTERS: dict[str, Converter] = {
    "AveragePool": _avg_pool,
    "Conv": _conv,
    "Dropout": _dropout,
    "Gemm": _gemm,
    "GlobalAveragePool": _global_avg_pool,
    "MatMul": _matmul,
    "MaxPool": _max_pool,
}

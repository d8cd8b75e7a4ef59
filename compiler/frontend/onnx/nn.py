"""Neural-network operators: convolution (plain and transposed), pooling, Gemm / MatMul,
dropout.

Windowed ops take 1-D inputs as 2-D ones with H = 1 (a reshape on each side, which
costs nothing: reshapes alias), 2-D natively, and 3-D where an IR op has that rank
(pooling, transposed convolution)."""

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


def _spatial(node: OnnxNode, key: str, rank: int) -> tuple[int, ...]:
    value = node.ints(key, (1,) * rank)
    if len(value) != rank:
        raise NodeError(f"{key} {list(value)} does not have {rank} values, one per spatial dim")
    return value


def _rank(data: Node, ranks: tuple[int, ...]) -> int:
    """The number of spatial dims of ``data`` [n, c, *spatial], if one of ``ranks``."""
    rank = data.ty.ndim - 2
    if rank not in ranks:
        names = ", ".join(f"{r}-D" for r in ranks)
        raise NodeError(f"{rank}-D input {list(data.ty.shape)} is not supported; only "
                        f"{names} (shape [n, c, *spatial])")
    return rank


def _same_padding(auto_pad: str, total: Sequence[int]) -> tuple[int, ...]:
    """Begins then ends splitting each dim's ``total`` padding; the odd one goes at the end
    for SAME_UPPER, at the beginning for SAME_LOWER."""
    small = [t // 2 for t in total]
    large = [t - t // 2 for t in total]
    return tuple(small + large) if auto_pad == "SAME_UPPER" else tuple(large + small)


def _padding(node: OnnxNode, size: tuple[int, ...], kernel: tuple[int, ...],
             strides: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    """All begins, then all ends (ONNX's pads order is the IR's), from ``pads`` or
    ``auto_pad``."""
    rank = len(size)
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = node.ints("pads", (0,) * (2 * rank))
        if len(pads) != 2 * rank or min(pads) < 0:
            raise NodeError(f"pads {list(pads)} must be {2 * rank} non-negative values")
        return pads
    if auto_pad == "VALID":
        return (0,) * (2 * rank)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise NodeError(f"auto_pad {auto_pad!r} is not supported")
    return _same_padding(auto_pad, [max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
                                    for n, k, s, d in zip(size, kernel, strides, dilation)])


def _as_2d(imp: Importer, node: OnnxNode, value: Node, attrs: dict[str, Any]
           ) -> tuple[Node, dict[str, Any]]:
    """A 1-D windowed op's input [n, c, w] as [n, c, 1, w], its attributes lifted to 2-D
    (a window of height 1; per-dim tuples get 1 or 0 in front, padding (0, b, 0, e))."""
    shape = value.ty.shape
    lifted = {}
    for key, v in attrs.items():
        if key == "padding":
            lifted[key] = (0, v[0], 0, v[1])
        elif isinstance(v, tuple):
            lifted[key] = (0 if key == "output_padding" else 1, *v)
        else:
            lifted[key] = v
    data = reshaped(imp, node, value, (*shape[:2], 1, *shape[2:]))
    assert isinstance(data, Node)
    return data, lifted


def _windowed(imp: Importer, node: OnnxNode, op: str, inputs: list[Node],
              attrs: dict[str, Any], rank: int) -> Node:
    """``op`` ("nn.conv" -> nn.conv2d, "nn.max_pool" -> nn.max_pool2d...) at the input's
    rank; 1-D through 2-D."""
    if rank != 1:
        return imp.call(op.replace("{rank}", str(rank)), inputs, node, **attrs)
    data, lifted = _as_2d(imp, node, inputs[0], attrs)
    rest = [_as_2d(imp, node, x, {})[0] for x in inputs[1:]]  # weights: [o, i, 1, k]
    out = imp.call(op.replace("{rank}", "2"), [data, *rest], node, **lifted)
    shape = out.ty.shape
    result = reshaped(imp, node, out, (*shape[:2], shape[3]))
    assert isinstance(result, Node)
    return result


def _with_bias(imp: Importer, node: OnnxNode, out: Node) -> list[Value]:
    bias = node.optional(2)
    if bias is not None:
        out = imp.call("nn.bias_add", [out, imp.tensor(bias)], node, axis=1)
    return [out]


def _kernel_shape(node: OnnxNode, weight: Node) -> tuple[int, ...]:
    kernel = weight.ty.shape[2:]
    if "kernel_shape" in node.attrs and node.ints("kernel_shape") != kernel:
        raise NodeError(f"kernel_shape {node.attrs['kernel_shape']} does not match the "
                        f"weight's {list(weight.ty.shape)}")
    return kernel


def _conv(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    data, weight = imp.tensor(node.arg(0)), imp.tensor(node.arg(1))
    rank = _rank(data, (1, 2))
    if weight.ty.ndim != data.ty.ndim:
        raise NodeError(f"weight {list(weight.ty.shape)} and data {list(data.ty.shape)} "
                        "differ in rank")
    kernel = _kernel_shape(node, weight)
    strides, dilation = _spatial(node, "strides", rank), _spatial(node, "dilations", rank)
    attrs = dict(strides=strides, dilation=dilation, groups=int(node.attrs.get("group", 1)),
                 padding=_padding(node, data.ty.shape[2:], kernel, strides, dilation))
    return _with_bias(imp, node, _windowed(imp, node, "nn.conv{rank}d", [data, weight],
                                           attrs, rank))


def _conv_transpose(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Pads from ``pads``, or from ``output_shape`` / SAME auto_pad (ONNX's equations:
    they can come out negative, which extends the output with zeros)."""
    data, weight = imp.tensor(node.arg(0)), imp.tensor(node.arg(1))
    rank = _rank(data, (1, 2, 3))
    if weight.ty.ndim != data.ty.ndim:
        raise NodeError(f"weight {list(weight.ty.shape)} and data {list(data.ty.shape)} "
                        "differ in rank")
    kernel = _kernel_shape(node, weight)
    strides, dilation = _spatial(node, "strides", rank), _spatial(node, "dilations", rank)
    extra = node.ints("output_padding", (0,) * rank)
    if len(extra) != rank:
        raise NodeError(f"output_padding {list(extra)} does not have {rank} values")
    size = data.ty.shape[2:]
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise NodeError(f"auto_pad {auto_pad!r} is not supported")
    wanted = node.ints("output_shape", ()) or None
    if wanted is not None and len(wanted) == rank + 2:
        wanted = wanted[2:]  # some exporters include the batch and channel dims
    if wanted is None and auto_pad.startswith("SAME"):
        wanted = tuple(n * s for n, s in zip(size, strides))
    if wanted is not None:
        if len(wanted) != rank:
            raise NodeError(f"output_shape {list(wanted)} does not have {rank} values")
        total = [s * (n - 1) + e + (k - 1) * d + 1 - o for n, k, s, d, e, o
                 in zip(size, kernel, strides, dilation, extra, wanted)]
        padding = _same_padding("SAME_UPPER" if auto_pad == "SAME_UPPER" else "SAME_LOWER",
                                total)
    elif auto_pad == "VALID":
        padding = (0,) * (2 * rank)
    else:
        padding = node.ints("pads", (0,) * (2 * rank))
        if len(padding) != 2 * rank:
            raise NodeError(f"pads {list(padding)} must be {2 * rank} values")
    attrs = dict(strides=strides, dilation=dilation, groups=int(node.attrs.get("group", 1)),
                 padding=padding, output_padding=extra)
    return _with_bias(imp, node, _windowed(imp, node, "nn.conv{rank}d_transpose",
                                           [data, weight], attrs, rank))


def _pool(imp: Importer, node: OnnxNode, op: str, **extra: Any) -> Node:
    data = imp.tensor(node.arg(0))
    rank = _rank(data, (1, 2, 3))
    kernel = node.ints("kernel_shape")
    if len(kernel) != rank:
        raise NodeError(f"kernel_shape {list(kernel)} does not have {rank} values")
    strides, dilation = _spatial(node, "strides", rank), _spatial(node, "dilations", rank)
    attrs = dict(pool_size=kernel, strides=strides, dilation=dilation,
                 padding=_padding(node, data.ty.shape[2:], kernel, strides, dilation),
                 ceil_mode=bool(node.attrs.get("ceil_mode", 0)), **extra)
    return _windowed(imp, node, op, [data], attrs, rank)


def _max_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """The Indices output is not supported (the importer refuses it when it is used)."""
    if node.attrs.get("storage_order", 0) != 0:
        raise NodeError("storage_order=1 (column-major indices) is not supported")
    return [_pool(imp, node, "nn.max_pool{rank}d")]


def _avg_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    return [_pool(imp, node, "nn.avg_pool{rank}d",
                  count_include_pad=bool(node.attrs.get("count_include_pad", 0)))]


def _global_avg_pool(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Any rank >= 3: the spatial dims flattened into one plane of a 2-D global pool."""
    data = imp.tensor(node.arg(0))
    shape = data.ty.shape
    if len(shape) < 3:
        raise NodeError(f"expects [n, c, *spatial] with a spatial dim, got {list(shape)}")
    plane = reshaped(imp, node, data, (*shape[:2], int(np.prod(shape[2:])), 1))
    assert isinstance(plane, Node)
    out = imp.call("nn.global_avg_pool2d", [plane], node)
    return [reshaped(imp, node, out, (*shape[:2], *(1,) * (len(shape) - 2)))]


def _gemm(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """alpha * A' B' + beta * C as dense (weight [N, K] = B'^T) plus scale and bias."""
    a, b = imp.value(node.arg(0)), imp.value(node.arg(1))
    if len(shape_of(a)) != 2 or len(shape_of(b)) != 2:
        raise NodeError(f"A and B must be matrices, got {list(shape_of(a))} and "
                        f"{list(shape_of(b))}")
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
        bias = (np.asarray(bias * np.float32(beta), dtype=bias.dtype)
                if isinstance(bias, np.ndarray)
                else imp.call("multiply", [bias, imp.scalar(beta)], node))
    units = out.ty.shape[1]
    if shape_of(bias) in ((units,), (1, units)):
        bias = reshaped(imp, node, bias, (units,))
        return [imp.call("nn.bias_add", [out, imp.node(bias, c_name)], node, axis=1)]
    return [imp.call("add", [out, imp.node(bias, c_name)], node)]


def _matmul(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """numpy's matmul. B a matrix (or a vector: a one-row weight) runs the tunable dense
    on A viewed as a matrix; B with batch dims runs ``nn.batch_matmul``. A 1-D A is a
    one-row matrix; the dims 1-D operands add are dropped from the result."""
    a, b = imp.value(node.arg(0)), imp.value(node.arg(1))
    a_shape, b_shape = shape_of(a), shape_of(b)
    if not a_shape or not b_shape:
        raise NodeError(f"operands must have at least one dim, got {list(a_shape)} x "
                        f"{list(b_shape)}")
    k = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if a_shape[-1] != k:
        raise NodeError(f"{list(a_shape)} x {list(b_shape)}: inner dims {a_shape[-1]} and "
                        f"{k} differ")
    # the result's shape, as numpy gives it
    if len(b_shape) <= 2:
        result = a_shape[:-1] + b_shape[1:]
        rows = int(np.prod(a_shape[:-1]))
        data = imp.node(reshaped(imp, node, a, (rows, k)), node.arg(0))
        weight = (imp.node(reshaped(imp, node, b, (1, k)), node.arg(1)) if len(b_shape) == 1
                  else transposed(imp, node, b, node.arg(1)))
        out = imp.call("nn.dense", [data, weight], node)
        return [reshaped(imp, node, out, result)]
    lhs = imp.node(reshaped(imp, node, a, (1, k)), node.arg(0)) if len(a_shape) == 1 \
        else imp.tensor(node.arg(0))
    out = imp.call("nn.batch_matmul", [lhs, imp.tensor(node.arg(1))], node)
    shape = out.ty.shape
    return [reshaped(imp, node, out, shape[:-2] + shape[-1:]) if len(a_shape) == 1 else out]


def _dropout(imp: Importer, node: OnnxNode) -> Sequence[Value]:
    """Inference: the identity whatever the ratio, and a mask of all true (before version
    10: all ones of the data's type). Training mode is only accepted with ratio 0, where
    it is the identity too."""
    data = imp.value(node.arg(0))
    training = node.optional(2) if node.version >= 12 else None
    if training is not None and imp.array(training, "training_mode").reshape(-1).any():
        ratio_name = node.optional(1)
        ratio = (float(imp.array(ratio_name, "ratio").reshape(-1)[0])
                 if ratio_name is not None else 0.5)
        if ratio != 0.0:
            raise NodeError(f"training_mode=True with ratio {ratio} is not supported; only "
                            "inference (or ratio 0)")
    mask_dtype = np.bool_ if node.version >= 10 else np.float32
    return [data, np.ones(shape_of(data), dtype=mask_dtype)]


CONVERTERS: dict[str, Converter] = {
    "AveragePool": _avg_pool,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Dropout": _dropout,
    "Gemm": _gemm,
    "GlobalAveragePool": _global_avg_pool,
    "MatMul": _matmul,
    "MaxPool": _max_pool,
}

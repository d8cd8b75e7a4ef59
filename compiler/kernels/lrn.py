"""Local response normalisation across ``axis`` (ONNX/Caffe's across-channel LRN): one
work-item per element sums the squares of its channel neighbours."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import around_axis, c_float, per_item
from compiler.templates.base import Kernel


def lrn(node: Node) -> Kernel:
    """Window: ``(size - 1) // 2`` channels below, ``size // 2`` above, clipped."""
    shape = node.ty.shape
    _, channels, inner = around_axis(shape, node.attrs["axis"] % len(shape))
    size = node.attrs["size"]
    lo, hi = (size - 1) // 2, size // 2
    body = [
        f"const int ch = (i / {inner}) % {channels};",
        f"const int first = max(ch - {lo}, 0), last = min(ch + {hi}, {channels - 1});",
        f"const GLOBAL float* at = data + i - ch * {inner};",
        "float sq = 0.0f;",
        "for (int k = first; k <= last; ++k) {",
        f"  const float v = at[k * {inner}];",
        "  sq += v * v;",
        "}",
        f"const float scale = {c_float(node.attrs['bias'])} + "
        f"{c_float(node.attrs['alpha'] / size)} * sq;",
        f"out[i] = data[i] / pow(scale, {c_float(node.attrs['beta'])});",
    ]
    return per_item(node, ("data",), node.ty.size, body)


KERNELS: dict[str, Callable[[Node], Kernel]] = {"nn.lrn": lrn}

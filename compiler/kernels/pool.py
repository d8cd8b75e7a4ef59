"""Pooling: one work-item per output element walks its (dilated) window; global
average pooling: one work-item per (n, c) plane."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import c_float, per_item
from compiler.templates.base import Kernel


def _window(node: Node) -> tuple[list[str], str, str]:
    """Lines locating the output element's window, and the C loops' row/column offsets."""
    _, _, h, w = node.inputs[0].ty.shape
    _, _, oh, ow = node.ty.shape
    (sh, sw), (dh, dw) = node.attrs["strides"], node.attrs["dilation"]
    pt, pl, _, _ = node.attrs["padding"]
    head = [
        f"const int ox = i % {ow}, oy = (i / {ow}) % {oh}, plane = i / {ow * oh};",
        f"const GLOBAL float* src = data + plane * {h * w};",
    ]
    return head, f"oy * {sh} - {pt} + ky * {dh}", f"ox * {sw} - {pl} + kx * {dw}"


def max_pool(node: Node) -> Kernel:
    """Padding never wins (it is -inf, as in the IR); a NaN in the window propagates."""
    _, _, h, w = node.inputs[0].ty.shape
    kh, kw = node.attrs["pool_size"]
    head, row, col = _window(node)
    body = [
        *head,
        f"float acc = {c_float(float('-inf'))};",
        f"for (int ky = 0; ky < {kh}; ++ky) {{",
        f"  const int iy = {row};",
        f"  if (iy < 0 || iy >= {h}) continue;",
        f"  for (int kx = 0; kx < {kw}; ++kx) {{",
        f"    const int ix = {col};",
        f"    if (ix < 0 || ix >= {w}) continue;",
        f"    const float v = src[iy * {w} + ix];",
        "    acc = (v > acc || v != v) ? v : acc;",
        "  }",
        "}",
        "out[i] = acc;",
    ]
    return per_item(node, ("data",), node.ty.size, body)


def avg_pool(node: Node) -> Kernel:
    """The divisor counts window taps inside the input, or (count_include_pad) inside the
    declared padding too, but never the ceil-mode overhang past it."""
    _, _, h, w = node.inputs[0].ty.shape
    kh, kw = node.attrs["pool_size"]
    pt, pl, pb, pr = node.attrs["padding"]
    if node.attrs["count_include_pad"]:
        (y_lo, y_hi), (x_lo, x_hi) = (-pt, h + pb), (-pl, w + pr)
    else:
        (y_lo, y_hi), (x_lo, x_hi) = (0, h), (0, w)
    head, row, col = _window(node)
    body = [
        *head,
        "int rows = 0, cols = 0;",
        f"for (int ky = 0; ky < {kh}; ++ky) {{ const int iy = {row};"
        f" rows += iy >= {y_lo} && iy < {y_hi}; }}",
        f"for (int kx = 0; kx < {kw}; ++kx) {{ const int ix = {col};"
        f" cols += ix >= {x_lo} && ix < {x_hi}; }}",
        "float sum = 0.0f;",
        f"for (int ky = 0; ky < {kh}; ++ky) {{",
        f"  const int iy = {row};",
        f"  if (iy < 0 || iy >= {h}) continue;",
        f"  for (int kx = 0; kx < {kw}; ++kx) {{",
        f"    const int ix = {col};",
        f"    if (ix >= 0 && ix < {w}) sum += src[iy * {w} + ix];",
        "  }",
        "}",
        "out[i] = sum / (float)(rows * cols);",
    ]
    return per_item(node, ("data",), node.ty.size, body)


def global_avg_pool(node: Node) -> Kernel:
    n, c, h, w = node.inputs[0].ty.shape
    body = [
        f"const GLOBAL float* src = data + i * {h * w};",
        "float sum = 0.0f;",
        f"for (int k = 0; k < {h * w}; ++k) sum += src[k];",
        f"out[i] = sum / {c_float(h * w)};",
    ]
    return per_item(node, ("data",), n * c, body, block=64)


KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "nn.max_pool2d": max_pool,
    "nn.avg_pool2d": avg_pool,
    "nn.global_avg_pool2d": global_avg_pool,
}

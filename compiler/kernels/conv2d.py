"""A direct conv2d (NCHW data, OIHW weight, any groups: depthwise too) for the layers no
template covers (grouped and depthwise), epilogue fused: one work-item per output
element, neighbouring work-items along the output row so their loads coalesce."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import epilogue_of, per_item
from compiler.templates.base import Kernel


def conv2d(node: Node) -> Kernel:
    _, c, h, w = node.inputs[0].ty.shape
    _, cig, kh, kw = node.inputs[1].ty.shape
    _, co, oh, ow = node.ty.shape
    (sh, sw), (dh, dw) = node.attrs["strides"], node.attrs["dilation"]
    pt, pl, _, _ = node.attrs["padding"]
    cog = co // node.attrs["groups"]
    epilogue, extra = epilogue_of(node)
    body = [
        f"const int ox = i % {ow}, oy = (i / {ow}) % {oh};",
        f"const int f = (i / {ow * oh}) % {co}, n = i / {ow * oh * co};",
        f"const GLOBAL float* src = data + (n * {c} + (f / {cog}) * {cig}) * {h * w};",
        f"const GLOBAL float* ker = weight + f * {cig * kh * kw};",
        "float acc = 0.0f;",
        f"for (int rc = 0; rc < {cig}; ++rc) {{",
        f"  for (int ky = 0; ky < {kh}; ++ky) {{",
        f"    const int iy = oy * {sh} - {pt} + ky * {dh};",
        f"    if (iy < 0 || iy >= {h}) continue;",
        f"    for (int kx = 0; kx < {kw}; ++kx) {{",
        f"      const int ix = ox * {sw} - {pl} + kx * {dw};",
        f"      if (ix >= 0 && ix < {w})",
        f"        acc += src[(rc * {h} + iy) * {w} + ix] * ker[(rc * {kh} + ky) * {kw} + kx];",
        "    }",
        "  }",
        "}",
        f"out[i] = {epilogue.c_expr('acc', 'bias[f]', 'residual[i]')};",
    ]
    return per_item(node, ("data", "weight", *extra), node.ty.size, body)


KERNELS: dict[str, Callable[[Node], Kernel]] = {"nn.conv2d": conv2d, "fused.conv2d": conv2d}

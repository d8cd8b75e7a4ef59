"""Batched matrix products and transposed convolution (plain kernels): one work-item per
output element."""

from __future__ import annotations

import math
from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import linear, per_item, strides, unravel
from compiler.templates.base import Kernel


def batch_matmul(node: Node) -> Kernel:
    """out[..., m, n] = sum_k a[..., m, k] * b[..., k, n]; a batch dim of size 1 (or
    missing) in an operand is broadcast."""
    a, b = node.inputs[0].ty.shape, node.inputs[1].ty.shape
    out = node.ty.shape
    rank = len(out)
    k_size, n_size = a[-1], b[-1]
    batch = [f"c{d}" for d in range(rank - 2)]

    def base(shape: tuple[int, ...]) -> str:
        aligned = (1,) * (rank - len(shape)) + shape[:-2]
        return f"({linear(batch, aligned)}) * {shape[-2] * shape[-1]}"

    body = [
        *unravel("i", out),
        f"const GLOBAL float* pa = a + {base(a)} + c{rank - 2} * {k_size};",
        f"const GLOBAL float* pb = b + {base(b)} + c{rank - 1};",
        "float acc = 0.0f;",
        f"for (int k = 0; k < {k_size}; ++k) acc += pa[k] * pb[k * {n_size}];",
        "out[i] = acc;",
    ]
    return per_item(node, ("a", "b"), node.ty.size, body)


def conv_transpose(node: Node) -> Kernel:
    """Gathers, for each output position, the input positions whose kernel taps reach it:
    u = out + pad_begin - tap * dilation must be a stride multiple inside the input."""
    data, weight = node.inputs[0].ty.shape, node.inputs[1].ty.shape
    out = node.ty.shape
    rank = len(out) - 2
    groups = node.attrs["groups"]
    st, dil, pad = node.attrs["strides"], node.attrs["dilation"], node.attrs["padding"]
    cg, og = data[1] // groups, weight[1]
    spatial, kernel = data[2:], weight[2:]
    x_off = " + ".join(f"x{d} * {s}" for d, s in enumerate(strides(spatial)))
    t_off = " + ".join(f"t{d} * {s}" for d, s in enumerate(strides(kernel)))
    inner = [f"acc += src[rc * {math.prod(spatial)} + {x_off}]"
             f" * ker[rc * {og * math.prod(kernel)} + {t_off}];"]
    for d in reversed(range(rank)):
        inner = [f"for (int t{d} = 0; t{d} < {kernel[d]}; ++t{d}) {{",
                 f"  const int u{d} = c{d + 2} + {pad[d]} - t{d} * {dil[d]};",
                 f"  if (u{d} < 0 || u{d} % {st[d]} != 0) continue;",
                 f"  const int x{d} = u{d} / {st[d]};",
                 f"  if (x{d} >= {spatial[d]}) continue;",
                 *["  " + line for line in inner], "}"]
    body = [
        *unravel("i", out),
        f"const int g = c1 / {og};",
        f"const GLOBAL float* src = data + (c0 * {data[1]} + g * {cg}) * {math.prod(spatial)};",
        f"const GLOBAL float* ker = weight + (g * {cg} * {og} + c1 % {og}) * "
        f"{math.prod(kernel)};",
        "float acc = 0.0f;",
        f"for (int rc = 0; rc < {cg}; ++rc) {{",
        *["  " + line for line in inner],
        "}",
        "out[i] = acc;",
    ]
    return per_item(node, ("data", "weight"), node.ty.size, body)


KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "nn.batch_matmul": batch_matmul,
    "nn.conv2d_transpose": conv_transpose,
    "nn.conv3d_transpose": conv_transpose,
}

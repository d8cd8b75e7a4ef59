"""Pooling: one work-item per output element walks its (dilated) window, for any number
of spatial dims (2-D and 3-D ops); global average pooling: one work-item per (n, c)
plane.

A 2-D window of up to ``MAX_UNROLLED_TAPS`` taps is written out tap by tap with no
branch: a tap outside the input reads a clamped address and is masked (max: -inf, sum:
0), and the bounds are tested only on the sides where the padding can reach. Work-items
then run the same instructions, which a CPU driver (PoCL) vectorises across them; the
loop with ``continue`` it replaces ran 6x slower than onnxruntime on ResNet-50's stem
pool (bench/pool.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import NoKernelError, c_float, describe, per_item, strides
from compiler.templates.base import Kernel, Prologue, blocked_shape


def _window(node: Node) -> tuple[list[str], list[str], str]:
    """Lines locating the output element's window (``o{d}``: its output coordinates,
    ``src``: its plane), each spatial dim's C input coordinate over tap ``k{d}``, and the
    offset of input position ``x0 .. x{r-1}`` in the plane."""
    spatial = node.inputs[0].ty.shape[2:]
    out = node.ty.shape[2:]
    rank = len(spatial)
    st, dil, pad = node.attrs["strides"], node.attrs["dilation"], node.attrs["padding"]
    head = [f"const int o{d} = ({f'i / {s}' if s != 1 else 'i'}) % {out[d]};"
            for d, s in enumerate(strides(out))]
    head += [f"const GLOBAL float* src = data + (i / {math.prod(out)}) * {math.prod(spatial)};"]
    coords = [f"o{d} * {st[d]} - {pad[d]} + k{d} * {dil[d]}" for d in range(rank)]
    offset = " + ".join(f"x{d} * {s}" if s != 1 else f"x{d}"
                        for d, s in enumerate(strides(spatial)))
    return head, coords, offset


def _nest(node: Node, inner: list[str]) -> list[str]:
    """``inner`` inside one loop per spatial dim over the window's taps inside the input
    (``x{d}``: the input coordinate)."""
    spatial = node.inputs[0].ty.shape[2:]
    kernel = node.attrs["pool_size"]
    _, coords, _ = _window(node)
    lines = list(inner)
    for d in reversed(range(len(spatial))):
        lines = [f"for (int k{d} = 0; k{d} < {kernel[d]}; ++k{d}) {{",
                 f"  const int x{d} = {coords[d]};",
                 f"  if (x{d} < 0 || x{d} >= {spatial[d]}) continue;",
                 *["  " + line for line in lines], "}"]
    return lines


MAX_UNROLLED_TAPS = 64


def _unrolled(node: Node) -> bool:
    return len(node.attrs["pool_size"]) == 2 and math.prod(node.attrs["pool_size"]) <= \
        MAX_UNROLLED_TAPS


def _taps(node: Node, masked: str, combine: str, block: int = 0,
          prologue: Prologue = Prologue()) -> list[str]:
    """Straight-line code over a 2-D window: per tap, ``v`` is the input value (through
    ``prologue``, NCHW only), or ``masked`` where the tap falls outside the input, then
    ``combine`` (a statement reading ``v``), in a block of its own. The output element
    comes from ``i``: in NCHW, or with ``block`` in NCHW[block]c, input and output (the
    channels of one pixel consecutive work-items, so their loads are contiguous)."""
    (h, w), (oh_n, ow_n) = node.inputs[0].ty.shape[2:], node.ty.shape[2:]
    (kh, kw), (sh, sw) = node.attrs["pool_size"], node.attrs["strides"]
    dh, dw = node.attrs["dilation"]
    ph, pw = node.attrs["padding"][:2]
    pixel = f"(i / {block})" if block else "i"
    channel = f"(t / {oh_n}) % {node.ty.shape[1]}"  # t: the output row's plane and row
    lines = [f"const int ow = {pixel} % {ow_n};", f"const int t = {pixel} / {ow_n};",
             f"const int y0 = (t % {oh_n}) * {sh} - {ph};", f"const int x0 = ow * {sw} - {pw};",
             f"const GLOBAL float* src = data + (t / {oh_n}) * {h * w * max(block, 1)}"
             + (f" + i % {block};" if block else ";")]

    def bounds(var: str, k: int, stride: int, pad: int, size: int, out: int,
               dil: int) -> tuple[str, list[str]]:
        """The tap's coordinate (clamped where it can leave the input) and its tests."""
        low = -pad + k * dil  # smallest coordinate this tap reads, at output 0
        high = (out - 1) * stride - pad + k * dil  # largest, at the last output
        coord = f"({var}0 + {k * dil})"
        tests = ([f"{coord} >= 0"] if low < 0 else []) + (
            [f"{coord} < {size}"] if high >= size else [])
        return (f"min(max({coord}, 0), {size - 1})" if tests else coord), tests

    for ky in range(kh):
        y, y_tests = bounds("y", ky, sh, ph, h, oh_n, dh)
        for kx in range(kw):
            x, x_tests = bounds("x", kx, sw, pw, w, ow_n, dw)
            read = (f"src[({y} * {w} + {x}) * {block}]" if block else
                    prologue.c_expr(f"src[{y} * {w} + {x}]", channel))
            tests = y_tests + x_tests
            value = f"({' && '.join(tests)}) ? {read} : {masked}" if tests else read
            lines.append(f"{{ const float v = {value}; {combine} }}")
    return ["{", *("  " + line for line in lines), "}"]  # its names stay in the block


def max_pool(node: Node) -> Kernel:
    """Padding never wins (it is -inf, as in the IR); a NaN in the window propagates."""
    pick = "acc = (v > acc || v != v) ? v : acc;"
    if _unrolled(node):
        window = _taps(node, c_float(float("-inf")), pick)
    else:
        head, _, offset = _window(node)
        window = [*head, *_nest(node, [f"const float v = src[{offset}];", pick])]
    body = [f"float acc = {c_float(float('-inf'))};", *window, "out[i] = acc;"]
    return per_item(node, ("data",), node.ty.size, body)


def pools_blocked(node: Node, block: int) -> bool:
    """Whether ``max_pool_blocked`` computes ``node`` in NCHW[block]c: a 2-D max-pool whose
    window is written out (``MAX_UNROLLED_TAPS``) over channels ``block`` divides."""
    return (node.op == "nn.max_pool2d" and _unrolled(node) and block > 0
            and node.ty.shape[1] % block == 0)


def max_pool_blocked(node: Node, block: int) -> Kernel:
    """``max_pool`` reading and writing NCHW[block]c: between two blocked convolutions
    (ResNet's stem, its pool, the first bottleneck) the stem then stores vectors into
    its own block, not lanes into NCHW (0.51 against 0.65 ms on ResNet-50's stem,
    docs/BENCHMARKS.md), and its readers read blocked data."""
    if not pools_blocked(node, block):
        raise NoKernelError(f"{describe(node)}: no blocked kernel for it in NCHW[{block}]c")
    pick = "acc = (v > acc || v != v) ? v : acc;"
    window = _taps(node, c_float(float("-inf")), pick, block)
    kernel = per_item(node, ("data",), node.ty.size,
                      [f"float acc = {c_float(float('-inf'))};", *window, "out[i] = acc;"])
    data, out = kernel.buffers
    return dataclasses.replace(kernel, buffers=(
        dataclasses.replace(data, shape=blocked_shape(data.shape, block)),
        dataclasses.replace(out, shape=blocked_shape(out.shape, block))))


def avg_pool(node: Node, prologue: Prologue = Prologue()) -> Kernel:
    """The divisor counts window taps inside the input, or (count_include_pad) inside the
    declared padding too, but never the ceil-mode overhang past it: per dim, then their
    product. ``prologue`` on each value read (padding stays 0): DenseNet's transition
    pools read the pre-activation chain so (``build_module.plan_prologues``)."""
    spatial = node.inputs[0].ty.shape[2:]
    rank = len(spatial)
    kernel, pad = node.attrs["pool_size"], node.attrs["padding"]
    include = node.attrs["count_include_pad"]
    head, coords, offset = _window(node)
    counts = []
    for d in range(rank):
        lo, hi = (-pad[d], spatial[d] + pad[rank + d]) if include else (0, spatial[d])
        counts.append(f"for (int k{d} = 0; k{d} < {kernel[d]}; ++k{d}) {{ const int x{d} = "
                      f"{coords[d]}; taps{d} += x{d} >= {lo} && x{d} < {hi}; }}")
    channel = f"(i / {math.prod(node.ty.shape[2:])}) % {node.ty.shape[1]}"
    window = (_taps(node, "0.0f", "sum += v;", prologue=prologue) if _unrolled(node)
              else _nest(node, [f"sum += {prologue.c_expr(f'src[{offset}]', channel)};"]))
    body = [
        *head,
        *[f"int taps{d} = 0;" for d in range(rank)],
        *counts,
        "float sum = 0.0f;",
        *window,
        f"out[i] = sum / (float)({' * '.join(f'taps{d}' for d in range(rank))});",
    ]
    return per_item(node, ("data",), node.ty.size, body,
                    extra=prologue.buffers(node.ty.shape[1]))


def global_avg_pool(node: Node, prologue: Prologue = Prologue()) -> Kernel:
    """``prologue`` on each value read (a chain the pool reads directly; the ONNX
    importer's global pools read a reshape of it, which does not fold)."""
    n, c, h, w = node.inputs[0].ty.shape
    body = [
        f"const GLOBAL float* src = data + i * {h * w};",
        "float sum = 0.0f;",
        f"for (int k = 0; k < {h * w}; ++k) sum += {prologue.c_expr('src[k]', f'i % {c}')};",
        f"out[i] = sum / {c_float(h * w)};",
    ]
    return per_item(node, ("data",), n * c, body, block=64, extra=prologue.buffers(c))


# pools that read and write one NCHW[b]c block: op -> (can it, for this node and b; kernel)
BLOCKED_KERNELS: dict[str, tuple[Callable[[Node, int], bool], Callable[[Node, int], Kernel]]] = {
    "nn.max_pool2d": (pools_blocked, max_pool_blocked),
}

# pools that apply a ``Prologue`` on the values they read
PROLOGUE_KERNELS: dict[str, Callable[[Node, Prologue], Kernel]] = {
    "nn.avg_pool2d": avg_pool,
    "nn.avg_pool3d": avg_pool,
    "nn.global_avg_pool2d": global_avg_pool,
}

KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "nn.max_pool2d": max_pool,
    "nn.avg_pool2d": avg_pool,
    "nn.max_pool3d": max_pool,
    "nn.avg_pool3d": avg_pool,
    "nn.global_avg_pool2d": global_avg_pool,
}

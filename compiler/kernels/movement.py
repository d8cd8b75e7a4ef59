"""Data movement: one work-item per output element gathers it from where it lives."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.ir.ops.movement import slice_ranges
from compiler.kernels.common import (
    around_axis,
    c_float,
    linear,
    per_item,
    strides,
    unravel,
)
from compiler.templates.base import Kernel


def concatenate(node: Node) -> Kernel:
    """Each element picks its source by its coordinate along the axis."""
    axis = node.attrs["axis"] % node.ty.ndim
    _, length, inner = around_axis(node.ty.shape, axis)
    names = [f"x{k}" for k in range(len(node.inputs))]
    body = [f"const int a = (i / {inner}) % {length}, o = i / {length * inner},"
            f" r = i % {inner};"]
    start = 0
    for k, (name, arg) in enumerate(zip(names, node.inputs)):
        part = arg.ty.shape[axis]
        if part == 0:
            continue
        guard = "else " if start else ""
        if k < len(names) - 1:
            guard += f"if (a < {start + part}) "
        body.append(f"{guard}out[i] = {name}[(o * {part} + a - {start}) * {inner} + r];")
        start += part
    return per_item(node, names, node.ty.size, body)


def transpose(node: Node) -> Kernel:
    shape = node.inputs[0].ty.shape
    axes = node.attrs["axes"] or tuple(reversed(range(len(shape))))
    step = strides(shape)
    index = " + ".join(f"c{k} * {step[a]}" for k, a in enumerate(axes)) or "0"
    return per_item(node, ("data",), node.ty.size,
                    [*unravel("i", node.ty.shape), f"out[i] = data[{index}];"])


def _pad_source(k: int, d: int, lo: int, mode: str) -> list[str]:
    """C lines defining ``s{k}``, the source coordinate of output coordinate ``c{k}``;
    in reflect mode the reflections repeat with period 2 * (d - 1), as numpy's do."""
    if mode == "edge":
        return [f"const int s{k} = min(max(c{k} - {lo}, 0), {d - 1});"]
    if mode == "wrap":
        return [f"const int s{k} = ((c{k} - {lo}) % {d} + {d}) % {d};"]
    if mode == "reflect":
        if d == 1:
            return [f"const int s{k} = 0;"]
        period = 2 * (d - 1)
        return [f"const int m{k} = ((c{k} - {lo}) % {period} + {period}) % {period};",
                f"const int s{k} = m{k} < {d} ? m{k} : {period} - m{k};"]
    return [f"const int s{k} = c{k} - {lo};"]


def pad(node: Node) -> Kernel:
    shape = node.inputs[0].ty.shape
    widths, mode = node.attrs["pad_width"], node.attrs["pad_mode"]
    body = unravel("i", node.ty.shape)
    inside = []
    for k, (d, (lo, hi)) in enumerate(zip(shape, widths)):
        body += _pad_source(k, d, lo, mode)
        if (lo or hi) and mode == "constant":
            inside.append(f"s{k} >= 0 && s{k} < {d}")
    coords = [f"s{k}" for k in range(len(shape))]
    source = f"data[{linear(coords, shape)}]"
    value = c_float(node.attrs["pad_value"])
    body.append(f"out[i] = {' && '.join(inside)} ? {source} : {value};" if inside else
                f"out[i] = {source};")
    return per_item(node, ("data",), node.ty.size, body)


def strided_slice(node: Node) -> Kernel:
    """Output coordinate c reads start + c * step on each axis."""
    shape = node.inputs[0].ty.shape
    ranges = slice_ranges(shape, node.attrs)
    coords = [f"({r.start} + c{k} * {r.step})" if len(r) > 1 else str(r.start)
              for k, r in enumerate(ranges)]
    return per_item(node, ("data",), node.ty.size,
                    [*unravel("i", node.ty.shape), f"out[i] = data[{linear(coords, shape)}];"])


def repeat(node: Node) -> Kernel:
    """Tile and broadcast_to: output coordinate c reads c modulo the input's extent."""
    shape = node.inputs[0].ty.shape
    coords = [f"c{k}" if d == n else f"(c{k} % {d})" for k, (d, n) in
              enumerate(zip(shape, node.ty.shape))]
    return per_item(node, ("data",), node.ty.size,
                    [*unravel("i", node.ty.shape), f"out[i] = data[{linear(coords, shape)}];"])


def take(node: Node) -> Kernel:
    """Element j of the (flattened) indices reads slice ``indices[j]`` of the axis."""
    shape, count = node.inputs[0].ty.shape, node.inputs[1].ty.size
    axis = node.attrs["axis"] % len(shape)
    _, length, inner = around_axis(shape, axis)
    body = [f"const int j = (i / {inner}) % {count}, o = i / {count * inner}, r = i % {inner};",
            f"out[i] = data[(o * {length} + indices[j]) * {inner} + r];"]
    return per_item(node, ("data", "indices"), node.ty.size, body)


def full(node: Node) -> Kernel:
    return per_item(node, (), node.ty.size, [f"out[i] = {c_float(node.attrs['fill_value'])};"])


KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "concatenate": concatenate,
    "transpose": transpose,
    "nn.pad": pad,
    "strided_slice": strided_slice,
    "tile": repeat,
    "broadcast_to": repeat,
    "take": take,
    "full": full,
}

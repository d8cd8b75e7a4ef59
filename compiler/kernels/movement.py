"""Data movement: one work-item per output element gathers it from where it lives."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
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


def pad(node: Node) -> Kernel:
    shape = node.inputs[0].ty.shape
    widths = node.attrs["pad_width"]
    body = unravel("i", node.ty.shape)
    inside = []
    for k, (d, (lo, hi)) in enumerate(zip(shape, widths)):
        body.append(f"const int s{k} = c{k} - {lo};")
        if lo or hi:
            inside.append(f"s{k} >= 0 && s{k} < {d}")
    coords = [f"s{k}" for k in range(len(shape))]
    source = f"data[{linear(coords, shape)}]"
    value = c_float(node.attrs["pad_value"])
    body.append(f"out[i] = {' && '.join(inside)} ? {source} : {value};" if inside else
                f"out[i] = {source};")
    return per_item(node, ("data",), node.ty.size, body)


def full(node: Node) -> Kernel:
    return per_item(node, (), node.ty.size, [f"out[i] = {c_float(node.attrs['fill_value'])};"])


KERNELS: dict[str, Callable[[Node], Kernel]] = {
    "concatenate": concatenate,
    "transpose": transpose,
    "nn.pad": pad,
    "full": full,
}

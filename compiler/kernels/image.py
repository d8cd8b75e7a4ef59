"""Resize: one work-item per output element, its taps read from tables made at build time."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compiler.ir import Node
from compiler.kernels.common import c_float, per_item, strides, unravel
from compiler.templates.base import Kernel
from compiler.templates.emit import indent


def _taps_loop(k: int, taps: Sequence[int], steps: Sequence[int], offset: str) -> list[str]:
    """``sum{k}``: the weighted sum over resized axis k's taps of the inner axes' sums."""
    last = k == len(taps) - 1
    scaled = f"index{k}[r{k}]" + (f" * {steps[k]}" if steps[k] != 1 else "")
    inner = ([f"sum{k} += weight{k}[r{k}] * data[at{k}];"] if last else
             [*_taps_loop(k + 1, taps, steps, f"at{k}"),
              f"sum{k} += weight{k}[r{k}] * sum{k + 1};"])
    return [f"float sum{k} = 0.0f;",
            f"for (int t{k} = 0; t{k} < {taps[k]}; ++t{k}) {{",
            *indent([f"const int r{k} = row{k} + t{k};",
                     f"const int at{k} = {offset} + {scaled};",
                     *inner]),
            "}"]


def resize(node: Node) -> Kernel:
    """Tap loops nested outermost axis first; an output row outside the input (a negative
    first index on any axis) is the extrapolation value."""
    axes = node.attrs["axes"]
    step = strides(node.inputs[0].ty.shape)
    taps = [node.inputs[1 + 2 * k].ty.shape[1] for k in range(len(axes))]
    names = ["data"]
    for k in range(len(axes)):
        names += [f"index{k}", f"weight{k}"]
    kept = [f"c{d} * {step[d]}" for d in range(len(step)) if d not in axes]
    body = [*unravel("i", node.ty.shape), f"const int base = {' + '.join(kept) or '0'};"]
    if not axes:
        return per_item(node, names, node.ty.size, [*body, "out[i] = data[base];"])
    rows = ", ".join(f"row{k} = c{axis} * {t}" for k, (axis, t) in enumerate(zip(axes, taps)))
    outside = " || ".join(f"index{k}[row{k}] < 0" for k in range(len(axes)))
    value = c_float(node.attrs["extrapolation_value"])
    body += [f"const int {rows};",
             f"if ({outside}) {{",
             f"  out[i] = {value};",
             "  return;",
             "}",
             *_taps_loop(0, taps, [step[a] for a in axes], "base"),
             "out[i] = sum0;"]
    return per_item(node, names, node.ty.size, body)


KERNELS: dict[str, Callable[[Node], Kernel]] = {"image.resize": resize}

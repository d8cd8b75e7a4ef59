"""Reductions over axes: one work-item per output element, looping over the reduced
elements (nested loops, one per reduced axis) and accumulating in float."""

from __future__ import annotations

import math
from collections.abc import Callable

from compiler.ir import Node
from compiler.ir.ops.reduce import REDUCE_KINDS
from compiler.kernels.common import c_float, per_item, strides, unravel
from compiler.templates.base import Kernel

# acc = step(acc, v); max/min propagate NaN like numpy (fmax/fmin would drop it)
_STEP = {
    "sum": "acc += v;",
    "mean": "acc += v;",
    "prod": "acc *= v;",
    "max": "if (v != v || v > acc) acc = v;",
    "min": "if (v != v || v < acc) acc = v;",
}


def reduce(node: Node) -> Kernel:
    shape = node.inputs[0].ty.shape
    axes, kind = node.attrs["axes"], node.attrs["kind"]
    step = strides(shape)
    kept = [k for k in range(len(shape)) if k not in axes]
    body = unravel("i", [shape[k] for k in kept])
    base = " + ".join(f"c{j} * {step[k]}" for j, k in enumerate(kept)) or "0"
    init = 0.0 if kind == "mean" else REDUCE_KINDS[kind]  # mean: a sum, divided below
    body += [f"const int base = {base};", f"float acc = {c_float(init)};"]
    for a in axes:
        body.append(f"for (int r{a} = 0; r{a} < {shape[a]}; ++r{a})")
    offset = " + ".join(["base", *(f"r{a} * {step[a]}" for a in axes)])
    body += ["{", f"  const float v = data[{offset}];", f"  {_STEP[kind]}", "}"]
    count = math.prod(shape[a] for a in axes)
    if kind == "mean":
        body.append(f"out[i] = acc / {c_float(count)};" if count else
                    f"out[i] = {c_float(float('nan'))};")
    else:
        body.append("out[i] = acc;")
    return per_item(node, ("data",), node.ty.size, body)


KERNELS: dict[str, Callable[[Node], Kernel]] = {"reduce": reduce}

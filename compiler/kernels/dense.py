"""A plain dense (``out = data @ weight.T``, epilogue fused) for when no tuned dense
template config is at hand: one work-item per output element, a dot product each."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import epilogue_of, per_item
from compiler.templates.base import Kernel


def dense(node: Node) -> Kernel:
    _, k = node.inputs[0].ty.shape
    units = node.ty.shape[1]
    epilogue, extra = epilogue_of(node)
    body = [
        f"const int f = i % {units}, b = i / {units};",
        f"const GLOBAL float* x = data + b * {k};",
        f"const GLOBAL float* wt = weight + f * {k};",
        "float acc = 0.0f;",
        f"for (int r = 0; r < {k}; ++r) acc += x[r] * wt[r];",
        f"out[i] = {epilogue.c_expr('acc', 'bias[f]', 'residual[i]')};",
    ]
    return per_item(node, ("data", "weight", *extra), node.ty.size, body, block=64)


KERNELS: dict[str, Callable[[Node], Kernel]] = {"nn.dense": dense, "fused.dense": dense}

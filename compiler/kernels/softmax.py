"""Softmax and log-softmax along any axis: one work-item per row (every index but the
axis), three passes over the row (max, sum of exponentials, normalise) for a stable
result."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.kernels.common import around_axis, c_float, per_item
from compiler.templates.base import Kernel


def softmax(node: Node) -> Kernel:
    """``exp(x - max) / sum``, or for log-softmax ``x - max - log(sum)``."""
    shape = node.ty.shape
    outer, length, inner = around_axis(shape, node.attrs["axis"] % len(shape))
    at = f"base + j * {inner}"
    result = (f"data[{at}] - top - log(sum)" if node.op == "nn.log_softmax"
              else f"exp(data[{at}] - top) / sum")
    body = [
        f"const int base = (i / {inner}) * {length * inner} + i % {inner};",
        f"float top = {c_float(float('-inf'))};",
        f"for (int j = 0; j < {length}; ++j) top = fmax(top, data[{at}]);",
        "float sum = 0.0f;",
        f"for (int j = 0; j < {length}; ++j) sum += exp(data[{at}] - top);",
        f"for (int j = 0; j < {length}; ++j) out[{at}] = {result};",
    ]
    return per_item(node, ("data",), outer * inner, body, block=64)


KERNELS: dict[str, Callable[[Node], Kernel]] = {"nn.softmax": softmax, "nn.log_softmax": softmax}

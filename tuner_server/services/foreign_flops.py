"""FLOPs of the AutoTVM templates TopHub's logs hold that this package does not implement
(``conv2d_transpose_nchw.cuda``, ``conv1d_transpose_nchw.cuda``, ``batch_matmul.cuda``),
read from the workload's arguments alone, so their imported records still show GFLOP/s.

A transposed convolution counts the multiply-adds that touch the input: every input
element times the whole kernel (2 * N * C_in * spatial_in * C_out * kernel), not the
zeros that TVM's compute (a convolution over the stride-dilated input) also multiplies."""

from __future__ import annotations

from math import prod
from typing import Any


def _shape(arg: Any) -> list[int]:
    """The shape of an AutoTVM tensor argument (``["TENSOR", shape, dtype, ...]``)."""
    if not (isinstance(arg, list) and len(arg) >= 3 and arg[0] == "TENSOR"
            and isinstance(arg[1], list) and all(isinstance(d, int) and d > 0 for d in arg[1])):
        raise ValueError(f"not a tensor argument: {arg!r}")
    return list(arg[1])


def _transpose_conv(args: list[Any], dims: int) -> float:
    data, kernel = _shape(args[0]), _shape(args[1])
    if len(data) != dims + 2 or len(kernel) != dims + 2 or data[1] != kernel[0]:
        raise ValueError(f"data {data} and kernel {kernel} are not a {dims}-d transposed conv")
    n, c_in, spatial = data[0], data[1], data[2:]
    c_out, window = kernel[1], kernel[2:]
    return 2.0 * n * c_in * prod(spatial) * c_out * prod(window)


def _batch_matmul(args: list[Any]) -> float:
    x, y = _shape(args[0]), _shape(args[1])  # [B, M, K] and [B, N, K] (y transposed)
    if len(x) != 3 or len(y) != 3 or x[2] != y[2] or y[0] not in (1, x[0]):
        raise ValueError(f"{x} x {y}^T is not a batch matmul")
    return 2.0 * x[0] * x[1] * y[1] * x[2]


FOREIGN = {
    "conv2d_transpose_nchw.cuda": lambda args: _transpose_conv(args, 2),
    "conv1d_transpose_nchw.cuda": lambda args: _transpose_conv(args, 1),
    "batch_matmul.cuda": _batch_matmul,
}


def foreign_flops(template: str, args: Any) -> float | None:
    """FLOPs of one run of a workload of a template in :data:`FOREIGN`; None for another
    template or arguments that do not read as its workload."""
    count = FOREIGN.get(template)
    if count is None or not isinstance(args, list):
        return None
    try:
        flops = count(args)
    except (ValueError, IndexError, TypeError):
        return None
    return flops if flops > 0 else None

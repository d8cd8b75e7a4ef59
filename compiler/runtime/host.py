"""The host "device" of heterogeneous execution: numpy on the host CPU.

Not a kernel ``Device`` (it builds and times no generated kernel): it runs IR ops
through their numpy semantics (``compiler.ir.ops.evaluate_op``, fused ops included),
so any op, even one no kernel covers, can be placed on "host"; and it times one op the
same way, for automatic placement. Float32 dense layers take numpy's BLAS in float32
(the IR's semantics accumulate in float64, several times slower): as a device the host
should run as fast as it can.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import MutableMapping, Sequence

import numpy as np

from compiler.ir import CONST, INPUT, Node
from compiler.ir.ops import apply_epilogue, evaluate_op
from compiler.passes.annotate_device import HOST


class HostDevice:
    """Runs a segment of op nodes in numpy; values are host arrays already."""

    spec = HOST
    dialect = "numpy"

    def __init__(self) -> None:
        self.name = f"numpy {np.__version__} on {platform.machine() or 'the host CPU'}"

    def __repr__(self) -> str:
        return f"HostDevice({self.name!r})"

    def run(self, nodes: Sequence[Node], values: MutableMapping[Node, np.ndarray]) -> None:
        """Compute ``nodes`` (in order) into ``values``, which holds every value they read
        from outside the segment; constants are read from the nodes themselves."""
        for node in nodes:
            if node.op in (INPUT, CONST):
                continue
            args = [_value(a, values) for a in node.inputs]
            values[node] = np.asarray(_compute(node, args))

    def time_op(self, node: Node, repeat: int = 5,
                rng: np.random.Generator | None = None) -> float:
        """Median seconds of ``node`` on inputs of its real shapes (constants as they are,
        the rest uniform [0, 1)), after a warm-up call."""
        rng = rng or np.random.default_rng(0)
        args = [a.value if a.op == CONST and a.value is not None else random_value(a, rng)
                for a in node.inputs]
        _compute(node, args)
        times = []
        for _ in range(max(1, repeat)):
            start = time.perf_counter()
            _compute(node, args)
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def _dense(args: Sequence[np.ndarray], attrs: dict) -> np.ndarray:
    out = np.matmul(args[0], args[1].T)  # sgemm / sgemv
    return apply_epilogue(out, list(args[2:]), tuple(attrs.get("epilogue", ())))


_FLOAT32_KERNELS = {"nn.dense": _dense, "fused.dense": _dense}


def _compute(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    fast = _FLOAT32_KERNELS.get(node.op)
    if fast is not None and all(a.dtype == np.float32 for a in args):
        return fast(args, node.attrs)
    return evaluate_op(node.op, list(args), node.attrs)


def random_value(node: Node, rng: np.random.Generator) -> np.ndarray:
    """An array of ``node``'s type: uniform [0, 1) for floats, zeros otherwise."""
    dtype = np.dtype(node.ty.dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(0, 1, size=node.ty.shape).astype(dtype)
    return np.zeros(node.ty.shape, dtype)


def _value(node: Node, values: MutableMapping[Node, np.ndarray]) -> np.ndarray:
    if node.op == CONST and node.value is not None:
        return node.value
    return values[node]


__all__ = ["HostDevice", "random_value"]

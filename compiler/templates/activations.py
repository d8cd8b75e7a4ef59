"""The float activations, each written once in C and once in numpy: the templates' fused
epilogues (``Epilogue``), the plain element-wise kernels and the IR's numpy semantics all
compute them from here, so fused and unfused graphs give the same numbers.

NaN stays NaN, as numpy's maximum / minimum keep it: the C clamps are comparisons a NaN
fails (C's fmax / fmin would return the other operand). The C expressions read their
operand more than once (leaky_relu 3 times, hard_swish 4), so it must be free of side
effects, and stacking them grows the source: the fusion pass caps how many one chain takes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.templates.emit import c_float

# name -> parameter count ("clip": lo, hi; "leaky_relu": alpha; "hard_sigmoid": alpha, beta)
ACTIVATIONS = {"relu": 0, "clip": 2, "leaky_relu": 1, "hard_sigmoid": 2, "hard_swish": 0,
               "silu": 0}
# hard_swish is x * hard_sigmoid(x) with these (ONNX's HardSwish)
HARD_SWISH_ALPHA, HARD_SWISH_BETA = 1 / 6, 0.5


def _clamp_c(v: str, lo: str, hi: str) -> str:
    """min(max(v, lo), hi) in C, NaN kept."""
    return f"({v} < {lo} ? {lo} : ({v} > {hi} ? {hi} : {v}))"


def activation_c(name: str, params: Sequence[float], v: str) -> str:
    """Activation ``name`` as a C float expression over ``v`` (a side-effect-free
    expression: it is read several times)."""
    if name == "relu":
        return f"({v} < 0.0f ? 0.0f : {v})"
    if name == "clip":
        return _clamp_c(v, c_float(params[0]), c_float(params[1]))
    if name == "leaky_relu":
        return f"({v} >= 0.0f ? {v} : {v} * {c_float(params[0])})"
    if name == "hard_sigmoid":
        return _clamp_c(f"({v} * {c_float(params[0])} + {c_float(params[1])})", "0.0f", "1.0f")
    if name == "hard_swish":
        return f"({v} * {activation_c('hard_sigmoid', (HARD_SWISH_ALPHA, HARD_SWISH_BETA), v)})"
    if name == "silu":  # x * sigmoid(x)
        return f"({v} / (1.0f + exp(-{v})))"
    raise ValueError(f"no activation {name!r}: one of {', '.join(ACTIVATIONS)}")


def clamp01(x: np.ndarray) -> np.ndarray:
    """min(max(x, 0), 1), NaN kept (numpy's maximum / minimum propagate it)."""
    return np.maximum(0.0, np.minimum(1.0, x))


def activation_np(name: str, params: Sequence[float], x: np.ndarray) -> np.ndarray:
    """Activation ``name`` in numpy with the kernels' float32 parameters, in ``x``'s
    float precision (the IR computes in float64, the epilogue check in float32)."""
    p = [np.float32(v) for v in params]
    if name == "relu":
        return np.maximum(x, 0)
    if name == "clip":
        return np.minimum(np.maximum(x, p[0]), p[1])
    if name == "leaky_relu":
        return np.where(x >= 0, x, x * p[0])
    if name == "hard_sigmoid":
        return clamp01(x * p[0] + p[1])
    if name == "hard_swish":
        return x * activation_np("hard_sigmoid", (HARD_SWISH_ALPHA, HARD_SWISH_BETA), x)
    if name == "silu":
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-x))
    raise ValueError(f"no activation {name!r}: one of {', '.join(ACTIVATIONS)}")

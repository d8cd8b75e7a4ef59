"""Small helpers for writing kernel C: loop nests that honour the unroll knobs, C types
and float literals."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# How a loop is annotated in the schedule: virtual threads are always expanded in the
# source (as TVM's vthread injection does), ``auto`` loops follow the auto-unroll knobs.
VTHREAD, AUTO = "vthread", "auto"


@dataclass(frozen=True)
class Unroll:
    """AutoTVM's ``auto_unroll_max_step`` / ``unroll_explicit`` pragmas.

    An ``auto`` loop whose nest (itself and every loop inside it) runs at most
    ``max_step`` iterations is unrolled: in the source when ``explicit``, else by
    ``#pragma unroll``.
    """

    max_step: int = 0
    explicit: bool = False

    def modes(self, loops: Sequence[tuple[str, int, str]]) -> list[str]:
        modes, steps = [], 1
        for _, extent, kind in reversed(loops):
            steps *= extent
            if kind == VTHREAD:
                modes.append("explicit")
            elif self.max_step > 0 and steps <= self.max_step:
                modes.append("explicit" if self.explicit else "pragma")
            else:
                modes.append("plain")
        return list(reversed(modes))


def loop_nest(loops: Sequence[tuple[str, int, str]], body: list[str],
              unroll: Unroll) -> list[str]:
    """Emit ``for`` loops over ``(var, extent, kind)`` (outermost first) around ``body``."""
    modes = unroll.modes(loops)
    lines = body
    for (var, extent, _), mode in reversed(list(zip(loops, modes))):
        lines = _loop(var, extent, lines, mode)
    return lines


def _loop(var: str, extent: int, body: list[str], mode: str) -> list[str]:
    if extent == 1:
        return ["{", f"  const int {var} = 0;", *indent(body), "}"]
    if mode == "explicit":
        out: list[str] = []
        for k in range(extent):
            out += ["{", f"  const int {var} = {k};", *indent(body), "}"]
        return out
    head = [f"for (int {var} = 0; {var} < {extent}; ++{var}) {{"]
    if mode == "pragma":
        head.insert(0, "#pragma unroll")
    return [*head, *indent(body), "}"]


def private_tile(vtype: str, values: Sequence[str]) -> list[str]:
    """``values`` (vectors of ``vtype``, or floats) copied into a private array and read
    back as floats through ``tile_f``, value k's lane e at ``tile_f[k * lanes + e]``: a
    lane-wise store then loops over lanes at run time where one statement per lane made
    PoCL's compile time grow with the register tile (the stores of a 32-channel x 8-pixel
    tile were 40% of a direct kernel's source and half its compile time)."""
    return [f"{vtype} tile[{len(values)}];",
            *(f"tile[{k}] = {value};" for k, value in enumerate(values)),
            "const float* tile_f = (const float*)tile;"]


def indent(lines: list[str]) -> list[str]:
    return [("  " + line) if line and not line.startswith("#") else line for line in lines]


# C element types of the IR's dtypes (INT8_T and BOOL_T come from the prelude: char /
# signed char, and unsigned char holding 0 or 1 as numpy's bool does)
C_TYPES = {"float32": "float", "int32": "int", "int8": "INT8_T", "bool": "BOOL_T"}


def c_float(value: float) -> str:
    """A C float literal that reads back as the same float32 (infinities and NaN too)."""
    v = float(np.float32(value))
    if math.isnan(v):
        return "(0.0f / 0.0f)"
    if math.isinf(v):
        return "(1.0f / 0.0f)" if v > 0 else "(-1.0f / 0.0f)"
    return f"{v!r}f"


def signature(entry: str, inputs: Sequence[str], output: str,
              dtypes: Mapping[str, str] | None = None) -> str:
    """The kernel's parameter list; ``dtypes`` gives buffers that are not float32."""
    ctype = {name: C_TYPES[(dtypes or {}).get(name, "float32")] for name in (*inputs, output)}
    params = [f"GLOBAL const {ctype[name]}* RESTRICT {name}" for name in inputs]
    params.append(f"GLOBAL {ctype[output]}* RESTRICT {output}")
    return f"KERNEL void {entry}(" + ", ".join(params) + ")"

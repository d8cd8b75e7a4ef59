"""Deliberately broken templates for fault-injection tests (a helper module, not tests).

Each is ``dense_small_batch.gpu`` with its generated kernel body mutated, registered at
import time; pass ``extra_modules=(broken_templates.__name__,)`` to IsolatedMeasurer so
the measuring child registers them too.

- ``broken_compile.test``: kernel C that does not compile   -> error 3 COMPILE_DEVICE
- ``broken_wrong.test``:   kernel that adds 1 to every output -> error 5 WRONG_ANSWER
- ``broken_hang.test``:    kernel that never terminates       -> error 7 RUN_TIMEOUT
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import Any

from compiler.templates import Epilogue, Kernel, register_template
from compiler.templates.dense_small_batch import DenseSmallBatch
from compiler.templates.ops import DenseOp

# A tiny dense layer: 1x64 @ 64x8, so a correct kernel builds and runs in well under 1 s.
TINY_DENSE_ARGS: list[Any] = [
    ["TENSOR", [1, 64], "float32"],
    ["TENSOR", [8, 64], "float32"],
    None,
    "float32",
]


class _Mutated(DenseSmallBatch):
    """dense_small_batch.gpu whose kernel body goes through ``mutate`` after codegen."""

    name = "broken_base.test"

    @abstractmethod
    def mutate(self, source: str) -> str:
        """The broken kernel source."""

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        kernel = super()._codegen(op, knobs, epilogue)
        source = self.mutate(kernel.source)
        assert source != kernel.source, f"{self.name}: mutation did not apply"
        return dataclasses.replace(kernel, source=source)


class BrokenCompile(_Mutated):
    """Emits a statement no C compiler accepts."""

    name = "broken_compile.test"

    def mutate(self, source: str) -> str:
        return source.replace("float acc = 0.0f;",
                              "float acc = 0.0f;\n  this_is_not_c @@ undeclared_symbol;", 1)


class BrokenWrong(_Mutated):
    """Compiles and runs, but every output is off by one."""

    name = "broken_wrong.test"

    def mutate(self, source: str) -> str:
        return source.replace("out[o] = ", "out[o] = 1.0f + ", 1)


class BrokenHang(_Mutated):
    """Spins forever on a value in global memory; volatile, so no compiler may drop the loop.

    Every work-item stores 0 to ``out[0]`` and loops while it reads back less than 1;
    nothing ever writes 1, and each iteration is a volatile load and store.
    """

    name = "broken_hang.test"

    def mutate(self, source: str) -> str:
        spin = (
            "  float acc = 0.0f;\n"
            "  {\n"
            "    volatile GLOBAL float* spin = out;\n"
            "    spin[0] = 0.0f;\n"
            "    while (spin[0] < 1.0f) { spin[0] = spin[0] * 0.5f; }\n"
            "  }"
        )
        return source.replace("  float acc = 0.0f;", spin, 1)


BROKEN_COMPILE = BrokenCompile()
BROKEN_WRONG = BrokenWrong()
BROKEN_HANG = BrokenHang()

for _template in (BROKEN_COMPILE, BROKEN_WRONG, BROKEN_HANG):
    register_template(_template)

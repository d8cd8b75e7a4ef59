"""Deliberately broken templates for fault-injection tests (a helper module, not tests).

Each is ``dense_small_batch.gpu`` with its generated kernel body mutated, registered at
import time; pass ``extra_modules=(broken_templates.__name__,)`` to IsolatedMeasurer so
the measuring child registers them too.

- ``broken_compile.test``: kernel C that does not compile   -> error 3 COMPILE_DEVICE
- ``broken_wrong.test``:   kernel that adds 1 to every output -> error 5 WRONG_ANSWER
- ``broken_hang.test``:    kernel that never terminates       -> error 7 RUN_TIMEOUT
- ``broken_fault.test``:   kernel that stores 4 TiB past its output (crashes PoCL's
  process, an illegal address on CUDA)                          -> error 4 RUNTIME_DEVICE
- ``broken_launch.test``:  a launch the device refuses (work-group far over its limit,
  a CL/CUDA error at enqueue)                                   -> error 4 RUNTIME_DEVICE
- ``broken_skip.test``:    kernel that never writes its output  -> error 5 WRONG_ANSWER
- ``broken_compiler.test``: codegen that runs a "compiler" process (``sleep``) and waits
  for it, writing its pid to the file named by $BROKEN_COMPILER_PIDFILE -> error 6
- ``slow_codegen.test``: a correct kernel whose codegen takes 0.8 s (a slow compiler)
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
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


class BrokenFault(_Mutated):
    """Every work-item stores far outside any buffer (an unmapped address)."""

    name = "broken_fault.test"

    def mutate(self, source: str) -> str:
        return source.replace("  float acc = 0.0f;",
                              "  float acc = 0.0f;\n  out[0x40000000000L] = 1.0f;", 1)


class BrokenSkip(_Mutated):
    """Computes the result but never stores it: the output keeps what it held before."""

    name = "broken_skip.test"

    def mutate(self, source: str) -> str:
        return source.replace("out[o] = ", "acc = ", 1)


class BrokenLaunch(DenseSmallBatch):
    """A correct kernel launched with a work-group of 2**20 items, which no device takes."""

    name = "broken_launch.test"

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        kernel = super()._codegen(op, knobs, epilogue)
        return dataclasses.replace(kernel, block=(1 << 20, 1, 1))


class BrokenCompiler(DenseSmallBatch):
    """Stands for a device compiler run as a process that never finishes (nvcc stuck)."""

    name = "broken_compiler.test"
    PIDFILE_ENV = "BROKEN_COMPILER_PIDFILE"

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        compiler = subprocess.Popen(["sleep", "300"])
        with open(os.environ[self.PIDFILE_ENV], "w") as f:
            f.write(str(compiler.pid))
        compiler.wait()
        return super()._codegen(op, knobs, epilogue)


class SlowCodegen(DenseSmallBatch):
    """A correct kernel whose code generation takes ``SECONDS`` (a slow compiler)."""

    name = "slow_codegen.test"
    SECONDS = 0.8

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        time.sleep(self.SECONDS)
        return super()._codegen(op, knobs, epilogue)


BROKEN_COMPILE = BrokenCompile()
BROKEN_WRONG = BrokenWrong()
BROKEN_HANG = BrokenHang()
BROKEN_FAULT = BrokenFault()
BROKEN_SKIP = BrokenSkip()
BROKEN_LAUNCH = BrokenLaunch()
BROKEN_COMPILER = BrokenCompiler()
SLOW_CODEGEN = SlowCodegen()

for _template in (BROKEN_COMPILE, BROKEN_WRONG, BROKEN_HANG, BROKEN_FAULT, BROKEN_SKIP,
                  BROKEN_LAUNCH, BROKEN_COMPILER, SLOW_CODEGEN):
    register_template(_template)

"""The device interface every backend implements: build, move data, run, time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.templates import Kernel
from schemas import DeviceLimits, Target


class BuildError(RuntimeError):
    """The device compiler rejected a kernel (AutoTVM error 3, COMPILE_DEVICE)."""


class DeviceRuntimeError(RuntimeError):
    """A kernel failed while running (AutoTVM error 4, RUNTIME_DEVICE)."""


@dataclass(frozen=True)
class DeviceInfo:
    """What ``tuner devices`` shows and a worker registers with."""

    spec: str  # how to open it again: "opencl:0", "cuda:0"
    name: str
    platform: str
    target: Target
    limits: DeviceLimits

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "name": self.name,
            "platform": self.platform,
            "target": str(self.target),
            "limits": self.limits.model_dump(),
        }


class Device(ABC):
    """One accelerator (or CPU) that builds and times generated kernels."""

    info: DeviceInfo
    dialect: str

    @property
    def target(self) -> Target:
        return self.info.target

    @property
    def limits(self) -> DeviceLimits:
        return self.info.limits

    @abstractmethod
    def build(self, kernel: Kernel) -> Any:
        """Compile (cached by source); raises BuildError with the compiler's log."""

    @abstractmethod
    def upload(self, array: np.ndarray) -> Any: ...

    def alloc(self, shape: tuple[int, ...]) -> Any:
        """A float32 buffer of ``shape``."""
        return self.alloc_bytes(4 * int(np.prod(shape)))

    @abstractmethod
    def alloc_bytes(self, nbytes: int) -> Any:
        """An uninitialised buffer of ``nbytes`` (at least one word): pooled storage."""

    @abstractmethod
    def write(self, buffer: Any, array: np.ndarray) -> None:
        """Copy ``array`` into the start of an existing buffer; returns once it is copied."""

    @abstractmethod
    def download(self, buffer: Any, shape: tuple[int, ...]) -> np.ndarray: ...

    @abstractmethod
    def launch(self, program: Any, kernel: Kernel, buffers: list[Any],
               timed: bool = False) -> Any:
        """Enqueue one launch without waiting (launches run in order); with ``timed`` the
        result is a handle for ``elapsed``. Raises DeviceRuntimeError."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every enqueued launch and copy has finished; DeviceRuntimeError if
        one failed."""

    @abstractmethod
    def elapsed(self, first: Any, last: Any = None) -> float:
        """Device seconds from the start of timed launch ``first`` to the end of ``last``
        (default: ``first`` alone); waits for ``last``; DeviceRuntimeError if it failed."""

    def run(self, program: Any, kernel: Kernel, buffers: list[Any]) -> None:
        """Launch once and wait; raises DeviceRuntimeError."""
        self.launch(program, kernel, buffers)
        self.synchronize()

    def time(self, program: Any, kernel: Kernel, buffers: list[Any], number: int) -> float:
        """Seconds per launch over ``number`` back-to-back launches, by device events
        on the first and the last."""
        handles = [self.launch(program, kernel, buffers, timed=i in (0, number - 1))
                   for i in range(number)]
        return self.elapsed(handles[0], handles[-1]) / number

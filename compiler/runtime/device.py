"""The device interface every backend implements: build, move data, run, time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any, Self

import numpy as np

from compiler.templates import Kernel
from schemas import DeviceLimits, Target


class BuildError(RuntimeError):
    """The device compiler rejected a kernel (AutoTVM error 3, COMPILE_DEVICE)."""


class DeviceRuntimeError(RuntimeError):
    """A kernel failed while running (AutoTVM error 4, RUNTIME_DEVICE)."""


class LaunchLimitError(RuntimeError):
    """A kernel that built but cannot launch as configured on this device: its registers
    or static shared memory per block exceed the device's (AutoTVM error 1,
    INSTANTIATION_ERROR: the config does not fit, the device did nothing wrong)."""


# A GPU left idle between trials runs at idle clocks; each repeat of a timed kernel on a
# GPU lasts at least this long (AutoTVM's GPU tutorials use min_repeat_ms=100 likewise).
GPU_MIN_REPEAT_MS = 100.0

# The timed launches are queued behind one busy kernel (see Device.time); its body, a
# serial chain of integer steps that no compiler can shorten, in each dialect.
HOLD_ENTRY = "tuner_hold"
_HOLD_BODY = """(GLOBAL_INT* sink, int iters) {
  unsigned int x = (unsigned int)iters;
  for (int i = 0; i < iters; ++i) x = (x ^ (x >> 13)) * 2654435761u + (unsigned int)i;
  sink[0] = (int)x;
}
"""
HOLD_SOURCE = {
    "opencl": f"__kernel void {HOLD_ENTRY}" + _HOLD_BODY.replace("GLOBAL_INT", "__global int"),
    "cuda": f'extern "C" __global__ void {HOLD_ENTRY}' + _HOLD_BODY.replace("GLOBAL_INT",
                                                                           "int"),
}
MAX_HOLD_S = 0.5  # the longest a hold runs: past it the host is too slow to matter
HOLD_MARGIN = 4.0  # a hold lasts this many times the host's enqueue time (+ 1 ms)


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


def is_cpu(info: DeviceInfo) -> bool:
    """An OpenCL CPU device (PoCL and other CPU drivers get an ``-model=...-cpu`` target)."""
    return info.target.kind == "opencl" and info.target.model.endswith("-cpu")


def preferred_device(devices: Sequence[DeviceInfo]) -> DeviceInfo | None:
    """The device a worker serves when none is named: a CUDA GPU, else another GPU
    (OpenCL, ROCm), else a CPU, each in listing order; None when there is none. A GPU
    machine with PoCL installed must not lend its trials to the CPU."""
    def rank(info: DeviceInfo) -> int:
        return 0 if info.target.kind == "cuda" else (2 if is_cpu(info) else 1)

    return min(devices, key=rank, default=None)


@dataclass(frozen=True)
class Staged:
    """A built multi-stage kernel: a function per stage, and the scratch buffers the
    stages hand each other (owned by this build, so two builds never share them)."""

    functions: tuple[Any, ...]
    scratch: tuple[Any, ...]


@dataclass(frozen=True)
class Span:
    """The timed handles of a multi-stage launch's first and last stage."""

    first: Any
    last: Any


class Device(ABC):
    """One accelerator (or CPU) that builds and times generated kernels."""

    info: DeviceInfo
    dialect: str
    #: whether ``time`` queues its launches behind a busy kernel (backends that can)
    holds_queue: bool = False
    _enqueue_s: float = 50e-6  # host seconds per launch, as last measured by ``time``
    _hold_rate: float = 0.0  # hold-kernel steps per device second, once calibrated
    _hold: tuple[Any, Any] | None = None  # the hold kernel and its one-word output

    @property
    def min_repeat_ms(self) -> float:
        """The floor under a trial's ``min_repeat_ms`` on this device (GPUs warm up)."""
        return 0.0

    def close(self) -> None:
        """Release the device (contexts, queues); the object is unusable after."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def target(self) -> Target:
        return self.info.target

    @property
    def limits(self) -> DeviceLimits:
        return self.info.limits

    def build(self, kernel: Kernel) -> Any:
        """Compile (cached by source); raises BuildError with the compiler's log. A
        multi-stage kernel gets one function per stage and its own scratch buffers."""
        module = self._compile(kernel.source)
        if not kernel.stages:
            return self._function(module, kernel.entry)
        functions = tuple(self._function(module, s.entry) for s in kernel.stages)
        try:
            scratch = tuple(self.alloc_bytes(b.nbytes) for b in kernel.scratch)
        except Exception as err:  # noqa: BLE001 - each backend raises its own error types
            raise DeviceRuntimeError(f"scratch buffers of {kernel.entry}: {err}") from None
        return Staged(functions, scratch)

    @abstractmethod
    def _compile(self, source: str) -> Any:
        """The compiled module of ``source``, cached; BuildError when it does not build."""

    @abstractmethod
    def _function(self, module: Any, entry: str) -> Any:
        """The launchable function ``entry`` of a compiled module."""

    @abstractmethod
    def upload(self, array: np.ndarray) -> Any: ...

    def alloc(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        """A buffer of ``shape`` and ``dtype``."""
        return self.alloc_bytes(np.dtype(dtype).itemsize * int(np.prod(shape)))

    @abstractmethod
    def alloc_bytes(self, nbytes: int) -> Any:
        """An uninitialised buffer of ``nbytes`` (at least one word): pooled storage."""

    #: byte alignment a view's start needs (``view``); 0: this backend makes no views
    view_align: int = 0

    def view(self, buffer: Any, offset: int, nbytes: int) -> Any:
        """``nbytes`` of ``buffer`` from byte ``offset``, as a buffer kernels take: a
        producer writes its channel slice of a concatenation in place through one.
        ``offset`` must be a multiple of ``view_align``."""
        raise DeviceRuntimeError(f"{self.info.spec}: this backend makes no buffer views")

    @abstractmethod
    def write(self, buffer: Any, array: np.ndarray) -> None:
        """Copy ``array`` into the start of an existing buffer; returns once it is copied."""

    @abstractmethod
    def download(self, buffer: Any, shape: tuple[int, ...],
                 dtype: str = "float32") -> np.ndarray: ...

    def launch(self, program: Any, kernel: Kernel, buffers: list[Any],
               timed: bool = False) -> Any:
        """Enqueue the kernel without waiting (launches run in order); with ``timed`` the
        result is a handle for ``elapsed``. Raises DeviceRuntimeError."""
        handles = [self._enqueue(*call, timed) for call in self._calls(program, kernel, buffers)]
        if not isinstance(program, Staged):
            return handles[0]
        return Span(handles[0], handles[-1]) if timed else None

    def prepare(self, program: Any, kernel: Kernel, buffers: list[Any]) -> Callable[..., Any]:
        """``launch`` of these operands as a function of ``timed``, for launches a caller
        repeats (a graph's steps, run after run): a backend works out once what a launch
        derives from its operands. Here nothing is: each call is a ``launch``."""
        return partial(self.launch, program, kernel, buffers)

    @staticmethod
    def _calls(program: Any, kernel: Kernel, buffers: list[Any]
               ) -> list[tuple[Any, tuple[int, int, int], tuple[int, int, int], list[Any]]]:
        """The launches (function, grid, block, buffers) one kernel is: its function, or
        a staged kernel's stages on their buffers and the build's scratch."""
        if not isinstance(program, Staged):
            return [(program, kernel.grid, kernel.block, buffers)]
        pool = [*buffers, *program.scratch]
        return [(fn, s.grid, s.block, [pool[i] for i in s.args])
                for fn, s in zip(program.functions, kernel.stages)]

    @abstractmethod
    def _enqueue(self, function: Any, grid: tuple[int, int, int],
                 block: tuple[int, int, int], buffers: list[Any], timed: bool) -> Any:
        """One launch of ``grid`` blocks of ``block`` threads; a handle when ``timed``."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every enqueued launch and copy has finished; DeviceRuntimeError if
        one failed."""

    def elapsed(self, first: Any, last: Any = None) -> float:
        """Device seconds from the start of timed launch ``first`` to the end of ``last``
        (default: ``first`` alone); waits for ``last``; DeviceRuntimeError if it failed."""
        last = first if last is None else last
        return self._elapsed(first.first if isinstance(first, Span) else first,
                             last.last if isinstance(last, Span) else last)

    @abstractmethod
    def _elapsed(self, first: Any, last: Any) -> float:
        """Seconds from the start of one timed launch's handle to the end of another's."""

    def run(self, program: Any, kernel: Kernel, buffers: list[Any]) -> None:
        """Launch once and wait; raises DeviceRuntimeError."""
        self.launch(program, kernel, buffers)
        self.synchronize()

    def time(self, program: Any, kernel: Kernel, buffers: list[Any], number: int,
             rotate: Sequence[list[Any]] = ()) -> float:
        """Seconds per launch over ``number`` back-to-back launches, by device events
        on the first and the last. With ``rotate`` (more operand sets of the same
        shapes) the launches take ``buffers`` and each of them in turn: a CPU trial's
        copies of its weight, so that no launch finds its weight in a cache.

        Where the backend can, the launches are queued behind a hold kernel that lasts
        longer than the host takes to enqueue them: the first event is then not recorded
        on an idle queue and the device runs the launches back to back, so a kernel of a
        few microseconds is timed, not the host's launch rate. A hold that ended before
        the host finished (its rate was learnt at lower clocks) is learnt from, and the
        timing done once more behind a longer one.
        """
        # prepared before any hold starts running; the sets this many launches reach
        launches = [self.prepare(program, kernel, b)
                    for b in [buffers, *rotate][:max(1, number)]]

        def launch(i: int) -> Any:
            return launches[i % len(launches)](i in (0, number - 1))
        if not self.holds_queue:
            handles = [launch(i) for i in range(number)]
            return self.elapsed(handles[0], handles[-1]) / number
        for attempt in (1, 2):
            seconds = min(MAX_HOLD_S, HOLD_MARGIN * attempt * number * self._enqueue_s + 1e-3)
            hold, steps = self._hold_queue(seconds)
            began = perf_counter()
            handles = [launch(i) for i in range(number)]
            self._enqueue_s = (perf_counter() - began) / number
            ran_out = self._finished(hold)
            cost = self.elapsed(handles[0], handles[-1]) / number
            self._learn_hold(hold, steps)
            if not ran_out or seconds >= MAX_HOLD_S:
                break
        return cost

    def _finished(self, handle: Any) -> bool:
        """Whether a timed launch has already completed (not waited on); False where
        the backend cannot tell."""
        return False

    def flush(self) -> None:
        """Submit what is enqueued to the device now (drivers that batch commands)."""

    def _hold_queue(self, seconds: float) -> tuple[Any, int]:
        """Enqueue the hold kernel for about ``seconds`` of device time (not waited on);
        its timed handle and its steps."""
        if self._hold is None:
            module = self._compile(HOLD_SOURCE[self.dialect])
            self._hold = (self._function(module, HOLD_ENTRY), self.alloc_bytes(4))
        function, sink = self._hold
        if not self._hold_rate:  # a first estimate: steps until one hold lasts 1 ms
            steps = 1 << 12
            while True:
                handle = self._enqueue(function, (1, 1, 1), (1, 1, 1),
                                       [sink, np.int32(steps)], True)
                took = self._elapsed(handle, handle)
                if took >= 1e-3 or steps >= 1 << 27:
                    break
                steps *= 8
            self._hold_rate = steps / max(took, 1e-6)
        steps = max(1, int(min(seconds * self._hold_rate, 2**31 - 1)))
        handle = self._enqueue(function, (1, 1, 1), (1, 1, 1), [sink, np.int32(steps)], True)
        self.flush()
        return handle, steps

    def _learn_hold(self, handle: Any, steps: int) -> None:
        """Keep the fastest rate a hold has run at: clocks rise under load, and a rate
        learnt at idle clocks would make every later hold too short."""
        took = self._elapsed(handle, handle)
        if took > 0:
            self._hold_rate = max(self._hold_rate, min(steps / took, 1e13))

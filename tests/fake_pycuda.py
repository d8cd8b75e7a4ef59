"""A stand-in for pycuda where no GPU can exist: it keeps CUDA's context rules (a stack
of current contexts per thread; every call needs one current; a detached context is
gone, and only its creating thread can detach it) and pycuda's (a kernel keeps its
module loaded), and records which context each call ran in. It measures nothing: an
event's ``time_till`` is a fixed stand-in so that timing code runs, and no test reads
a number from it.
"""

from __future__ import annotations

import sys
import threading
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Error(Exception):
    """pycuda.driver.Error."""


class CompileError(Error):
    """pycuda.compiler.CompileError."""


@dataclass
class Driver:
    """What the fake driver saw: (call, context name) in order, and what to break."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    launches: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)  # (entry, args)
    stream: list[str] = field(default_factory=list)  # launches' entries and "event", in order
    fail: set[str] = field(default_factory=set)
    function_attributes: dict[str, int] = field(default_factory=lambda: {
        "MAX_THREADS_PER_BLOCK": 1024, "NUM_REGS": 32, "SHARED_SIZE_BYTES": 0})
    local: threading.local = field(default_factory=threading.local)

    def stack(self) -> list[Context]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    def current(self, call: str) -> Context:
        """The context ``call`` runs in; CUDA's "invalid device context" without one."""
        stack = self.stack()
        if not stack:
            raise Error(f"{call}: invalid device context (none current)")
        ctx = stack[-1]
        if ctx.detached:
            raise Error(f"{call}: context is destroyed")
        if call in self.fail:
            raise Error(f"{call}: out of memory")
        self.calls.append((call, ctx.name))
        return ctx


DRIVER = Driver()


class Context:
    def __init__(self, name: str) -> None:
        self.name = name
        self.detached = False
        self.creator = threading.get_ident()

    @staticmethod
    def get_current() -> Context | None:
        stack = DRIVER.stack()
        return stack[-1] if stack else None

    def push(self) -> None:
        if self.detached:
            raise Error("cuCtxPushCurrent failed: context is destroyed")
        DRIVER.stack().append(self)

    @staticmethod
    def pop() -> None:
        stack = DRIVER.stack()
        if not stack:
            raise Error("cuCtxPopCurrent failed: no context current")
        stack.pop()

    @staticmethod
    def synchronize() -> None:
        DRIVER.current("synchronize")

    def detach(self) -> None:
        if threading.get_ident() != self.creator:
            return  # pycuda: from another thread the context is leaked, not destroyed
        if self in DRIVER.stack():
            raise Error("detach of a context still current: pop it first")
        self.detached = True


class Device:
    def __init__(self, index: int) -> None:
        self.index = index

    @staticmethod
    def count() -> int:
        return 2

    def name(self) -> str:
        return "NVIDIA H200"

    def compute_capability(self) -> tuple[int, int]:
        return (9, 0)

    def get_attribute(self, attr: str) -> int:
        return {"MAX_THREADS_PER_BLOCK": 1024, "MAX_BLOCK_DIM_X": 1024,
                "MAX_BLOCK_DIM_Y": 1024, "MAX_BLOCK_DIM_Z": 64,
                "MAX_SHARED_MEMORY_PER_BLOCK": 49152, "WARP_SIZE": 32,
                "MULTIPROCESSOR_COUNT": 132}[attr]

    def make_context(self) -> Context:
        ctx = Context(f"cuda:{self.index}")
        ctx.push()  # as CUDA: a new context is current on the calling thread
        return ctx


class Allocation:
    def __init__(self, ctx: Context, nbytes: int) -> None:
        self.ctx, self.nbytes = ctx, nbytes

    def __int__(self) -> int:
        return id(self)


def mem_alloc(nbytes: int) -> Allocation:
    return Allocation(DRIVER.current("mem_alloc"), nbytes)


def to_device(array: np.ndarray) -> Allocation:
    return Allocation(DRIVER.current("to_device"), array.nbytes)


def memcpy_htod(buffer: Allocation, array: np.ndarray) -> None:
    DRIVER.current("memcpy_htod")


def memcpy_dtoh(out: np.ndarray, buffer: Allocation) -> None:
    DRIVER.current("memcpy_dtoh")
    out.fill(0)


STAND_IN_MS = 1.0  # what every event pair "took": not a measurement, never asserted


class Event:
    def record(self) -> None:
        DRIVER.current("event_record")
        DRIVER.stream.append("event")

    def synchronize(self) -> None:
        DRIVER.current("event_synchronize")

    def query(self) -> bool:
        DRIVER.current("event_query")
        return False  # still running: the hold outlasted the host

    def time_till(self, other: Event) -> float:
        return STAND_IN_MS


class Function:
    def __init__(self, entry: str, module: SourceModule) -> None:
        self.entry = entry
        self.module = module  # as pycuda: the module stays loaded while a kernel lives
        self.arg_format: str | None = None
        self.launches: list[tuple[Any, ...]] = []

    def get_attribute(self, attr: str) -> int:
        DRIVER.current("function_attribute")
        return DRIVER.function_attributes[attr]

    def prepare(self, arg_format: str) -> None:
        self.arg_format = arg_format

    def prepared_async_call(self, grid: tuple[int, ...], block: tuple[int, ...],
                            stream: Any, *args: Any) -> None:
        DRIVER.current("launch")
        DRIVER.launches.append((self.entry, args))
        DRIVER.stream.append(self.entry)
        assert self.arg_format is not None, "prepared_async_call before prepare"
        assert len(args) == len(self.arg_format)
        assert all(isinstance(a, int if f == "P" else np.int32)
                   for a, f in zip(args, self.arg_format))
        self.launches.append((grid, block, args))


class SourceModule:
    def __init__(self, source: str, no_extern_c: bool = False, arch: str | None = None,
                 options: list[str] | None = None) -> None:
        ctx = DRIVER.current("module_load")
        if "#error" in source:
            raise CompileError("nvcc: #error in the source")
        # pycuda unloads a module in its own context (activating it if need be), which
        # must still exist then: record which, or that it was already destroyed
        weakref.finalize(self, _unloaded, ctx)

    def get_function(self, entry: str) -> Function:
        DRIVER.current("get_function")
        return Function(entry, self)  # a new handle each time, as pycuda's


def _unloaded(ctx: Context) -> None:
    DRIVER.calls.append(("module_unload", "destroyed" if ctx.detached else ctx.name))


def init() -> None:
    pass


def get_version() -> tuple[int, int, int]:
    return (13, 0, 0)


@contextmanager
def installed() -> Iterator[Driver]:
    """``pycuda``, ``pycuda.driver`` and ``pycuda.compiler`` as this fake, with a fresh
    record, for the duration of the block."""
    global DRIVER
    DRIVER = Driver()
    this = sys.modules[__name__]
    driver = types.ModuleType("pycuda.driver")
    for name in ("Error", "Context", "Device", "Event", "mem_alloc", "to_device",
                 "memcpy_htod", "memcpy_dtoh", "init", "get_version"):
        setattr(driver, name, getattr(this, name))
    names = ("MAX_THREADS_PER_BLOCK", "MAX_BLOCK_DIM_X", "MAX_BLOCK_DIM_Y", "MAX_BLOCK_DIM_Z",
             "MAX_SHARED_MEMORY_PER_BLOCK", "WARP_SIZE", "MULTIPROCESSOR_COUNT",
             "NUM_REGS", "SHARED_SIZE_BYTES")
    attributes = types.SimpleNamespace(**{n: n for n in names})
    setattr(driver, "device_attribute", attributes)  # noqa: B010 - a module built here
    setattr(driver, "function_attribute", attributes)  # noqa: B010
    compiler = types.ModuleType("pycuda.compiler")
    setattr(compiler, "SourceModule", SourceModule)  # noqa: B010
    setattr(compiler, "CompileError", CompileError)  # noqa: B010
    package = types.ModuleType("pycuda")
    setattr(package, "driver", driver)  # noqa: B010
    setattr(package, "compiler", compiler)  # noqa: B010
    saved = {n: sys.modules.get(n) for n in ("pycuda", "pycuda.driver", "pycuda.compiler")}
    sys.modules.update({"pycuda": package, "pycuda.driver": driver,
                        "pycuda.compiler": compiler})
    try:
        yield DRIVER
    finally:
        for n, module in saved.items():
            if module is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = module

"""CUDA backend through pycuda, imported lazily: only GPU machines have libcuda.

Install with ``pip install '.[cuda]'``. Kernels compile with NVRTC-compatible C++ via
pycuda's SourceModule (nvcc), launch prepared (argument format packed once) and are
timed with CUDA events.

Each device owns one context, current on no thread between calls: every call that
touches the GPU pushes it and pops it after (on whichever thread calls: the executor
builds on a pool), so two devices in one process never run on each other's context.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

import numpy as np

from compiler.runtime.device import (
    GPU_MIN_REPEAT_MS,
    BuildError,
    Device,
    DeviceInfo,
    DeviceRuntimeError,
    LaunchLimitError,
)
from compiler.templates import Kernel
from schemas import DeviceLimits, Target

F = TypeVar("F", bound=Callable[..., Any])


def _driver() -> Any:
    try:
        import pycuda.driver as drv
    except ImportError as err:
        raise RuntimeError(
            "the CUDA backend needs pycuda: pip install '.[cuda]' on a machine with libcuda"
        ) from err
    drv.init()
    return drv


def _slug(name: str) -> str:
    # "NVIDIA H200" -> "h200", "NVIDIA GeForce RTX 4090" -> "rtx4090"
    name = re.sub(r"(?i)nvidia|geforce|tesla|quadro", "", name)
    return re.sub(r"[^a-z0-9]+", "", name.lower()) or "unknown"


def _info(drv: Any, index: int) -> DeviceInfo:
    dev = drv.Device(index)
    attr = drv.device_attribute
    major, minor = dev.compute_capability()
    return DeviceInfo(
        spec=f"cuda:{index}",
        name=dev.name(),
        platform=f"CUDA {'.'.join(str(v) for v in drv.get_version())}",
        target=Target.parse(f"cuda -model={_slug(dev.name())} -arch=sm_{major}{minor}"),
        limits=DeviceLimits(
            max_threads_per_block=dev.get_attribute(attr.MAX_THREADS_PER_BLOCK),
            max_thread_x=dev.get_attribute(attr.MAX_BLOCK_DIM_X),
            max_thread_y=dev.get_attribute(attr.MAX_BLOCK_DIM_Y),
            max_thread_z=dev.get_attribute(attr.MAX_BLOCK_DIM_Z),
            max_shared_memory_per_block=dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK),
            warp_size=dev.get_attribute(attr.WARP_SIZE),
            compute_units=dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
        ),
    )


def list_cuda_devices() -> list[DeviceInfo]:
    try:
        drv = _driver()
        return [_info(drv, i) for i in range(drv.Device.count())]
    except Exception:  # no pycuda, no libcuda or no GPU: simply no CUDA devices here
        return []


def _in_context(method: F) -> F:
    """Run ``method`` with the device's context current on the calling thread."""
    @wraps(method)
    def call(self: CUDADevice, *args: Any, **kwargs: Any) -> Any:
        with self.current():
            return method(self, *args, **kwargs)
    return call  # type: ignore[return-value]


def _arg_format(buffers: list[Any]) -> str:
    """pycuda's prepared-call format: an int32 scalar is "i", a device pointer "P"."""
    return "".join("i" if isinstance(b, np.int32) else "P" for b in buffers)


class CUDADevice(Device):
    dialect = "cuda"
    holds_queue = True

    def __init__(self, index: int = 0) -> None:
        drv = _driver()
        self._drv = drv
        self.info = _info(drv, index)
        self._ctx: Any = drv.Device(index).make_context()  # made current: pop it at once
        drv.Context.pop()
        self._depth = threading.local()  # per thread: how deep in current() it is
        self._modules: dict[str, Any] = {}

    @property
    def min_repeat_ms(self) -> float:
        return GPU_MIN_REPEAT_MS

    @contextmanager
    def current(self) -> Iterator[None]:
        """This device's context current on this thread for the block. Re-entrant: a
        nested call pushes again only when another device's context came in between."""
        if self._ctx is None:
            raise DeviceRuntimeError(f"{self.info.spec} is closed")
        depth = getattr(self._depth, "n", 0)
        pushed = depth == 0 or self._drv.Context.get_current() != self._ctx
        if pushed:
            try:
                self._ctx.push()
            except self._drv.Error as err:
                raise DeviceRuntimeError(f"making the context current: {err}") from None
        self._depth.n = depth + 1
        failed = True
        try:
            yield
            failed = False
        finally:
            self._depth.n = depth
            if pushed:
                try:  # a pop reports errors of earlier asynchronous launches too
                    self._drv.Context.pop()
                except self._drv.Error as err:
                    if not failed:  # never hide the error the block raised
                        raise DeviceRuntimeError(f"leaving the context: {err}") from None

    def close(self) -> None:
        """Drop the modules inside the context, then release it: pycuda aborts at exit
        on a context left alive."""
        if self._ctx is None:
            return
        with self.current():
            self._modules.clear()
            self._hold = None
        self._ctx.detach()
        self._ctx = None

    @_in_context
    def build(self, kernel: Kernel) -> Any:
        """As every device; then the launch limits only the cubin knows (error 1)."""
        program = super().build(kernel)
        functions = getattr(program, "functions", (program,))
        blocks = [s.block for s in kernel.stages] or [kernel.block]
        for function, block in zip(functions, blocks):
            self._check_fits(function, block)
        return program

    def _check_fits(self, function: Any, block: tuple[int, int, int]) -> None:
        """Registers x threads and static shared memory of the built kernel against the
        device: ``__launch_bounds__`` makes ptxas fit registers, but a kernel over them
        would only fail at launch, where it would read as a device error (4)."""
        attr = self._drv.function_attribute
        threads = block[0] * block[1] * block[2]
        try:
            most = function.get_attribute(attr.MAX_THREADS_PER_BLOCK)
            registers = function.get_attribute(attr.NUM_REGS)
            shared = function.get_attribute(attr.SHARED_SIZE_BYTES)
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"kernel attributes: {err}") from None
        if threads > most:
            raise LaunchLimitError(
                f"{threads} threads per block but the kernel, at {registers} registers a "
                f"thread, launches at most {most} on {self.info.name}")
        if shared > self.limits.max_shared_memory_per_block:
            raise LaunchLimitError(
                f"{shared} bytes of shared memory per block; {self.info.name} has "
                f"{self.limits.max_shared_memory_per_block}")

    def _compile(self, source: str) -> Any:
        from pycuda.compiler import CompileError, SourceModule

        key = hashlib.sha1(source.encode()).hexdigest()
        if key not in self._modules:
            arch = self.target.arch or "sm_80"
            try:
                self._modules[key] = SourceModule(source, no_extern_c=True, arch=arch,
                                                  options=["-O3"])
            except CompileError as err:
                raise BuildError(str(err)) from None
            except self._drv.Error as err:  # cuModuleLoad: out of memory, a dead context
                raise DeviceRuntimeError(f"loading the module: {err}") from None
        return self._modules[key]

    @_in_context
    def unload(self) -> None:
        """Drop every compiled module (pycuda unloads one when its last reference goes):
        a trial never runs on another's module."""
        self._modules.clear()

    def _function(self, module: Any, entry: str) -> Any:
        try:
            return module.get_function(entry)
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"kernel {entry}: {err}") from None

    @_in_context
    def upload(self, array: np.ndarray) -> Any:
        try:
            return self._drv.to_device(np.ascontiguousarray(array))
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"upload of {array.nbytes} bytes: {err}") from None

    @_in_context
    def alloc_bytes(self, nbytes: int) -> Any:
        try:
            return self._drv.mem_alloc(max(nbytes, 4))
        except self._drv.Error as err:  # out of memory included
            raise DeviceRuntimeError(f"allocation of {nbytes} bytes: {err}") from None

    # device pointers take any offset; 128 bytes keeps every vector access of a view
    # (float4 and wider) as aligned as at the start of an allocation's 128-byte line
    view_align = 128

    def view(self, buffer: Any, offset: int, nbytes: int) -> Any:
        """A device pointer ``offset`` bytes into ``buffer`` (kernels take plain pointers)."""
        if offset % self.view_align:
            raise DeviceRuntimeError(f"a view at byte {offset} is not aligned to "
                                     f"{self.view_align} bytes")
        return int(buffer) + offset

    @_in_context
    def write(self, buffer: Any, array: np.ndarray) -> None:
        try:
            self._drv.memcpy_htod(buffer, np.ascontiguousarray(array))
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"copy to the device: {err}") from None

    @_in_context
    def download(self, buffer: Any, shape: tuple[int, ...],
                 dtype: str = "float32") -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        try:
            self._drv.memcpy_dtoh(out, buffer)
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"copy from the device: {err}") from None
        return out

    @_in_context
    def launch(self, program: Any, kernel: Kernel, buffers: list[Any],
               timed: bool = False) -> Any:
        return super().launch(program, kernel, buffers, timed)

    @_in_context
    def time(self, program: Any, kernel: Kernel, buffers: list[Any], number: int,
             rotate: Sequence[list[Any]] = ()) -> float:
        return super().time(program, kernel, buffers, number, rotate)

    def _enqueue(self, function: Any, grid: tuple[int, int, int],
                 block: tuple[int, int, int], buffers: list[Any], timed: bool) -> Any:
        """A prepared launch on the default stream (its argument format set once per
        kernel); a timed one is bracketed by a (start, end) pair of events."""
        try:
            if getattr(function, "arg_format", None) is None:
                function.prepare(_arg_format(buffers))
            args = [b if isinstance(b, np.int32) else int(b) for b in buffers]
            if not timed:
                function.prepared_async_call(grid, block, None, *args)
                return None
            start, end = self._drv.Event(), self._drv.Event()
            start.record()
            function.prepared_async_call(grid, block, None, *args)
            end.record()
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None
        return start, end

    def _finished(self, handle: Any) -> bool:
        try:
            return bool(handle[1].query())
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None

    @_in_context
    def synchronize(self) -> None:
        try:
            self._drv.Context.synchronize()
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None

    @_in_context
    def elapsed(self, first: Any, last: Any = None) -> float:
        return super().elapsed(first, last)

    def _elapsed(self, first: Any, last: Any) -> float:
        start, end = first[0], last[1]
        try:
            end.synchronize()
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None
        return start.time_till(end) * 1e-3

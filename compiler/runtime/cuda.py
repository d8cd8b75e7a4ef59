"""CUDA backend through pycuda, imported lazily: only GPU machines have libcuda.

Install with ``pip install '.[cuda]'``. Kernels compile with NVRTC-compatible C++ via
pycuda's SourceModule (nvcc), and are timed with CUDA events.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from compiler.runtime.device import BuildError, Device, DeviceInfo, DeviceRuntimeError
from schemas import DeviceLimits, Target


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


class CUDADevice(Device):
    dialect = "cuda"

    def __init__(self, index: int = 0) -> None:
        drv = _driver()
        self._drv = drv
        self.info = _info(drv, index)
        self._ctx = drv.Device(index).make_context()
        self._modules: dict[str, Any] = {}

    def close(self) -> None:
        self._ctx.pop()

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

    def unload(self) -> None:
        """Drop every compiled module (pycuda unloads one when its last reference goes):
        a trial never runs on another's module."""
        self._modules.clear()

    def _function(self, module: Any, entry: str) -> Any:
        try:
            return module.get_function(entry)
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"kernel {entry}: {err}") from None

    def upload(self, array: np.ndarray) -> Any:
        try:
            return self._drv.to_device(np.ascontiguousarray(array))
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"upload of {array.nbytes} bytes: {err}") from None

    def alloc_bytes(self, nbytes: int) -> Any:
        try:
            return self._drv.mem_alloc(max(nbytes, 4))
        except self._drv.Error as err:  # out of memory included
            raise DeviceRuntimeError(f"allocation of {nbytes} bytes: {err}") from None

    def write(self, buffer: Any, array: np.ndarray) -> None:
        try:
            self._drv.memcpy_htod(buffer, np.ascontiguousarray(array))
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"copy to the device: {err}") from None

    def download(self, buffer: Any, shape: tuple[int, ...],
                 dtype: str = "float32") -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        try:
            self._drv.memcpy_dtoh(out, buffer)
        except self._drv.Error as err:
            raise DeviceRuntimeError(f"copy from the device: {err}") from None
        return out

    def _enqueue(self, function: Any, grid: tuple[int, int, int],
                 block: tuple[int, int, int], buffers: list[Any], timed: bool) -> Any:
        """A timed launch is bracketed by a (start, end) pair of events."""
        try:
            if not timed:
                function(*buffers, block=block, grid=grid)
                return None
            start, end = self._drv.Event(), self._drv.Event()
            start.record()
            function(*buffers, block=block, grid=grid)
            end.record()
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None
        return start, end

    def synchronize(self) -> None:
        try:
            self._drv.Context.synchronize()
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None

    def _elapsed(self, first: Any, last: Any) -> float:
        start, end = first[0], last[1]
        try:
            end.synchronize()
        except self._drv.Error as err:
            raise DeviceRuntimeError(str(err)) from None
        return start.time_till(end) * 1e-3

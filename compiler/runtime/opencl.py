"""OpenCL backend (pyopencl): PoCL on the CPU here, the ROCm OpenCL runtime on AMD GPUs."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.runtime.device import (
    GPU_MIN_REPEAT_MS,
    BuildError,
    Device,
    DeviceInfo,
    DeviceRuntimeError,
    Span,
    Staged,
)
from compiler.templates import Kernel
from schemas import DeviceLimits, Target

PLATFORM_ENV = "TUNER_OPENCL_PLATFORM"
_CPU_LOCAL_MEM_CAP = 64 * 1024


def _cl() -> Any:
    """pyopencl, with PoCL's kernel cache (read once, as the driver loads) pointed where
    every device-owning child's is (``child.child_env``): a build in this process then
    loads the kernels tuning's measuring children and builders compiled, and they find
    what it compiled."""
    global _cache_shared
    if not _cache_shared:
        _cache_shared = True
        from compiler.runtime.child import (
            POCL_CACHE_ENV,
            kernel_cache_dir,
            make_writable,
        )

        cache = kernel_cache_dir()
        try:
            make_writable(cache)
            os.environ[POCL_CACHE_ENV] = str(cache)
        except OSError:  # unwritable: this process keeps PoCL's default cache
            pass
    import pyopencl as cl

    return cl


_cache_shared = False


def _pocl_version(version: str) -> tuple[int, ...]:
    match = re.search(r"PoCL (\d+)\.(\d+)", version)
    return tuple(int(x) for x in match.groups()) if match else (0, 0)


def _platform_rank(platform: Any) -> tuple[int, int, tuple[int, ...]]:
    """Lower sorts first: GPUs, then a distribution's PoCL (LLVM 15, ~10x faster
    vectorised code here) before pip's pocl-binary-distribution, newest PoCL first."""
    cl = _cl()
    try:
        has_gpu = any(d.type & cl.device_type.GPU for d in platform.get_devices())
    except cl.Error:
        has_gpu = False
    distro = "debian" in platform.version.lower() or "ubuntu" in platform.version.lower()
    version = _pocl_version(platform.version)
    return (0 if has_gpu else 1, 0 if distro else 1, tuple(-v for v in version))


def ordered_platforms() -> list[Any]:
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return []
    platforms = sorted(platforms, key=_platform_rank)
    choice = os.environ.get(PLATFORM_ENV)
    if choice:
        picked = [p for i, p in enumerate(platforms)
                  if choice == str(i) or choice.lower() in f"{p.name} {p.version}".lower()]
        if not picked:
            names = "; ".join(f"{i}: {p.name} {p.version}" for i, p in enumerate(platforms))
            raise RuntimeError(f"{PLATFORM_ENV}={choice!r} matches no OpenCL platform ({names})")
        platforms = picked + [p for p in platforms if p not in picked]
    return platforms


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _target_for(platform: Any, device: Any) -> Target:
    cl = _cl()
    if device.type & cl.device_type.CPU:
        model = "pocl-cpu" if "portable computing language" in platform.name.lower() else (
            _slug(device.name) + "-cpu")
        return Target.parse(f"opencl -model={model}")
    if "amd" in platform.name.lower() or _is_amd(device):
        gfx = re.search(r"gfx[0-9a-f]+", device.name.lower())
        if gfx:
            return Target.parse(f"rocm -model={gfx.group(0)}")
    return Target.parse(f"opencl -model={_slug(device.name)}")


def _limits(device: Any) -> DeviceLimits:
    cl = _cl()
    sizes = list(device.max_work_item_sizes) + [1, 1, 1]
    is_cpu = bool(device.type & cl.device_type.CPU)
    return DeviceLimits(
        max_threads_per_block=device.max_work_group_size,
        max_thread_x=sizes[0],
        max_thread_y=sizes[1],
        max_thread_z=sizes[2],
        # PoCL reports 1 MiB of local memory but crashed (SIGSEGV) on a conv2d block
        # using 94 KB with 784 work-items; 64 KiB covers every TopHub config (<= 56 KB).
        max_shared_memory_per_block=(min(device.local_mem_size, _CPU_LOCAL_MEM_CAP) if is_cpu
                                     else device.local_mem_size),
        warp_size=_warp_size(device, is_cpu),
        compute_units=device.max_compute_units,
        simd_lanes=_simd_lanes(device),
    )


def _simd_lanes(device: Any) -> int:
    """CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT (PoCL: 16 on AVX-512, 8 on AVX2); 0 where the
    driver does not answer."""
    try:
        return min(1024, max(0, int(device.native_vector_width_float)))
    except Exception:  # noqa: BLE001 - a driver that fails the query: lanes unknown
        return 0


def _is_amd(device: Any) -> bool:
    vendor = device.vendor.lower()  # ROCm: "Advanced Micro Devices, Inc."
    return "advanced micro devices" in vendor or re.search(r"\bamd\b", vendor) is not None


def _warp_size(device: Any, is_cpu: bool) -> int:
    """Threads that run in lockstep: what the device says where its vendor extension
    tells (AMD's wavefront width: 64 on GCN/CDNA, 32 on RDNA; NVIDIA's warp), else by
    vendor; a CPU's vector lanes are not a warp, 16 groups work-items as PoCL packs them."""
    if is_cpu:
        return 16
    extensions = str(getattr(device, "extensions", "")).split()
    for extension, name in (("cl_amd_device_attribute_query", "wavefront_width_amd"),
                            ("cl_nv_device_attribute_query", "warp_size_nv")):
        if extension in extensions:
            width = int(getattr(device, name))
            if width > 0:
                return width
    return 64 if _is_amd(device) else 32


def list_opencl_devices() -> list[DeviceInfo]:
    out: list[DeviceInfo] = []
    for platform in ordered_platforms():
        try:
            devices = platform.get_devices()
        except _cl().Error:
            continue
        for device in devices:
            out.append(DeviceInfo(
                spec=f"opencl:{len(out)}",
                name=device.name.strip(),
                platform=f"{platform.name} {platform.version}".strip(),
                target=_target_for(platform, device),
                limits=_limits(device),
            ))
    return out


OPTIONS = "-cl-std=CL1.2"


class OpenCLDevice(Device):
    dialect = "opencl"

    def __init__(self, index: int = 0) -> None:
        cl = _cl()
        pairs = [(p, d) for p in ordered_platforms() for d in p.get_devices()]
        if not pairs:
            raise RuntimeError(
                "no OpenCL device found: install an OpenCL driver (Debian: "
                "apt-get install pocl-opencl-icd; or pip install pocl-binary-distribution)"
            )
        if not 0 <= index < len(pairs):
            raise RuntimeError(f"opencl:{index}: only {len(pairs)} OpenCL device(s) here")
        platform, device = pairs[index]
        self._device = device
        self.info = DeviceInfo(
            spec=f"opencl:{index}",
            name=device.name.strip(),
            platform=f"{platform.name} {platform.version}".strip(),
            target=_target_for(platform, device),
            limits=_limits(device),
        )
        # a GPU's timed launches queue behind a hold kernel; on a CPU the hold would only
        # take a core from the host (bench/launch_overhead.py: no gain past tiny kernels)
        self.holds_queue = not device.type & cl.device_type.CPU
        self.view_align = max(1, device.mem_base_addr_align // 8)  # bits -> bytes
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(
            self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE
        )
        self._programs: dict[str, Any] = {}
        self._functions: dict[tuple[int, str], Any] = {}
        # per kernel object, what its arguments were last set to (cl_mem handles and
        # scalar values, not the buffers: those stay free to go): a launch with the same
        # arguments enqueues alone (pyopencl's call sets every argument each time)
        self._bound: dict[int, tuple[Any, tuple[Any, ...]]] = {}

    @property
    def min_repeat_ms(self) -> float:
        return 0.0 if self._device.type & _cl().device_type.CPU else GPU_MIN_REPEAT_MS

    def close(self) -> None:
        self.unload()
        self._hold = None
        self.queue.finish()

    def _compile(self, source: str) -> Any:
        cl = _cl()
        key = hashlib.sha1(source.encode()).hexdigest()
        if key not in self._programs:
            try:
                self._programs[key] = _build(cl, self.ctx, source)
            except cl.Error as err:
                if _is_compile_error(cl, err):
                    raise BuildError(str(err)) from None
                raise DeviceRuntimeError(f"loading the program: {err}") from None
        return self._programs[key]

    def unload(self) -> None:
        """Drop every built program and kernel: a trial never runs on another's module."""
        self._programs.clear()
        self._functions.clear()
        self._bound.clear()

    def _function(self, module: Any, entry: str) -> Any:
        # pyopencl makes a new kernel object per attribute access: keep one per entry
        key = (id(module), entry)
        if key not in self._functions:
            try:
                self._functions[key] = getattr(module, entry)
            except (_cl().Error, AttributeError) as err:
                raise DeviceRuntimeError(f"kernel {entry}: {err}") from None
        return self._functions[key]

    def upload(self, array: np.ndarray) -> Any:
        cl = _cl()
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        try:
            return cl.Buffer(self.ctx, flags, hostbuf=np.ascontiguousarray(array))
        except cl.Error as err:
            raise DeviceRuntimeError(f"upload of {array.nbytes} bytes: {err}") from None

    def alloc_bytes(self, nbytes: int) -> Any:
        cl = _cl()
        try:
            return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size=max(nbytes, 4))
        except cl.Error as err:  # out of memory included
            raise DeviceRuntimeError(f"allocation of {nbytes} bytes: {err}") from None

    def view(self, buffer: Any, offset: int, nbytes: int) -> Any:
        """A sub-buffer: its origin must be a multiple of the device's base address
        alignment (``view_align``)."""
        cl = _cl()
        if offset % self.view_align:
            raise DeviceRuntimeError(f"a view at byte {offset} is not aligned to "
                                     f"{self.view_align} bytes")
        try:
            return buffer.get_sub_region(offset, max(nbytes, 4))
        except cl.Error as err:
            raise DeviceRuntimeError(f"view of {nbytes} bytes at {offset}: {err}") from None

    def write(self, buffer: Any, array: np.ndarray) -> None:
        cl = _cl()
        try:
            cl.enqueue_copy(self.queue, buffer, np.ascontiguousarray(array), is_blocking=True)
        except cl.Error as err:
            raise DeviceRuntimeError(f"copy to the device: {err}") from None

    def download(self, buffer: Any, shape: tuple[int, ...],
                 dtype: str = "float32") -> np.ndarray:
        cl = _cl()
        out = np.empty(shape, dtype=dtype)
        try:
            cl.enqueue_copy(self.queue, out, buffer)
        except cl.Error as err:
            raise DeviceRuntimeError(f"copy from the device: {err}") from None
        return out

    def prepare(self, program: Any, kernel: Kernel, buffers: list[Any]) -> Callable[..., Any]:
        """The launch with its global size and argument handles worked out once: through
        ``launch`` each costs the host 7-12 us against ~3 for the enqueue alone, and on a
        2-core CPU device the host enqueues a graph's launches on a core the kernels use
        (docs/BENCHMARKS.md)."""
        binds = [self._bind(*call) for call in self._calls(program, kernel, buffers)]
        if not isinstance(program, Staged):
            return binds[0]

        def staged(timed: bool = False) -> Any:
            events = [bind() for bind in binds]
            return Span(events[0], events[-1]) if timed else None
        return staged

    def _enqueue(self, function: Any, grid: tuple[int, int, int],
                 block: tuple[int, int, int], buffers: list[Any], timed: bool) -> Any:
        return self._bind(function, grid, block, buffers)(timed)

    def _bind(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
              buffers: list[Any]) -> Callable[..., Any]:
        """One launch as a function of ``timed``; every launch returns its event (the queue
        profiles them all anyway). Arguments are set only when they differ from the
        kernel's last launch (OpenCL captures them at enqueue, so equal handles are an
        equal binding; two steps of one build may share a kernel object). One thread
        launches a device's kernels: setting and enqueuing are two steps."""
        cl = _cl()
        size = tuple(g * b for g, b in zip(grid, block))
        args = tuple(b.int_ptr if isinstance(b, cl.MemoryObjectHolder) else int(b)
                     for b in buffers)
        queue, enqueue = self.queue, cl.enqueue_nd_range_kernel
        bound, key = self._bound, id(function)

        def launch(timed: bool = False) -> Any:  # every launch has its event: timed or not
            try:
                held = bound.get(key)
                if held is None or held[0] is not function or held[1] != args:
                    bound.pop(key, None)  # a set_args failing halfway binds nothing known
                    function.set_args(*buffers)
                    bound[key] = (function, args)
                return enqueue(queue, function, size, block)
            except cl.Error as err:
                raise DeviceRuntimeError(str(err)) from None
        return launch

    def _finished(self, handle: Any) -> bool:
        cl = _cl()
        return bool(handle.command_execution_status == cl.command_execution_status.COMPLETE)

    def flush(self) -> None:
        self.queue.flush()

    def synchronize(self) -> None:
        cl = _cl()
        try:
            self.queue.finish()
        except cl.Error as err:
            raise DeviceRuntimeError(str(err)) from None

    def _elapsed(self, first: Any, last: Any) -> float:
        cl = _cl()
        try:
            last.wait()
        except cl.Error as err:
            raise DeviceRuntimeError(str(err)) from None
        return (last.profile.end - first.profile.start) * 1e-9


def _is_compile_error(cl: Any, err: Any) -> bool:
    """Whether a CL error at build time is the compiler rejecting the source (error 3),
    not the runtime running out of something (error 4)."""
    codes = cl.status_code
    return getattr(err, "code", None) in (codes.BUILD_PROGRAM_FAILURE,
                                          codes.INVALID_BUILD_OPTIONS,
                                          codes.COMPILER_NOT_AVAILABLE,
                                          codes.INVALID_PROGRAM)


def _build(cl: Any, ctx: Any, source: str) -> Any:
    """The built program. pyopencl's ``Program.build`` adds ``-I <its headers>``, a path
    inside the virtual environment, to the options; where the driver caches builds by
    source and options (PoCL), every new environment (a fresh clone, CI) would compile
    every kernel again. Our kernels include nothing, so there we build the raw program
    with our options alone; elsewhere pyopencl's own binary cache serves as before."""
    from pyopencl.characterize import has_src_build_cache

    raw_program = getattr(cl._cl, "_Program", None)
    if raw_program is None or not has_src_build_cache(ctx.devices[0]):
        return cl.Program(ctx, source).build(options=[OPTIONS])
    raw = raw_program(ctx, source)
    raw.build(OPTIONS.encode())
    return cl.Program(raw)

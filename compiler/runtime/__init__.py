"""Devices (OpenCL via pyopencl, CUDA via pycuda), kernel build, check and timing."""

from __future__ import annotations

from compiler.runtime.device import BuildError, Device, DeviceInfo, DeviceRuntimeError
from schemas import Target


def list_devices() -> list[DeviceInfo]:
    """Every local device, CUDA first (pycuda only where it imports), then OpenCL."""
    from compiler.runtime.cuda import list_cuda_devices
    from compiler.runtime.opencl import list_opencl_devices

    return list_cuda_devices() + list_opencl_devices()


def open_device(spec: str | None = None, target: str | None = None) -> Device:
    """Open ``spec`` ("opencl:0", "cuda:1"), or the first device whose target fits ``target``."""
    if spec is None:
        spec = _spec_for(target)
    kind, _, index = spec.partition(":")
    try:
        number = int(index or 0)
    except ValueError:
        raise ValueError(f"device {spec!r}: expected KIND:INDEX such as opencl:0") from None
    if kind == "opencl":
        from compiler.runtime.opencl import OpenCLDevice

        return OpenCLDevice(number)
    if kind == "cuda":
        from compiler.runtime.cuda import CUDADevice

        return CUDADevice(number)
    raise ValueError(f"device {spec!r}: kind must be opencl or cuda")


def _spec_for(target: str | None) -> str:
    devices = list_devices()
    if not devices:
        raise RuntimeError("no device found (no OpenCL platform and no CUDA GPU)")
    if target is None:
        opencl = [d for d in devices if d.spec.startswith("opencl")]
        return (opencl or devices)[0].spec
    want = Target.parse(target)
    for rule in (lambda d: d.target.kind == want.kind and d.target.model == want.model,
                 lambda d: d.target.kind == want.kind):
        for dev in devices:
            if rule(dev):
                return dev.spec
    have = ", ".join(f"{d.spec} ({d.target})" for d in devices)
    raise RuntimeError(f"no local device for target {str(want)!r}; devices here: {have}")


__all__ = [
    "BuildError",
    "Device",
    "DeviceInfo",
    "DeviceRuntimeError",
    "list_devices",
    "open_device",
]

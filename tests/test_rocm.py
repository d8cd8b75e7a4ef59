"""ROCm on the OpenCL backend (issue 15, point 6).

- the warp size comes from the device: AMD's wavefront width where the driver reports
  it (64 on CDNA), else by vendor, and ROCm's vendor string is "Advanced Micro Devices,
  Inc." (no "amd" in it as a word of its own);
- the int8 template's DP4A is one ``v_dot4`` instruction on AMD GPUs that have it: its
  OpenCL source compiled by clang (PoCL's own clang-15 here) for gfx90a holds the dot
  instruction and no byte arithmetic, and for gfx900 (no dot instructions) still builds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import types
from pathlib import Path

import pytest
from conftest import draw_valid_configs
from test_int8 import INT8, int8_workload

from compiler.runtime import opencl as backend
from compiler.templates import get_template
from schemas import DeviceLimits


class _NoExtension:
    """Asking a driver for an extension's attribute it lacks fails (pyopencl's LogicError)."""

    def __get__(self, obj: object, owner: type) -> int:
        raise RuntimeError("clGetDeviceInfo failed: INVALID_VALUE")


def fake_device(vendor: str, wavefront: int | None = None) -> object:
    """A pyopencl Device's attributes as the AMD and NVIDIA drivers report them."""
    attrs: dict[str, object] = {
        "vendor": vendor, "type": 4,  # CL_DEVICE_TYPE_GPU
        "max_work_item_sizes": [1024, 1024, 1024], "max_work_group_size": 1024,
        "local_mem_size": 65536, "max_compute_units": 104, "name": "gfx90a:sramecc+:xnack-",
    }
    cls = type("Device", (), {"wavefront_width_amd": _NoExtension(),
                              "warp_size_nv": _NoExtension()})
    device = cls()
    device.__dict__.update(attrs)
    if wavefront is not None:  # the driver reports it with its extension
        type(device).wavefront_width_amd = wavefront  # type: ignore[attr-defined]
        device.extensions = "cl_khr_fp64 cl_amd_device_attribute_query"
    return device


@pytest.mark.parametrize(("vendor", "wavefront", "expected"), [
    ("Advanced Micro Devices, Inc.", 64, 64),  # MI250 (CDNA2) on ROCm
    ("Advanced Micro Devices, Inc.", 32, 32),  # RDNA in wave32 mode: the device says so
    ("Advanced Micro Devices, Inc.", None, 64),  # no extension: AMD's GCN/CDNA width
    ("AMD", None, 64),
    ("NVIDIA Corporation", None, 32),
    ("Intel(R) Corporation", None, 32),
])
def test_warp_size_comes_from_the_device(vendor: str, wavefront: int | None,
                                         expected: int) -> None:
    limits = backend._limits(fake_device(vendor, wavefront))
    assert limits.warp_size == expected


def test_simd_lanes_come_from_the_device() -> None:
    """A CPU driver's native float vector width sizes the CPU templates' defaults; a
    driver that fails the query leaves it unknown (0)."""
    device = fake_device("Intel(R) Corporation")
    assert backend._limits(device).simd_lanes == 0
    device.native_vector_width_float = 16  # type: ignore[attr-defined]
    assert backend._limits(device).simd_lanes == 16


def test_rocm_target_from_the_vendor_string() -> None:
    platform = types.SimpleNamespace(name="AMD Accelerated Parallel Processing")
    device = fake_device("Advanced Micro Devices, Inc.")
    assert str(backend._target_for(platform, device)) == "rocm -model=gfx90a"


CLANG = shutil.which("clang-15") or shutil.which("clang")
AMD_LIMITS = DeviceLimits(max_threads_per_block=1024, max_thread_x=1024, max_thread_y=1024,
                          max_thread_z=1024, max_shared_memory_per_block=65536, warp_size=64,
                          compute_units=104)


def _amdgcn_assembly(source: str, cpu: str, tmp: Path) -> str:
    path = tmp / f"{cpu}.cl"
    path.write_text(source)
    # -nogpulib: no ROCm device library here, so work-item functions stay calls, which
    # does not change how the arithmetic is selected
    done = subprocess.run([CLANG or "clang", "-x", "cl", "-cl-std=CL1.2", "-nogpulib",
                           "-target", "amdgcn-amd-amdhsa", f"-mcpu={cpu}", "-O2", "-S",
                           "-o", "-", str(path)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _has_amdgcn() -> bool:
    if CLANG is None:
        return False
    out = subprocess.run([CLANG, "--print-targets"], capture_output=True, text=True,
                         check=False).stdout
    return "amdgcn" in out


@pytest.mark.skipif(not _has_amdgcn(), reason="no clang with the AMDGPU backend here "
                    "(Debian's pocl-opencl-icd brings clang-15 with it)")
def test_int8_dp4a_is_one_dot_instruction_on_gfx90a(tmp_path: Path) -> None:
    template = get_template(INT8)
    workload = int8_workload(64, 14, 64, 3, 1, 1)
    config = draw_valid_configs(template, workload, "rocm", 1, AMD_LIMITS)[0]
    source = template.codegen(workload, config, "opencl").source
    cdna = _amdgcn_assembly(source, "gfx90a", tmp_path)
    assert re.search(r"v_dot4c?_i32_i8", cdna), "gfx90a: DP4A did not become v_dot4"
    # the byte path sign-extends each lane with v_bfe_i32 (or shifts); none is left
    assert "v_bfe_i32" not in cdna
    vega = _amdgcn_assembly(source, "gfx900", tmp_path)  # no dot instructions: bytes
    assert "v_dot4" not in vega

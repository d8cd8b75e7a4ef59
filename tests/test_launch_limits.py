"""Launch limits as template rules (issue 15, point 3).

- every CUDA kernel carries ``__launch_bounds__`` of its block (the prelude's
  ``LAUNCH_BOUNDS``), so ptxas keeps registers within what that block may use; OpenCL's
  prelude defines ``LAUNCH_BOUNDS`` empty, so its kernels behave as before;
- grid dimensions are a limit rule per dialect: on CUDA y and z <= 65,535 and
  x <= 2^31 - 1, so depthwise at batch 128 (n * channel blocks on z) and dense_small_batch
  past 65,535 rows (batch on y) are refused with a message naming the axis;
- ``nvcc --resource-usage`` over sampled valid configs of every template (and the three
  configs the issue found failing at launch) for sm_80 and sm_90: every kernel fits the
  register file (registers x threads <= 65,536, allocated per warp) and <= 255 registers.

Checking registers and static shared memory of the loaded cubin at build time (error 1)
belongs to the CUDA backend: tests/test_cuda_contexts.py.
"""

from __future__ import annotations

import math
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    CONV,
    CONV_CPU,
    DENSE_LARGE,
    DENSE_SMALL,
    NVCC,
    conv_workload,
    dense_workload,
    draw_valid_configs,
    nchwc_workload,
    needs_nvcc,
)
from test_depthwise import DEPTHWISE, depthwise_workload
from test_int8 import INT8, int8_workload
from test_winograd import WINOGRAD, winograd_workload

from compiler.templates import get_template
from compiler.templates.base import GRID_LIMITS
from schemas import Config, DeviceLimits, Workload

PACK = "dense_pack.x86"
REGISTER_FILE = 65536  # 32-bit registers per SM, and so per block, on sm_80 and sm_90
MAX_REGISTERS = 255

# A few realistic layers per template (ResNet-50, VGG-16, MobileNet).
LAYERS: dict[str, Workload] = {
    CONV: conv_workload(1, 128, 28, 128, 3, 1, 1),
    INT8: int8_workload(128, 28, 128, 3, 1, 1),
    CONV_CPU: nchwc_workload(1, 64, 56, 64, 1, 1, 0),
    WINOGRAD: winograd_workload(1, 128, 28, 28, 128),
    DENSE_LARGE: dense_workload(DENSE_LARGE, 64, 2048, 1000),
    PACK: dense_workload(PACK, 1, 2048, 1000),
    DENSE_SMALL: dense_workload(DENSE_SMALL, 1, 2048, 1000),
    DEPTHWISE: depthwise_workload(1, 256, 28),
}
PER_TEMPLATE = 3

# The configs the issue found failing with "too many resources requested" (index,
# threads per block, registers nvcc gave them without launch bounds), on the ResNet-50 /
# VGG-16 layers whose spaces give them those block sizes.
ISSUE_CONFIGS: tuple[tuple[str, Workload, int, int], ...] = (
    (INT8, int8_workload(64, 56, 64, 3, 1, 1), 43849449, 448),
    (DENSE_LARGE, dense_workload(DENSE_LARGE, 128, 4096, 4096), 1371, 1024),
    (CONV, conv_workload(1, 64, 56, 64, 3, 1, 1), 22863882, 392),
)


def _entries(template: str, wl: Workload, config: Config) -> list[tuple[str, int]]:
    """(entry, threads per block) of each launch of the config's kernel."""
    k = get_template(template).codegen(wl, config, dialect="cuda")
    launches = [(s.entry, s.block) for s in k.stages] or [(k.entry, k.block)]
    return [(entry, int(np.prod(block))) for entry, block in launches]


@pytest.mark.parametrize("template", list(LAYERS))
def test_cuda_kernels_carry_launch_bounds_and_opencl_ones_are_unchanged(template: str) -> None:
    tmpl, wl = get_template(template), LAYERS[template]
    config = tmpl.default_config(wl)
    cuda = tmpl.codegen(wl, config, dialect="cuda").source
    for entry, threads in _entries(template, wl, config):
        assert f"KERNEL void LAUNCH_BOUNDS({threads}) {entry}(" in cuda
    assert "#define LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)" in cuda
    opencl = tmpl.codegen(wl, config, dialect="opencl").source
    assert "#define LAUNCH_BOUNDS(threads)\n" in opencl
    assert "__launch_bounds__" not in opencl and "reqd_work_group_size" not in opencl


def _grid_refusals(template: str, wl: Workload, axis: str) -> None:
    """Some config of ``wl`` has a grid past CUDA's limit on ``axis``: it is refused for
    CUDA (and when the dialect is unknown) with a message naming the axis, by both
    ``check_limits`` and ``valid_mask``, and accepted for OpenCL."""
    tmpl = get_template(template)
    space = tmpl.space(wl)
    indices = np.arange(len(space), dtype=np.int64)
    limits = DeviceLimits()
    cuda_ok = tmpl.valid_mask(wl, indices, limits, "cuda")
    opencl_ok = tmpl.valid_mask(wl, indices, limits, "opencl")
    over = np.flatnonzero(opencl_ok & ~cuda_ok)
    assert over.size, "no config passes CUDA's grid limit"
    config = space.get(int(over[0]))
    cap = GRID_LIMITS["cuda"]["xyz".index(axis)]
    problems = tmpl.check_limits(wl, config, limits, "cuda")
    assert len(problems) == 1 and re.fullmatch(
        rf"\d+ blocks in grid {axis} > {cap} \(CUDA's gridDim\.{axis} limit\)", problems[0]
    ), problems
    assert int(problems[0].split()[0]) > cap
    assert tmpl.check_limits(wl, config, limits) == problems
    assert tmpl.check_limits(wl, config, limits, "opencl") == []
    assert not tmpl.valid_mask(wl, over[:1], limits)[0]


def test_depthwise_at_batch_128_refuses_channel_blocks_past_grid_z() -> None:
    # 1024 channels at batch 128: n * channel blocks on z reaches 131,072
    _grid_refusals(DEPTHWISE, depthwise_workload(128, 1024, 7), "z")


def test_dense_small_batch_refuses_a_batch_past_grid_y() -> None:
    _grid_refusals(DENSE_SMALL, dense_workload(DENSE_SMALL, 70000, 64, 10), "y")


def test_grid_within_limits_is_accepted() -> None:
    wl = depthwise_workload(1, 1024, 7)
    tmpl = get_template(DEPTHWISE)
    indices = np.arange(len(tmpl.space(wl)), dtype=np.int64)
    limits = DeviceLimits()
    assert np.array_equal(tmpl.valid_mask(wl, indices, limits, "cuda"),
                          tmpl.valid_mask(wl, indices, limits, "opencl"))


# ---- registers: nvcc --resource-usage over sampled valid configs ----

def _trials() -> list[tuple[str, str, int, list[tuple[str, int]]]]:
    """(label, CUDA source with entries renamed ``{entry}_{i}``, i, [(renamed entry,
    threads)]) of the sampled configs of every template and the issue's three."""
    cases = [(t, wl, c) for t, wl in LAYERS.items()
             for c in draw_valid_configs(get_template(t), wl, "launch_limits", PER_TEMPLATE)]
    for template, wl, index, threads in ISSUE_CONFIGS:
        tmpl = get_template(template)
        config = tmpl.space(wl).get(index)
        assert not tmpl.check_limits(wl, config, DeviceLimits()), (template, index)
        assert [t for _, t in _entries(template, wl, config)] == [threads]
        cases.append((template, wl, config))
    out = []
    for i, (template, wl, config) in enumerate(cases):
        src = get_template(template).codegen(wl, config, dialect="cuda").source
        entries = _entries(template, wl, config)
        for entry, _ in entries:
            src = re.sub(rf"\b{entry}\b", f"{entry}_{i}", src)
        out.append((f"{template} index {config.index}", src, i,
                    [(f"{e}_{i}", t) for e, t in entries]))
    return out


def _resource_usage(path: Path, arch: str) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    return subprocess.run([NVCC, "-cubin", f"-arch={arch}", "--resource-usage", str(path),
                           "-o", str(path.with_suffix(f".{arch}.cubin"))],
                          capture_output=True, text=True, timeout=300, check=False)


def _registers(ptxas: str) -> dict[str, int]:
    """Registers per entry from ptxas's ``--resource-usage`` report."""
    found = re.findall(r"Function properties for (\w+)\n.*?Used (\d+) registers", ptxas, re.DOTALL)
    return {name: int(n) for name, n in found}


def _block_registers(registers: int, threads: int) -> int:
    """Registers a block takes: allocated per warp, in units of 256."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    return per_warp * math.ceil(threads / 32)


@pytest.mark.slow
@needs_nvcc
def test_every_sampled_kernel_fits_the_register_file(tmp_path: Path) -> None:
    trials = _trials()
    path = tmp_path / "launch_limits.cu"
    path.write_text("\n".join(src for _, src, _, _ in trials))
    archs = ("sm_80", "sm_90")
    with ThreadPoolExecutor(2) as ex:
        done = dict(zip(archs, ex.map(lambda a: _resource_usage(path, a), archs)))
    problems = []
    for arch, proc in done.items():
        assert proc.returncode == 0, proc.stderr[-4000:]
        registers = _registers(proc.stdout + proc.stderr)
        for label, _, _, entries in trials:
            for entry, threads in entries:
                assert entry in registers, f"{arch}: no resource usage for {entry}"
                r = registers[entry]
                if r > MAX_REGISTERS or _block_registers(r, threads) > REGISTER_FILE:
                    problems.append(f"{arch} {label} {entry}: {r} registers x {threads} threads")
    assert not problems, "\n".join(problems)

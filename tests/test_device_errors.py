"""Device errors cost one trial (issue 15, points 1 and 4).

A trial that ends in a device error (error 4) is reported and its measuring child is
replaced, so the next good trial runs on a fresh device; every backend error becomes an
AutoTVM error number, never an exception out of ``measure()``; each trial starts clean
(outputs filled with NaN, modules not kept), and a build timeout kills the compiler's
processes with the child.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # so that this process and the measuring child find the helper
    sys.path.insert(0, str(HERE))

import broken_templates
from test_errors import (
    DENSE,
    FAST,
    HAS_OPENCL,
    RecordingDevice,
    dense_workload,
    needs_opencl,
    tile_k,
)

from compiler.runtime import opencl as opencl_backend
from compiler.runtime.device import HOLD_ENTRY
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest, measure
from schemas import DeviceLimits, MeasureErrorNo, MeasureOptions

OPTIONS = MeasureOptions(number=1, repeat=1, timeout_s=30)
LIMITS = DeviceLimits(max_threads_per_block=1024, max_thread_x=1024, max_thread_y=1024,
                      max_thread_z=64, max_shared_memory_per_block=48 * 1024, warp_size=32,
                      compute_units=1)


def request(name: str, options: MeasureOptions = OPTIONS) -> MeasureRequest:
    return MeasureRequest(name, dense_workload(name), tile_k(8), options)


def _bad_good_good(bad: str) -> None:
    """The bad trial is error 4 and replaces the child; the two good ones after it pass
    in the fresh child, which is kept between them."""
    with IsolatedMeasurer("opencl:0", extra_modules=(broken_templates.__name__,)) as m:
        m.start()
        first = m.pid
        results = [m.measure(request(bad))]
        assert m.pid is None  # killed: a device error leaves no child behind
        results.append(m.measure(request(DENSE)))
        second = m.pid
        results.append(m.measure(request(DENSE)))
        assert [r.error_no for r in results] == [4, 0, 0], [r.error_msg for r in results]
        assert second is not None and second != first
        assert m.pid == second


@needs_opencl
def test_kernel_refused_by_the_device_is_4_and_the_child_is_replaced() -> None:
    """A CL error at launch (a work-group over the device's limit), reported by the child."""
    _bad_good_good(broken_templates.BROKEN_LAUNCH.name)


@needs_opencl
def test_kernel_that_faults_is_4_and_the_child_is_replaced() -> None:
    """A store 4 TiB out of bounds: PoCL's process crashes (or reports a CL error)."""
    _bad_good_good(broken_templates.BROKEN_FAULT.name)


@needs_opencl
def test_launch_error_in_process_is_4() -> None:
    from compiler.runtime.opencl import OpenCLDevice

    result = measure(OpenCLDevice(0), request(broken_templates.BROKEN_LAUNCH.name))
    assert result.error_no == MeasureErrorNo.RUNTIME_DEVICE
    assert "kernel failed on the device" in (result.error_msg or "")


@needs_opencl
def test_output_the_kernel_skips_is_nan_not_the_last_trial() -> None:
    """A good trial leaves the right answer in freed memory; a kernel that writes nothing
    must not pass on it: its output starts as NaN."""
    from compiler.runtime.opencl import OpenCLDevice

    device = OpenCLDevice(0)
    assert measure(device, request(DENSE)).error_no == MeasureErrorNo.NO_ERROR
    skip = measure(device, request(broken_templates.BROKEN_SKIP.name))
    assert skip.error_no == MeasureErrorNo.WRONG_ANSWER
    assert skip.error_msg == "output has NaN or Inf"


@needs_opencl
def test_modules_are_not_kept_across_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same config twice is built twice: no trial runs on another trial's module."""
    from compiler.runtime.opencl import OpenCLDevice

    builds: list[str] = []
    real_build = opencl_backend._build

    def counting_build(cl: Any, ctx: Any, source: str) -> Any:
        if HOLD_ENTRY not in source:  # the timing's hold kernel is the device's own
            builds.append(source)
        return real_build(cl, ctx, source)

    monkeypatch.setattr(opencl_backend, "_build", counting_build)
    device = OpenCLDevice(0)
    for _ in range(2):
        assert measure(device, request(DENSE)).error_no == MeasureErrorNo.NO_ERROR
    assert len(builds) == 2 and builds[0] == builds[1]


def _gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (exited, or a zombie waiting for its new parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL device (PoCL) here")
def test_build_timeout_kills_the_compiler_process(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's process group goes with it: a compiler stuck in a build dies too."""
    pidfile = tmp_path / "compiler.pid"
    monkeypatch.setenv(broken_templates.BrokenCompiler.PIDFILE_ENV, str(pidfile))
    options = MeasureOptions(number=1, repeat=1, timeout_s=3)
    with IsolatedMeasurer("opencl:0", extra_modules=(broken_templates.__name__,)) as m:
        m.start()
        result = m.measure(request(broken_templates.BROKEN_COMPILER.name, options))
        assert result.error_no == MeasureErrorNo.BUILD_TIMEOUT, result.error_msg
        compiler = int(pidfile.read_text())
        deadline = time.time() + 10
        while not _gone(compiler) and time.time() < deadline:
            time.sleep(0.1)
        assert _gone(compiler), f"compiler process {compiler} outlived the build timeout"
        after = m.measure(request(DENSE))
        assert after.error_no == MeasureErrorNo.NO_ERROR, after.error_msg


# --- backend errors of every stage become error numbers (no device needed) -------------


class FailingDevice(RecordingDevice):
    """Raises ``error`` (of any type, as a backend library would) at one stage."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(LIMITS)
        self.stage, self.error = stage, error

    def _fail(self, stage: str) -> None:
        if stage == self.stage:
            raise self.error

    def _compile(self, source: str) -> Any:
        self._fail("compile")
        return object()

    def _function(self, module: Any, entry: str) -> Any:
        self._fail("function")
        return object()

    def upload(self, array: np.ndarray) -> Any:
        self._fail("upload")
        return object()

    def alloc_bytes(self, nbytes: int) -> Any:
        self._fail("alloc")
        return object()

    def write(self, buffer: Any, array: np.ndarray) -> None:
        self._fail("write")

    def download(self, buffer: Any, shape: tuple[int, ...],
                 dtype: str = "float32") -> np.ndarray:
        self._fail("download")
        return np.zeros(shape, dtype=dtype)

    def _enqueue(self, function: Any, grid: tuple[int, int, int],
                 block: tuple[int, int, int], buffers: list[Any], timed: bool) -> Any:
        self._fail("launch")
        return object()

    def synchronize(self) -> None:
        self._fail("sync")


@pytest.mark.parametrize("stage", ["compile", "function", "upload", "alloc", "write",
                                   "launch", "sync", "download"])
@pytest.mark.parametrize("error", [RuntimeError("cuModuleLoadData failed: out of memory"),
                                   MemoryError(), OSError("copy failed")])
def test_any_backend_error_is_4_not_an_exception(stage: str, error: BaseException) -> None:
    result = measure(FailingDevice(stage, error), request(DENSE, FAST))
    assert result.error_no == MeasureErrorNo.RUNTIME_DEVICE, result.error_msg
    assert type(error).__name__ in (result.error_msg or "")


# pycuda's errors (allocation, copies, module load, kernel lookup) on the CUDA backend:
# tests/test_cuda_contexts.py, over a fake driver that keeps CUDA's context rules.


def test_measuring_child_leads_its_own_process_group() -> None:
    """So that killing the group on a timeout reaches nvcc/ptxas and not the caller."""
    if not HAS_OPENCL:
        pytest.skip("no OpenCL device (PoCL) here")
    with IsolatedMeasurer("opencl:0") as m:
        m.start()
        assert m.pid is not None and os.getpgid(m.pid) == m.pid != os.getpgid(0)

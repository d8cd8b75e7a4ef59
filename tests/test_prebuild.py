"""A leased batch's kernels built ahead in builder processes (issue 17, point 6).

The builders fill the kernel cache the measuring child then loads from; whatever they
could not build (a compile error, a crash, a compiler that hangs) the measuring child
builds again and reports with its own error number, so results are the same with and
without building ahead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # so that this process and the children find the helper
    sys.path.insert(0, str(HERE))

import broken_templates
from test_errors import DENSE, FAST, HAS_OPENCL, dense_workload, tile_k

from compiler.runtime import child
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest
from compiler.runtime.prebuild import SWITCH_ENV, lease_batch, prebuild_enabled
from compiler.templates import get_template
from schemas import MeasureErrorNo, MeasureOptions, MeasureResult, Workload

needs_opencl = pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL device (PoCL) here")
EXTRA = (broken_templates.__name__,)
WINOGRAD, DIRECT = "conv2d_NCHWc_winograd.x86", "conv2d_NCHWc.x86"
SMALL_CONV: list[Any] = [["TENSOR", [1, 16, 12, 12], "float32"],
                         ["TENSOR", [16, 16, 3, 3], "float32"], [1, 1], [1, 1, 1, 1], [1, 1],
                         "NCHW", "NCHW", "float32"]


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kernel cache of this test's own: nothing is found compiled by an earlier run."""
    cache = tmp_path / "kernels"
    monkeypatch.setenv(child.CACHE_ENV, str(cache))
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    monkeypatch.delenv("POCL_KERNEL_CACHE", raising=False)
    return cache


def dense(inner: int, template: str = DENSE,
          options: MeasureOptions = FAST) -> MeasureRequest:
    return MeasureRequest(template, dense_workload(template), tile_k(inner), options)


def cache_files(cache: Path) -> dict[str, int]:
    """Every file the driver wrote (path -> mtime), but its access stamps."""
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*")
            if p.is_file() and p.name != "last_accessed"}


def outcome(result: MeasureResult) -> tuple[int, str]:
    """The error number and message, less what differs between any two builds (the
    driver's temporary file, a device object's address)."""
    message = "" if result.ok else str(result.error_msg)
    message = re.sub(r"\S*tempfile_\w+", "<file>", message)
    return int(result.error_no), re.sub(r"0x[0-9a-f]+", "<address>", message)


def test_the_kernel_cache_is_ours_and_shared_by_every_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(child.CACHE_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv(child.POCL_CACHE_ENV, str(tmp_path / "pocl's"))
    assert child.kernel_cache_dir() == tmp_path / "mine"
    assert child.child_env()[child.POCL_CACHE_ENV] == str(tmp_path / "mine")
    monkeypatch.delenv(child.CACHE_ENV)
    assert child.kernel_cache_dir() == tmp_path / "pocl's"  # a user's own choice stays
    monkeypatch.delenv(child.POCL_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert child.kernel_cache_dir() == tmp_path / "xdg" / "tuner" / "kernels"


# Run in a child: ``_cl`` points PoCL's cache once per process (``opencl._cache_shared``).
CL_CACHE_SCRIPT = """
import os, sys, tempfile
from pathlib import Path

cache = Path(sys.argv[1])
if sys.argv[2] == "unwritable":
    cache.mkdir()
    cache.chmod(0o555)
    if os.geteuid() == 0:  # root writes past the mode bits: the refusal is simulated
        create = tempfile.TemporaryFile

        def refuse(*args, **kwargs):
            if Path(kwargs.get("dir") or "") == cache:
                raise PermissionError(13, "Permission denied", str(cache))
            return create(*args, **kwargs)

        tempfile.TemporaryFile = refuse
from compiler.runtime import opencl

try:
    opencl._cl()
except ImportError:  # no pyopencl: the cache was chosen before the import
    pass
print(os.environ.get("POCL_CACHE_DIR", "<unset>"))
"""


@pytest.mark.parametrize("kind", ["writable", "unwritable"])
def test_an_unwritable_kernel_cache_is_not_given_to_pocl(tmp_path: Path, kind: str) -> None:
    """A cache folder that exists but takes no file leaves POCL_CACHE_DIR unset (PoCL keeps
    its default cache) instead of a cache PoCL cannot save kernels in."""
    cache = tmp_path / "kernels"
    env = {k: v for k, v in os.environ.items() if k != child.POCL_CACHE_ENV}
    env.update({child.CACHE_ENV: str(cache), "PYTHONPATH": str(HERE.parent)})
    try:
        done = subprocess.run([sys.executable, "-c", CL_CACHE_SCRIPT, str(cache), kind],
                              env=env, cwd=HERE.parent, capture_output=True, text=True,
                              timeout=120, check=True)
    finally:
        if cache.exists():
            cache.chmod(0o755)  # so that pytest can remove it
    assert done.stdout.strip() == (str(cache) if kind == "writable" else "<unset>")
    assert list(cache.iterdir()) == []  # the probe's file is gone


def test_the_switch_turns_building_ahead_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert prebuild_enabled() and lease_batch() >= 4
    monkeypatch.setenv(SWITCH_ENV, "0")
    assert not prebuild_enabled() and lease_batch() == 1
    with IsolatedMeasurer("opencl:0") as m:  # no child is even started
        assert m.prebuild([dense(2), dense(4)]) is None
        assert m.pid is None


@needs_opencl
def test_a_batch_is_built_in_builder_processes_and_the_measurer_compiles_nothing(
        kernel_cache: Path) -> None:
    requests = [dense(2), dense(4), dense(8)]
    with IsolatedMeasurer("opencl:0") as m:
        m.start()
        report = m.prebuild(requests)
        assert report is not None and report.outcomes == ["", "", ""], report
        assert report.builder_pids and not report.builder_pids & {os.getpid(), m.pid}
        built = cache_files(kernel_cache)
        assert sum(p.endswith("program.bc") for p in built) == 3
        assert sum(p.endswith(".so") for p in built) == 3  # each launched: its WG function
        results = [m.measure(r) for r in requests]
        assert all(r.ok for r in results), [r.error_msg for r in results]
        # the measuring child loaded every kernel from the cache: nothing written again
        assert cache_files(kernel_cache) == built


def test_a_builder_launches_one_work_group_per_stage() -> None:
    """What compiles the work-group function (PoCL keys it by the local size, not by the
    number of groups) without running the whole kernel beside the other builds."""
    from compiler.runtime.prebuild import one_group

    workload = Workload(template=WINOGRAD, args=SMALL_CONV)
    kernel = get_template(WINOGRAD).codegen(workload, get_template(WINOGRAD).default_config(
        workload), "opencl")
    assert len(kernel.stages) == 3 and kernel.grid != (1, 1, 1)
    launched = one_group(kernel)
    assert launched.grid == (1, 1, 1) and launched.block == kernel.block
    assert [s.grid for s in launched.stages] == [(1, 1, 1)] * 3
    assert [(s.entry, s.block, s.args) for s in launched.stages] == [
        (s.entry, s.block, s.args) for s in kernel.stages]
    assert launched.source == kernel.source


@needs_opencl
def test_warm_launches_one_work_group_per_stage(device: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``warm`` builds and launches ``one_group(kernel)``, not the whole grid."""
    from compiler.runtime.prebuild import warm

    launched: list[Any] = []
    monkeypatch.setattr(device, "run", lambda program, kernel, buffers: launched.append(
        kernel))
    for name in (WINOGRAD, DIRECT):
        workload = Workload(template=name, args=SMALL_CONV)
        request = MeasureRequest(name, workload, get_template(name).default_config(workload),
                                 FAST)
        assert warm(device, request, launch=True) == (0, "")
    assert [len(k.stages) for k in launched] == [3, 0]  # Winograd's three, the direct one
    grids = [k.grid for k in launched] + [s.grid for k in launched for s in k.stages]
    assert grids == [(1, 1, 1)] * 5


@needs_opencl
def test_one_work_group_ahead_compiles_what_the_whole_launch_needs(
        kernel_cache: Path) -> None:
    """Conv kernels of many work-groups, one of them in three stages: the measuring child
    runs every group of them and compiles nothing the builders' one-group launch did not."""
    requests = [MeasureRequest(name, workload, get_template(name).default_config(workload),
                               FAST)
                for name in (WINOGRAD, DIRECT)
                for workload in [Workload(template=name, args=SMALL_CONV)]]
    with IsolatedMeasurer("opencl:0") as m:
        m.start()
        report = m.prebuild(requests)
        assert report is not None and report.outcomes == ["", ""], report
        built = cache_files(kernel_cache)
        assert sum(p.endswith(".so") for p in built) == 4  # 3 stages + 1
        results = [m.measure(r) for r in requests]
        assert all(r.ok for r in results), [r.error_msg for r in results]
        assert cache_files(kernel_cache) == built


@needs_opencl
def test_what_fails_ahead_is_reported_by_the_measuring_child() -> None:
    """A compile error stays error 3 and a kernel that crashes its builder error 4; the
    builder it killed is replaced and the good kernels of the batch are still built."""
    requests = [dense(8, broken_templates.BROKEN_FAULT.name),
                dense(8, broken_templates.BROKEN_COMPILE.name), dense(2), dense(4)]
    with IsolatedMeasurer("opencl:0", extra_modules=EXTRA) as m:
        m.start()
        report = m.prebuild(requests)
        assert report is not None
        assert report.outcomes[0].startswith("not built: the builder died"), report
        assert report.outcomes[1].startswith("error 3: device compiler failed"), report
        assert report.outcomes[2:] == ["", ""], report
        results = [m.measure(r) for r in requests]
    assert [r.error_no for r in results] == [
        MeasureErrorNo.RUNTIME_DEVICE, MeasureErrorNo.COMPILE_DEVICE,
        MeasureErrorNo.NO_ERROR, MeasureErrorNo.NO_ERROR]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@needs_opencl
def test_a_hanging_compiler_ahead_costs_its_deadline_not_the_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "compiler.pid"
    monkeypatch.setenv(broken_templates.BrokenCompiler.PIDFILE_ENV, str(pidfile))
    short = MeasureOptions(number=1, repeat=1, timeout_s=3)
    requests = [dense(8, broken_templates.BROKEN_COMPILER.name, short), dense(2), dense(4)]
    with IsolatedMeasurer("opencl:0", extra_modules=EXTRA) as m:
        m.start()
        began = time.time()
        report = m.prebuild(requests)
        took = time.time() - began
        assert report is not None
        assert report.outcomes == ["not built: past its 3 s", "", ""], report
        # the "compiler" sleeps 300 s: the batch did not wait it out (a loose bound, as
        # the other two kernels' builds take what the machine's load makes them)
        assert took < 150, f"the batch took {took:.1f} s to build ahead"
        compiler = int(pidfile.read_text())
        deadline = time.time() + 10
        while not _gone(compiler) and time.time() < deadline:
            time.sleep(0.1)
        assert _gone(compiler), f"compiler {compiler} outlived its builder's deadline"
        results = [m.measure(r) for r in requests]
    assert [r.error_no for r in results] == [
        MeasureErrorNo.BUILD_TIMEOUT, MeasureErrorNo.NO_ERROR, MeasureErrorNo.NO_ERROR]


@needs_opencl
def test_results_are_the_same_with_and_without_building_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = [dense(2), dense(8, broken_templates.BROKEN_COMPILE.name), dense(4),
                dense(8, broken_templates.BROKEN_WRONG.name), dense(3)]  # 3 does not divide
    runs = []
    for switch in ("0", "1"):  # each with a cache of its own: no run finds the other's
        monkeypatch.setenv(SWITCH_ENV, switch)
        monkeypatch.setenv(child.CACHE_ENV, str(tmp_path / f"kernels-{switch}"))
        with IsolatedMeasurer("opencl:0", extra_modules=EXTRA) as m:
            report = m.prebuild(requests)
            assert (report is None) == (switch == "0")
            runs.append([outcome(m.measure(r)) for r in requests])
    assert runs[0] == runs[1]
    assert [n for n, _ in runs[0]] == [0, 3, 0, 5, 1]


@needs_opencl
def test_builds_may_overlap_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU: prebuild returns at once and the batch builds while trials are
    measured; a trial waits for the builders' try at its kernel first (here a compiler
    that hangs: its 3 s in a builder, then 3 s in the measuring child)."""
    monkeypatch.setenv(broken_templates.BrokenCompiler.PIDFILE_ENV, str(tmp_path / "pid"))
    short = MeasureOptions(number=1, repeat=1, timeout_s=3)
    requests = [dense(8, broken_templates.BROKEN_COMPILER.name, short), dense(2), dense(4)]
    with IsolatedMeasurer("opencl:0", extra_modules=EXTRA) as m:
        m.start()
        began = time.time()
        assert m.prebuild(requests, overlap=True) is None
        assert time.time() - began < 3  # it did not wait for the hanging compiler
        hung = m.measure(requests[0])
        assert time.time() - began >= 2 * 3 - 0.5, "the trial did not wait for its builder"
        assert hung.error_no == MeasureErrorNo.BUILD_TIMEOUT, hung.error_msg
        results = [m.measure(r) for r in requests[1:]]
        assert all(r.ok for r in results), [r.error_msg for r in results]


@needs_opencl
def test_a_stopped_batch_leaves_no_build_to_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build still running when ``stop`` turns true is killed with the batch: its
    answer (or its deadline) must not settle an index of the next batch."""
    from compiler.runtime.prebuild import BuildPool

    pidfile = tmp_path / "compiler.pid"
    monkeypatch.setenv(broken_templates.BrokenCompiler.PIDFILE_ENV, str(pidfile))
    short = MeasureOptions(number=1, repeat=1, timeout_s=3)
    pool = BuildPool("opencl:0", EXTRA, size=2)
    try:
        first = pool.prebuild([dense(2), dense(8, broken_templates.BROKEN_COMPILER.name, short)],
                              stop=pidfile.exists)
        assert first.outcomes[1] == "not built: stopped", first
        settled: list[int] = []
        second = pool.prebuild([dense(4)], settled=settled.append)
        assert second.outcomes == [""] and settled == [0], second
    finally:
        pool.close()


@needs_opencl
def test_the_largest_sources_are_built_first_once_sized(device: Any) -> None:
    """``largest_first``: one builder sizes the batch (a code generation each), then
    builds its kernels largest source first; a config whose code generation fails is
    settled at its sizing with the error the measuring child reports, and not built."""
    from compiler.runtime.measure import request_kernel
    from compiler.runtime.prebuild import BuildPool

    requests = [dense(2), dense(3), dense(8), dense(4)]  # 3 does not divide the extent
    sizes = {i: len(request_kernel(device, requests[i])[1].source) for i in (0, 2, 3)}
    largest = [1, *sorted(sizes, key=lambda i: -sizes[i])]
    assert len(set(sizes.values())) == 3 and largest != [1, 0, 2, 3], sizes
    pool = BuildPool("opencl:0", size=1)
    try:
        for largest_first, order in ((True, largest), (False, [0, 1, 2, 3])):
            settled: list[int] = []
            report = pool.prebuild(requests, settled=settled.append,
                                   largest_first=largest_first)
            assert settled == order, (largest_first, settled)
            assert report.outcomes[1].startswith("error 1: "), report
            assert report.outcomes[:1] + report.outcomes[2:] == ["", "", ""], report
    finally:
        pool.close()


@needs_opencl
def test_a_code_generation_that_hangs_holds_up_its_builder_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizing runs each template's code generation in a builder: one that hangs costs
    that builder its deadline (then it is killed, with the compiler it ran), while the
    other builder builds the rest of the batch (before, every build waited for it)."""
    from compiler.runtime.prebuild import BuildPool

    pidfile = tmp_path / "compiler.pid"
    monkeypatch.setenv(broken_templates.BrokenCompiler.PIDFILE_ENV, str(pidfile))
    hangs = MeasureOptions(number=1, repeat=1, timeout_s=20)  # room for 2 builds under load
    requests = [dense(8, broken_templates.BROKEN_COMPILER.name, hangs), dense(2), dense(4)]
    pool = BuildPool("opencl:0", EXTRA, size=2)
    try:
        settled: list[int] = []
        report = pool.prebuild(requests, settled=settled.append, largest_first=True)
    finally:
        pool.close()
    assert report.outcomes == ["not built: past its 20 s", "", ""], report
    assert settled[-1] == 0, settled  # the others built while that builder hung
    compiler = int(pidfile.read_text())
    deadline = time.time() + 10
    while not _gone(compiler) and time.time() < deadline:
        time.sleep(0.1)
    assert _gone(compiler), f"compiler {compiler} outlived its builder's deadline"


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_standalone_worker_leases_a_batch_for_its_builders(
        switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tuner worker`` without --batch leases what the embedded worker leases: a batch for
    its builders to build ahead, one trial with building ahead off; --batch still wins."""
    from typer.testing import CliRunner

    import cli.worker
    from cli.main import app

    monkeypatch.setenv(SWITCH_ENV, switch)
    made: list[int] = []

    class Agent:  # records the batch it was given; measures nothing
        def __init__(self, server: str, token: str, device: str | None, name: str | None,
                     batch: int) -> None:
            made.append(batch)

        def stop_on_signals(self) -> None:
            pass

        def run(self, max_trials: int | None = None) -> int:
            return 0

    monkeypatch.setattr(cli.worker, "WorkerAgent", Agent)
    base = ["worker", "--server", "http://127.0.0.1:9", "--token", "t", "--device", "opencl:0"]
    runner = CliRunner()
    assert runner.invoke(app, base).exit_code == 0
    assert runner.invoke(app, [*base, "--batch", "3"]).exit_code == 0
    expected = lease_batch()
    assert made == [expected, 3]
    assert (expected == 1) == (switch == "0")  # a batch only where builders build it

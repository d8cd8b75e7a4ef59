"""Shared fixtures: the local OpenCL device, a pool of isolated measurers, real layer shapes."""

from __future__ import annotations

import atexit
import json
import os
import queue
import random
import re
import shutil
import subprocess
import tempfile
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from compiler.layout_tune import CACHE_ENV as LAYOUT_CACHE_ENV
from compiler.records.pretuned import TOPHUB_DIR as TOPHUB_LOGS
from compiler.runtime.child import CACHE_ENV
from compiler.runtime.device import Device
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest
from compiler.templates import (
    ConfigError,
    Epilogue,
    IOLayout,
    Prologue,
    Template,
    WorkloadError,
    get_template,
    prefetch,
)
from compiler.templates.base import blocked_shape, from_blocked, to_blocked
from schemas import Config, DeviceLimits, MeasureResult, Record, Workload
from schemas.record import read_lines

# Every CUDA source a test writes is compiled for this GPU generation (no GPU needed).
NVCC = shutil.which("nvcc") or shutil.which("/usr/local/bin/nvcc")
NVCC_ARGS = ("-ptx", "-arch=sm_80")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources not compiled")


def nvcc_ptx(source: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``nvcc -ptx -arch=sm_80 SOURCE -o SOURCE.ptx``."""
    assert NVCC is not None
    return subprocess.run([NVCC, *NVCC_ARGS, str(source), "-o", str(source.with_suffix(".ptx"))],
                          capture_output=True, text=True, timeout=timeout)

REPO = Path(__file__).resolve().parents[1]

# One kernel cache for the whole run, in a folder of the run's own (the tests read
# nothing outside the repository and their temp dirs), pinned before any test points
# XDG_CACHE_HOME elsewhere: every device-owning child (and every `tuner` a test starts)
# then finds a kernel another test compiled, so PoCL compiles each kernel once a run, not
# once a test. A TUNER_KERNEL_CACHE the user set is kept; tests/test_prebuild.py gives
# each of its tests an empty one.
if CACHE_ENV not in os.environ:
    _RUN_KERNELS = tempfile.mkdtemp(prefix="tuner-test-kernels-")
    atexit.register(shutil.rmtree, _RUN_KERNELS, ignore_errors=True)
    os.environ[CACHE_ENV] = _RUN_KERNELS
# Likewise the layout read-cost cache (``build(graph_tune=True)``, ``tuner compile
# --graph-tune``): one file of the run's own, not ~/.cache/tuner/layout_costs.json.
if LAYOUT_CACHE_ENV not in os.environ:
    _RUN_LAYOUTS = tempfile.mkdtemp(prefix="tuner-test-layouts-")
    atexit.register(shutil.rmtree, _RUN_LAYOUTS, ignore_errors=True)
    os.environ[LAYOUT_CACHE_ENV] = os.path.join(_RUN_LAYOUTS, "layout_costs.json")

TOPHUB_DIR = TOPHUB_LOGS


def _utf8(value: object) -> object:
    """``value`` (a report's JSON form) with every lone surrogate escaped (``\\ud800``)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_utf8(v) for v in value)
    return value


# The files that took longest in a serial run (``--durations=0``, 2026-12-07: 195 s down
# to 57 s, 60% of the suite), run first: under ``make test`` each worker takes a file at a
# time (``--dist loadfile``), and a long file handed out last would run alone at the end.
# The other files keep their order.
LONGEST_FIRST = ("test_templates_opencl.py", "test_conv2d_nchwc.py", "test_models.py",
                 "test_blocked_layout.py", "test_onnx_conformance.py",
                 "test_dashboard_browser.py", "test_faults.py", "test_dense_pack.py",
                 "test_fleet.py", "test_python_api.py", "test_dashboard.py",
                 "test_winograd_cpu.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    place = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.path.name, len(place)))


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(
        report: pytest.TestReport) -> Generator[None, object, object]:
    """A test worker (``pytest -n``) sends its reports to the controller as UTF-8: a test
    whose captured log holds a lone surrogate (bad input is logged as it came) would end
    the worker, and its remaining tests would not run."""
    return _utf8((yield))


@pytest.hookimpl(tryfirst=True)
def pytest_warning_recorded(warning_message: warnings.WarningMessage) -> None:
    """Likewise a warning a test raised: its text is escaped before a test worker sends
    it (xdist's own serializer, which the report hook above does not reach; a historic
    hook takes no wrapper, so this runs first and escapes it in place)."""
    message = warning_message.message
    if isinstance(message, Warning):
        message.args = _utf8(message.args)  # type: ignore[assignment]


# A typical GPU's per-block limits, with the register tile capped at 64 accumulators:
# what the random sweeps of the GPU templates draw their configs under.
GPU_LIMITS = DeviceLimits(max_threads_per_block=1024, max_thread_x=1024, max_thread_y=1024,
                          max_thread_z=64, max_shared_memory_per_block=48 * 1024,
                          max_local_elements=64)


def draw_valid_configs(template: Template, wl: Workload, name: str, count: int,
                       limits: DeviceLimits = GPU_LIMITS) -> tuple[Config, ...]:
    """``count`` distinct configs of ``wl`` that fit ``limits``, drawn with a seed fixed
    by the template's name and ``name`` (the layer's)."""
    rng = random.Random(zlib.crc32(f"{template.name}/{name}".encode()))
    found: dict[int, Config] = {}
    while len(found) < count:
        config = template.random_config(wl, rng, limits)
        found.setdefault(config.index, config)
    return tuple(found.values())


def read_tophub(template: str, logs: Iterable[str]) -> tuple[tuple[str, int, Record], ...]:
    """(log, line number, record) of every ``template`` record of TopHub's ``logs``."""
    out = []
    for log in logs:
        with (TOPHUB_DIR / log).open() as f:
            out += [(log, n, rec) for n, rec in read_lines(f)
                    if not isinstance(rec, Exception) and rec.workload.template == template]
    return tuple(out)


def index_matches(template: Template, rec: Record) -> bool:
    """Whether our index of the record's decoded entity is the record's own."""
    space = template.space(rec.workload)
    return space.index_of(template.decode(rec.workload, rec.config)) == rec.config.index


def cuda_sources(template: Template, trials: Sequence[tuple[Workload, Config, Epilogue]],
                 entries: Sequence[str]) -> list[tuple[str, str]]:
    """(label, CUDA source) of each trial, every kernel entry of trial i renamed
    ``{entry}_i`` so that one file can hold them all."""
    out = []
    for i, (wl, config, ep) in enumerate(trials):
        src = template.codegen(wl, config, dialect="cuda", epilogue=ep).source
        for entry in entries:
            assert src.count(entry) == 1
            src = src.replace(entry, f"{entry}_{i}")
        out.append((f"workload {json.dumps(wl.args_json())} epilogue {ep.ops} "
                    f"config {json.dumps(config.to_json())}", src))
    return out


def nvcc_batches(tmp_path: Path, cases: dict[str, list[tuple[str, str]]],
                 entries: Sequence[str],
                 nvcc: Callable[[Path], subprocess.CompletedProcess[str]] = nvcc_ptx
                 ) -> list[str]:
    """Compiles (``nvcc``: SOURCE -> SOURCE.ptx) each case's ``cuda_sources`` as one .cu
    file, two files at a time, and checks that a passing file's PTX has every renamed
    entry; a failing file is recompiled kernel by kernel to name the trials at fault.
    Returns the problems."""
    files = []
    for name, sources in cases.items():
        path = tmp_path / f"{re.sub(r'[^a-z0-9]+', '_', name)}.cu"
        path.write_text("\n".join(src for _, src in sources))
        files.append((path, sources))

    with ThreadPoolExecutor(2) as ex:
        done = list(ex.map(nvcc, [f[0] for f in files]))

    entry_re = re.compile(r"\.entry\s+((?:" + "|".join(map(re.escape, entries)) + r")_\d+)")
    problems = []
    for (path, sources), proc in zip(files, done):
        if proc.returncode == 0:
            found = set(entry_re.findall(path.with_suffix(".ptx").read_text()))
            assert found == {f"{e}_{i}" for e in entries for i in range(len(sources))}, path.name
            continue
        before = len(problems)
        for i, (label, src) in enumerate(sources):
            one = tmp_path / f"{path.stem}_{i}.cu"
            one.write_text(src)
            single = nvcc(one)
            if single.returncode != 0:
                problems.append(f"{label}:\n{single.stderr.strip()[:2000]}")
        if len(problems) == before:
            problems.append(f"{path.name} failed but every kernel compiles alone:\n"
                            f"{proc.stderr.strip()[:2000]}")
    return problems

CONV = "conv2d_nchw.cuda"
CONV_CPU = "conv2d_NCHWc.x86"
DENSE_SMALL = "dense_small_batch.gpu"
DENSE_LARGE = "dense_large_batch.gpu"


def run_blocked(device: Device, template: Template, wl: Workload, cfg: Config,
                epilogue: Epilogue, io: IOLayout, prologue: Prologue = Prologue()
                ) -> tuple[np.ndarray, np.ndarray]:
    """A blocked-IO CPU conv kernel's output (back in NCHW) and numpy's, for inputs in
    ``io``'s layouts; the output starts as NaN, so a pixel left unwritten shows. A
    prologue's scale and shift are drawn around 1 and 0 (a sign change in some)."""
    rng = np.random.default_rng(5)
    arrays = template.make_inputs(wl, epilogue, rng)
    channels = arrays[0].shape[1]
    vectors = {op: rng.uniform(*((-0.5, 1.5) if op == "scale" else (-0.5, 0.5)),
                               channels).astype(np.float32) for op in prologue.vector_ops}
    want = template.reference(wl, [prologue.apply(arrays[0], vectors), *arrays[1:]], epilogue)
    kernel = template.codegen(wl, cfg, device.dialect, epilogue, io, prologue)
    inputs = [to_blocked(arrays[0], io.data_block), template.pack_weight(wl, cfg, arrays[1])]
    if "bias" in epilogue.ops:
        inputs.append(arrays[2])
    if "add" in epilogue.ops:
        inputs.append(to_blocked(arrays[-1], io.residual_block))
    inputs += vectors.values()
    assert [a.shape for a in inputs] == [b.shape for b in kernel.buffers[:-1]]
    out_shape = kernel.buffers[-1].shape
    assert out_shape == blocked_shape(want.shape, io.out_block)
    program = device.build(kernel)
    buffers = [device.upload(np.ascontiguousarray(a)) for a in inputs]
    out = device.alloc(out_shape)
    device.write(out, np.full(out_shape, np.nan, dtype=np.float32))
    device.run(program, kernel, [*buffers, out])
    return from_blocked(device.download(out, out_shape), io.out_block), want


def next_block_prefetch(source: str, walks: Iterable[int], floats: int = 0
                        ) -> tuple[int, np.ndarray]:
    """Which floats of the next channel block a kernel's prefetch (``compiler.templates.
    prefetch``) brings in, parsed from its source: work-items 1.. of a block, a slice
    each (or, with no slices, one work-item the whole of the next one's ``floats``:
    ``wn = ... ? ub : ub + distance``), prefetch at each of ``walks`` (where the kernel
    is in its own weight, floats from its start; the caller's claim of the kernel's
    loop structure) the lines of the first chunk's PREFETCHes. Returns the distance to
    the next block and the mask of its floats covered; asserts that every prefetch
    lands inside it."""
    found = re.search(r"wk \+ (\d+) \+ \(int\)\(\(long\)\(\w+ - 1\) \* (\d+) / (\d+)\);",
                      source)
    lines = [line.strip() for line in source.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("GLOBAL const float* wf"))
    count = int(re.fullmatch(r".* / (\d+)\);", lines[first]).group(1))  # type: ignore[union-attr]
    if found:
        distance, block, slices = (int(g) for g in found.groups())
        assert distance == block and slices == count
        starts = [(place - 1) * block // count for place in range(1, count + 1)]
    else:
        whole = re.search(r"wn = .* \? (\w+) : \1 \+ (\d+);", source)
        assert whole and floats, "no slice start"
        distance, block, starts = int(whole.group(2)), floats, [0]
    offsets = []
    for line in lines[first + 1:]:
        match = re.fullmatch(r"PREFETCH\(wf \+ (\d+)\);", line)
        if match is None:
            break
        offsets.append(int(match.group(1)))
    covered = np.zeros(block, dtype=bool)
    for start in starts:
        for walk in walks:
            at = start + walk // count
            for offset in offsets:
                assert at + offset < block, (start, walk, offset)
                covered[at + offset:at + offset + prefetch.LINE] = True
    return distance, covered


def nchwc_workload(n: int, c: int, hw: int, co: int, k: int, stride: int, pad: int) -> Workload:
    """A square conv2d as AutoTVM's conv2d_NCHWc.x86 task writes it (8 args, NCHW)."""
    return Workload(template=CONV_CPU, args=[
        ["TENSOR", [n, c, hw, hw], "float32"], ["TENSOR", [co, c, k, k], "float32"],
        [stride, stride], [pad, pad, pad, pad], [1, 1], "NCHW", "NCHW", "float32"])


def nchwc_config(wl: Workload, **values: object) -> Config:
    """A conv2d_NCHWc.x86 config from inner factors (tile_ic=ic_bn, tile_oc=oc_bn,
    tile_ow=reg_n) and other knobs; vec 16, wg 1, kw unrolled and the loop knobs at their
    defaults (order_oc 0, unroll_ci 1) unless given."""
    template = get_template(CONV_CPU)
    op = template.parse(wl)
    full: dict[str, object] = {"vec": 16, "wg": 1, "order_oc": 0, "unroll_ci": 1}
    if op.kh == 1 and op.kw == 1:
        full["tile_oh"] = 1
    else:
        full["unroll_kw"] = True
    for name, extent in (("tile_ic", op.c), ("tile_oc", op.co), ("tile_ow", op.ow)):
        inner = values.pop(name)
        full[name] = (extent // inner, inner)  # type: ignore[operator]
    full.update(values)
    return template.space(wl).to_config(full)


def conv_workload(n: int, c: int, hw: int, co: int, k: int, stride: int, pad: int) -> Workload:
    """A square NCHW conv2d workload, serialised exactly like AutoTVM's task args."""
    return Workload(template=CONV, args=[
        ["TENSOR", [n, c, hw, hw], "float32"], ["TENSOR", [co, c, k, k], "float32"],
        [stride, stride], [pad, pad, pad, pad], [1, 1], "float32"])


def dense_workload(template: str, batch: int, in_dim: int, out_dim: int,
                   bias: bool = False) -> Workload:
    """A dense workload (data, weight, bias or null, out_dtype) as AutoTVM writes it."""
    return Workload(template=template, args=[
        ["TENSOR", [batch, in_dim], "float32"], ["TENSOR", [out_dim, in_dim], "float32"],
        ["TENSOR", [out_dim], "float32"] if bias else None, "float32"])


# Real layers at batch 1: ResNet-50 (the stem, 1x1 and 3x3 convs of stages 2-5, the
# stride-2 3x3 of v1.5's stage 3) and VGG-16's conv5 at 14x14.
RESNET50_CONV: dict[str, Workload] = {
    "resnet50.conv1.7x7s2": conv_workload(1, 3, 224, 64, 7, 2, 3),
    "resnet50.res2.1x1": conv_workload(1, 64, 56, 64, 1, 1, 0),
    "resnet50.res3.3x3": conv_workload(1, 128, 28, 128, 3, 1, 1),
    "resnet50.res3a.3x3s2": conv_workload(1, 128, 56, 128, 3, 2, 1),
    "resnet50.res4.1x1": conv_workload(1, 1024, 14, 256, 1, 1, 0),
    "resnet50.res5.3x3": conv_workload(1, 512, 7, 512, 3, 1, 1),
}
VGG16_CONV: dict[str, Workload] = {
    "vgg16.conv5.3x3": conv_workload(1, 512, 14, 512, 3, 1, 1),
}

# Classifier layers: ResNet-50 fc 2048->1000, VGG-16 fc6 25088->4096, fc7 4096->4096,
# fc8 4096->1000; small batches for the small-batch template, 32/64 for the large one.
DENSE_SMALL_WORKLOADS: dict[str, Workload] = {
    "resnet50.fc.b1": dense_workload(DENSE_SMALL, 1, 2048, 1000),
    "resnet50.fc.b8+bias": dense_workload(DENSE_SMALL, 8, 2048, 1000, bias=True),
    "vgg16.fc6.b1": dense_workload(DENSE_SMALL, 1, 25088, 4096),
    "vgg16.fc7.b2": dense_workload(DENSE_SMALL, 2, 4096, 4096),
    "vgg16.fc8.b4+bias": dense_workload(DENSE_SMALL, 4, 4096, 1000, bias=True),
}
DENSE_LARGE_WORKLOADS: dict[str, Workload] = {
    "resnet50.fc.b32": dense_workload(DENSE_LARGE, 32, 2048, 1000),
    "resnet50.fc.b64+bias": dense_workload(DENSE_LARGE, 64, 2048, 1000, bias=True),
    "vgg16.fc7.b64": dense_workload(DENSE_LARGE, 64, 4096, 4096),
    "vgg16.fc8.b32": dense_workload(DENSE_LARGE, 32, 4096, 1000),
    "vgg16.fc8.b32+bias": dense_workload(DENSE_LARGE, 32, 4096, 1000, bias=True),
}


def repro(request: MeasureRequest) -> str:
    """The `tuner measure` command that reruns one trial: what a failure message prints."""
    cmd = (f"tuner measure {request.template} --workload '{json.dumps(request.workload.args_json())}'"
           f" --config '{json.dumps(request.config.to_json())}' --device opencl:0")
    if request.epilogue.ops:
        cmd += f" --epilogue {','.join(request.epilogue.ops)}"
    return cmd


def assert_measured_ok(pool: MeasurePool, requests: Sequence[MeasureRequest], what: str,
                       labels: Sequence[str] | None = None) -> None:
    """Measures ``requests`` on ``pool``; fails naming each trial that did not match
    numpy ("N of M ``what`` failed", with the ``labels`` of the failed requests)."""
    results = pool.map(requests)
    failed = [(req, res) for req, res in results if not res.ok]
    where = ""
    if labels is not None:
        where = f" ({[label for label, (_, res) in zip(labels, results) if not res.ok]})"
    assert not failed, (f"{len(failed)} of {len(results)} {what}{where} failed:\n"
                        f"{describe_failures(failed)}")


def tophub_decode_failures(template: Template, records: Sequence[tuple[str, int, Record]]
                           ) -> tuple[dict[str, int], list[str]]:
    """Records per log, and one line per record (of ``read_tophub``) that does not
    decode to a config of our space; prints how many map."""
    per_log = Counter(log for log, _, _ in records)
    failures = []
    for log, line_no, rec in records:
        try:
            template.decode(rec.workload, rec.config)
        except (ConfigError, WorkloadError) as err:
            failures.append(f"{log}:{line_no} {json.dumps(rec.workload.args_json())}: {err}")
    print(f"\n{len(records) - len(failures)} of {len(records)} records map: {dict(per_log)}")
    return dict(per_log), failures


def describe_failures(pairs: Sequence[tuple[MeasureRequest, MeasureResult]]) -> str:
    """One paragraph per failed trial: error number, message, and how to reproduce it."""
    out = []
    for req, res in pairs:
        if not res.ok:
            out.append(f"error_no {int(res.error_no)} ({res.error_no.name}): {res.error_msg}\n"
                       f"  {repro(req)}")
    return "\n".join(out)


@pytest.fixture(scope="session")
def device() -> Iterator[Device]:
    """The first local OpenCL device (PoCL on the CPU here); every kernel test needs one."""
    try:
        from compiler.runtime.opencl import OpenCLDevice, list_opencl_devices

        if not list_opencl_devices():
            pytest.skip("no OpenCL platform/device found (install pocl-opencl-icd)")
        dev = OpenCLDevice(0)
    except Exception as err:  # pyopencl missing, no ICD loader, driver errors
        pytest.skip(f"cannot open an OpenCL device: {err}")
    yield dev


class MeasurePool:
    """Child measurement processes used side by side: PoCL compiles on one core, so two
    children halve a sweep's wall time, and a hanging kernel costs one trial's timeout."""

    def __init__(self, device_spec: str, size: int) -> None:
        self.size = size
        self._all = [IsolatedMeasurer(device_spec) for _ in range(size)]
        self._free: queue.Queue[IsolatedMeasurer] = queue.Queue()
        for m in self._all:
            self._free.put(m)

    def _one(self, request: MeasureRequest) -> MeasureResult:
        m = self._free.get()
        try:
            return m.measure(request)
        finally:
            self._free.put(m)

    def map(self, requests: Sequence[MeasureRequest]) -> list[tuple[MeasureRequest, MeasureResult]]:
        with ThreadPoolExecutor(self.size) as ex:
            return list(zip(requests, ex.map(self._one, requests)))

    def close(self) -> None:
        for m in self._all:
            m.close()


@pytest.fixture(scope="session")
def measure_pool(device: Device) -> Iterator[MeasurePool]:
    """Two isolated measurers on the same OpenCL device as ``device``."""
    pool = MeasurePool(device.info.spec, size=2)
    yield pool
    pool.close()

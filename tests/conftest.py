"""Shared fixtures: the local OpenCL device, a pool of isolated measurers, real layer shapes."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from compiler.runtime.device import Device
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest
from compiler.templates import get_template
from schemas import Config, MeasureResult, Workload

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
TOPHUB_DIR = REPO.parent / "shared" / "data" / "tophub"

CONV = "conv2d_nchw.cuda"
CONV_CPU = "conv2d_NCHWc.x86"
DENSE_SMALL = "dense_small_batch.gpu"
DENSE_LARGE = "dense_large_batch.gpu"


def nchwc_workload(n: int, c: int, hw: int, co: int, k: int, stride: int, pad: int) -> Workload:
    """A square conv2d as AutoTVM's conv2d_NCHWc.x86 task writes it (8 args, NCHW)."""
    return Workload(template=CONV_CPU, args=[
        ["TENSOR", [n, c, hw, hw], "float32"], ["TENSOR", [co, c, k, k], "float32"],
        [stride, stride], [pad, pad, pad, pad], [1, 1], "NCHW", "NCHW", "float32"])


def nchwc_config(wl: Workload, **values: object) -> Config:
    """A conv2d_NCHWc.x86 config from inner factors (tile_ic=ic_bn, tile_oc=oc_bn,
    tile_ow=reg_n) and other knobs; vec 16, wg 1 and kw unrolled unless given."""
    template = get_template(CONV_CPU)
    op = template.parse(wl)
    full: dict[str, object] = {"vec": 16, "wg": 1}
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

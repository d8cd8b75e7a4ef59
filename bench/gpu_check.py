"""Steps of bench/gpu_check.sh that need Python: each prints one summary line (the
script's table cell) and exits 0 when the check passes.

    python -m bench.gpu_check plan OUTDIR     # no GPU: workloads, indices, ResNet-50 file
    python -m bench.gpu_check cuda            # pycuda importable and a CUDA device there?
    python -m bench.gpu_check limits DEVICE   # the issue's three launch-limit configs
    python -m bench.gpu_check recovery DEVICE # bad, good, good -> 4, 0, 0
    python -m bench.gpu_check timing DEVICE   # a short kernel: 1 vs 1000 launches, hold on/off
    python -m bench.gpu_check baseline MODEL  # onnxruntime CUDA or PyTorch+cuDNN, if present

Run from the repository root (``-m``): the measuring child imports this module to
register the faulting template.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from compiler.templates import Epilogue, Kernel, get_template, register_template
from compiler.templates.dense_small_batch import DenseSmallBatch
from compiler.templates.ops import DenseOp
from schemas import MeasureErrorNo, MeasureOptions, Workload

# ResNet-50 stage 2's 3x3 conv (64 -> 64 on 56x56), fp32 and int8
RESNET_3X3: list[Any] = [["TENSOR", [1, 64, 56, 56], "float32"],
                         ["TENSOR", [64, 64, 3, 3], "float32"],
                         [1, 1], [1, 1, 1, 1], [1, 1], "float32"]
RESNET_3X3_INT8: list[Any] = [["TENSOR", [1, 64, 56, 56], "int8"],
                              ["TENSOR", [64, 64, 3, 3], "int8"],
                              [1, 1], [1, 1, 1, 1], [1, 1], "int32"]
DENSE_1024: list[Any] = [["TENSOR", [1024, 1024], "float32"],
                         ["TENSOR", [1024, 1024], "float32"], None, "float32"]
# Issue 15's valid configs that exceed a launch limit on sm_90 (registers x threads):
# each must now measure (error 0) or be refused at build (error 1), never fail at launch.
LIMIT_CONFIGS: tuple[tuple[str, list[Any], int], ...] = (
    ("conv2d_nchw_int8.cuda", RESNET_3X3_INT8, 43849449),  # 255 regs x 448 threads
    ("dense_large_batch.gpu", DENSE_1024, 1371),  # 71 x 1024
    ("conv2d_nchw.cuda", RESNET_3X3, 22863882),  # 158 x 392
)
# Batch-1 dense of ResNet-50's classifier: a kernel of a few microseconds on an H200
SHORT_DENSE: list[Any] = [["TENSOR", [1, 2048], "float32"],
                          ["TENSOR", [1000, 2048], "float32"], None, "float32"]
TINY_DENSE: list[Any] = [["TENSOR", [1, 64], "float32"],
                         ["TENSOR", [8, 64], "float32"], None, "float32"]
FAULT = "gpu_check_fault.test"
OPTIONS = MeasureOptions(number=1, repeat=1, timeout_s=60)


class NullStore(DenseSmallBatch):
    """dense_small_batch.gpu that stores through a null pointer: an illegal address on
    CUDA, the fatal error that must cost its own trial only."""

    name = FAULT

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        kernel = super()._codegen(op, knobs, epilogue)
        source = kernel.source.replace("out[o] = ", "((GLOBAL float*)0)[o] = ", 1)
        if source == kernel.source:
            raise RuntimeError(f"{FAULT}: the store to mutate is gone from the template")
        return dataclasses.replace(kernel, source=source)


register_template(NullStore())


def _workload(template: str, args: list[Any]) -> Workload:
    return Workload(template=template, args=args)


def plan(outdir: str) -> int:
    """What needs no GPU: every launch-limit index lies in its space, the faulting
    template generates, and ResNet-50 (random weights) is written for the build step."""
    import onnx

    from compiler.frontend.samples import light_path, with_random_weights

    for name, args, index in LIMIT_CONFIGS:
        size = len(get_template(name).space(_workload(name, args)))
        if index >= size:
            print(f"{name} index {index} is outside its space of {size}")
            return 1
    fault = get_template(FAULT)
    wl = _workload(FAULT, TINY_DENSE)
    fault.codegen(wl, fault.default_config(wl), dialect="cuda")
    model = Path(outdir) / "resnet50.onnx"
    onnx.save(with_random_weights(onnx.load(light_path("resnet50")), seed=0), model)
    print(f"3 launch-limit configs in their spaces; fault template generates; {model}")
    return 0


def cuda() -> int:
    """0 when pycuda imports and sees a device; 2 without pycuda; 3 without a device."""
    try:
        import pycuda.driver as drv
    except ImportError:
        print("pycuda is not installed (carry its wheel: pip install --no-index "
              "--find-links .whl 'pycuda>=2025.1.2')")
        return 2
    try:
        drv.init()
        count = drv.Device.count()
    except drv.Error as err:
        print(f"pycuda sees no CUDA driver: {err}")
        return 3
    if count == 0:
        print("pycuda: no CUDA device")
        return 3
    print(f"pycuda {'.'.join(map(str, drv.get_version()))}: {drv.Device(0).name()}")
    return 0


def _measure(device: str, requests: list[Any], extra: tuple[str, ...] = ()) -> list[Any]:
    from compiler.runtime.isolate import IsolatedMeasurer

    with IsolatedMeasurer(device, extra_modules=extra) as measurer:
        return [measurer.measure(r) for r in requests]


def limits(device: str) -> int:
    from compiler.runtime.measure import MeasureRequest

    requests = [MeasureRequest(name, _workload(name, args),
                               get_template(name).space(_workload(name, args)).get(index),
                               OPTIONS) for name, args, index in LIMIT_CONFIGS]
    results = _measure(device, requests)
    ok = all(r.error_no in (MeasureErrorNo.NO_ERROR, MeasureErrorNo.INSTANTIATION_ERROR)
             for r in results)
    print("; ".join(f"{name}[{index}]: error {int(r.error_no)}"
                    for (name, _, index), r in zip(LIMIT_CONFIGS, results))
          + ("" if ok else " (expected 0 or 1 each)"))
    return 0 if ok else 1


def recovery(device: str) -> int:
    from compiler.runtime.measure import MeasureRequest

    good = get_template("dense_small_batch.gpu")
    good_wl = _workload(good.name, TINY_DENSE)
    bad_wl = _workload(FAULT, TINY_DENSE)
    requests = [MeasureRequest(FAULT, bad_wl, get_template(FAULT).default_config(bad_wl),
                               OPTIONS)]
    requests += [MeasureRequest(good.name, good_wl, good.default_config(good_wl), OPTIONS)] * 2
    errors = [int(r.error_no) for r in _measure(device, requests, extra=("bench.gpu_check",))]
    print(f"bad, good, good -> {', '.join(map(str, errors))} (expected 4, 0, 0)")
    return 0 if errors == [4, 0, 0] else 1


def timing(device: str) -> int:
    """A kernel of a few microseconds timed one launch at a time (the median of 50) and
    1000 launches at a time, with the hold kernel (as measured now) and without it (as
    before): with the hold the two agree, so the kernel, not the host's launch rate, is
    timed. Prints the SM clock after, which says the GPU was not at idle clocks."""
    import subprocess

    from compiler.runtime import open_device
    from compiler.runtime.measure import task_operands

    template = get_template("dense_small_batch.gpu")
    wl = _workload(template.name, SHORT_DENSE)
    config = template.default_config(wl)
    with open_device(device) as dev:
        kernel = template.codegen(wl, config, dev.dialect)
        program = dev.build(kernel)
        arrays, _ = task_operands(template.name, wl, Epilogue(), 0)
        out = kernel.buffers[-1]
        buffers = [dev.upload(a) for a in template.kernel_inputs(wl, config, arrays)]
        buffers.append(dev.alloc(out.shape, out.dtype))
        figures: dict[bool, tuple[float, float]] = {}
        for held in (False, True, False, True):  # the second pair, clocks warm, counts
            dev.holds_queue = held
            one = statistics.median(dev.time(program, kernel, buffers, 1) for _ in range(50))
            many = statistics.median(dev.time(program, kernel, buffers, 1000)
                                     for _ in range(3))
            figures[held] = (one, many)
    try:
        clock = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm",
                                "--format=csv,noheader"], capture_output=True, text=True,
                               check=False, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        clock = ""
    (one0, many0), (one1, many1) = figures[False], figures[True]
    ratio = one1 / many1
    print(f"dense 1x2048x1000 us per launch, 1 vs 1000 launches: without hold "
          f"{one0 * 1e6:.2f} vs {many0 * 1e6:.2f}, with hold {one1 * 1e6:.2f} vs "
          f"{many1 * 1e6:.2f} (ratio {ratio:.2f}, expected < 1.5); SM clock {clock or '?'}")
    return 0 if ratio < 1.5 else 1


def baseline(model: str) -> int:
    """Milliseconds per ResNet-50 run on onnxruntime's CUDA provider, else on PyTorch with
    cuDNN (torchvision's resnet50, random weights); a line saying so (exit 0) when neither
    is present: the comparison is optional."""
    import numpy as np

    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    try:
        import onnxruntime as ort

        has_ort = "CUDAExecutionProvider" in ort.get_available_providers()
    except ImportError:
        has_ort = False
    if has_ort:
        session = ort.InferenceSession(model, providers=["CUDAExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        return _report("onnxruntime CUDA", lambda: session.run(None, feed))
    try:
        import torch
        import torchvision
    except ImportError:
        print("no baseline: neither onnxruntime's CUDA provider nor torch+torchvision here")
        return 0
    if not torch.cuda.is_available():
        print("no baseline: torch sees no CUDA device")
        return 0
    torch.backends.cudnn.benchmark = True
    net = torchvision.models.resnet50(weights=None).eval().cuda()
    xt = torch.from_numpy(x).cuda()

    def run() -> None:
        with torch.no_grad():
            net(xt)
        torch.cuda.synchronize()

    return _report(f"PyTorch {torch.__version__} + cuDNN", run)


def _report(name: str, run: Any) -> int:
    for _ in range(10):  # warm-up: clocks, cuDNN's algorithm search, lazy allocations
        run()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(f"{name}: {statistics.median(times) * 1e3:.3f} ms (median of 30)")
    return 0


def main(argv: list[str]) -> int:
    steps = {"plan": plan, "cuda": cuda, "limits": limits, "recovery": recovery,
             "timing": timing, "baseline": baseline}
    if not argv or argv[0] not in steps:
        print(f"usage: python -m bench.gpu_check {{{','.join(steps)}}} [ARG]", file=sys.stderr)
        return 64
    return int(steps[argv[0]](*argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

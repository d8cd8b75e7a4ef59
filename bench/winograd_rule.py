"""Where an untuned CPU build runs Winograd (``compiler.tasks.winograd_preferred``): the
layers the rule of 2026-12-05 gave back to the direct template (3x3 stride 1, >= 16 input
channels, but under 64 output channels or 14 pixels a side), per layer and whole model.

Per such workload of ``--models``: both templates' default configs for this device, built
as a model chains them (blocked data in, the config's block out), checked against numpy,
then ``--rounds`` alternating timings by device events: warm (10 launches back to back)
and cold (one launch right after a kernel that streams 64 MB through the cache, as the
rest of a model does between two runs of a layer). Then, per model: the default build
against the same build with the earlier rule (Winograd's default offered as this
device's fastest record on those layers, so the build takes it) and onnxruntime,
alternating rounds, outputs checked against onnxruntime's.

    .venv/bin/python bench/winograd_rule.py --models resnet50,densenet121 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import numpy as np
from common import alternating_medians, checked_kernel, offered_defaults, print_header
from models import onnxruntime_timer
from winograd import light_model

from compiler.build_module import build, load_graph
from compiler.frontend.samples import LIGHT_MODELS
from compiler.passes import optimize
from compiler.records import MemorySource
from compiler.runtime import Device, open_device
from compiler.tasks import (
    CONV_CPU,
    WINOGRAD_CPU,
    WINOGRAD_MIN_CHANNELS,
    extract_tasks,
    winograd_preferred,
)
from compiler.templates import get_template
from compiler.templates.base import Buffer, Kernel
from schemas import Workload

EVICT_MB = 64


def given_back(tasks: list[Any], lanes: int) -> list[Any]:
    """The Winograd tasks the earlier rule (``WINOGRAD_MIN_CHANNELS`` input channels, no
    other threshold) preferred and this one does not on a device of ``lanes``."""
    template = get_template(WINOGRAD_CPU)
    found = []
    for task in tasks:
        if task.template != WINOGRAD_CPU:
            continue
        op = template.parse(task.workload)
        if op.c >= WINOGRAD_MIN_CHANNELS and not winograd_preferred(op.c, op.co, op.h, op.w,
                                                                    lanes):
            found.append(task)
    return found


def evictor(device: Device) -> tuple[Any, Kernel, list[Any]]:
    """A kernel adding 1 to every float of an ``EVICT_MB`` buffer."""
    n = EVICT_MB * 1024 * 1024 // 4
    kernel = Kernel(source="__kernel void evict(__global float* o) "
                           "{ o[get_global_id(0)] += 1.0f; }",
                    entry="evict", grid=(n // 64, 1, 1), block=(64, 1, 1),
                    buffers=(Buffer("o", (n,), role="out"),), dialect="opencl")
    return device.build(kernel), kernel, [device.alloc((n,))]


def built(device: Device, workload: Workload) -> tuple[Any, Kernel, list[Any]]:
    """The default config's kernel in the layout a build runs it, checked against numpy."""
    template = get_template(workload.template)
    config = template.default_config(workload, device.limits)
    return checked_kernel(device, workload, config, template.measure_io(workload, config))


def layers_main(device: Device, model: str, rounds: int) -> None:
    graph = optimize(load_graph(light_model(model, seed=LIGHT_MODELS.index(model))[0]))
    tasks = given_back(extract_tasks(graph, device.target), device.limits.simd_lanes)
    if not tasks:
        print(f"\n{model}: no layer given back to the direct template")
        return
    flush = evictor(device)
    print(f"\n{model}: ms per launch, medians of {rounds} rounds (Winograd / direct)\n")
    print("| layer | layers | warm: Winograd | direct | cold: Winograd | direct | "
          "cold: Winograd / direct |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for task in tasks:
        op = get_template(WINOGRAD_CPU).parse(task.workload)
        runs = {name: built(device, Workload(template=name, args=task.workload.args))
                for name in (WINOGRAD_CPU, CONV_CPU)}
        warm: dict[str, list[float]] = {name: [] for name in runs}
        cold: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, (program, kernel, args) in runs.items():
                warm[name].append(device.time(program, kernel, args, 10))
                device.launch(*flush)
                cold[name].append(device.elapsed(device.launch(program, kernel, args,
                                                               timed=True)))
        w, c = ({n: statistics.median(v) * 1e3 for n, v in d.items()} for d in (warm, cold))
        print(f"| {op.c}->{op.co} {op.h}x{op.w} | {len(task.layers)} | {w[WINOGRAD_CPU]:.3f} "
              f"| {w[CONV_CPU]:.3f} | {c[WINOGRAD_CPU]:.3f} | {c[CONV_CPU]:.3f} "
              f"| {c[WINOGRAD_CPU] / c[CONV_CPU]:.2f}x |", flush=True)


def model_main(device: Device, model: str, rounds: int) -> None:
    onnx_model, x = light_model(model, seed=LIGHT_MODELS.index(model))
    ort_run, ort_seconds = onnxruntime_timer(onnx_model, x)
    want = ort_run()
    graph = optimize(load_graph(onnx_model))
    back = given_back(extract_tasks(graph, device.target), device.limits.simd_lanes)
    earlier = offered_defaults(back, device, [WINOGRAD_CPU])
    modules = {"default build": build(graph, device=device, optimized=True),
               "earlier rule": build(graph, device=device, optimized=True,
                                     records=MemorySource(earlier))}
    scale = float(np.abs(want).max())
    for label, module in modules.items():
        (got,) = module.run([x])
        if not np.allclose(got, want, rtol=1e-3, atol=1e-5 * scale):
            raise SystemExit(f"{model} {label} disagrees with onnxruntime")
    med = {k: v * 1e3 for k, v in alternating_medians(ort_seconds, modules, rounds).items()}
    print(f"\n| {model} | layers given back | onnxruntime ms | earlier rule ms | default build "
          "ms | default / earlier | default / onnxruntime |\n|---|---:|---:|---:|---:|---:|---:|")
    print(f"| {model} | {len(earlier)} workloads | {med['onnxruntime']:.1f} "
          f"| {med['earlier rule']:.1f} | {med['default build']:.1f} "
          f"| {med['default build'] / med['earlier rule']:.3f} "
          f"| {med['default build'] / med['onnxruntime']:.3f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,densenet121")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    device = open_device()
    print_header("bench/winograd_rule.py", device.info.name)
    for model in a.models.split(","):
        layers_main(device, model, a.rounds)
        model_main(device, model, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

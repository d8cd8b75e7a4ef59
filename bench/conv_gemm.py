"""A light model's (ResNet-50's) conv layers other than the unpadded 1x1 ones:
``conv2d_NCHWc_gemm.x86`` (implicit GEMM, flat pixel tiles) against ``conv2d_NCHWc.x86``
(direct), Winograd where it applies, and onnxruntime's Conv on the same arrays, each at its
default config for this device, in the layouts a build gives them, timed in CPU seconds
(bench/conv1x1.py says why; ``--wall`` for wall clock).

Per layer: every kernel built for a build's layouts (data in NCHW[16]c, plain NCHW where
16 does not divide the channels: the stem; the output in NCHW[oc_bn]c), its output and
onnxruntime's (its idle threads told not to spin, so its CPU seconds are its work)
checked against numpy, then ``--rounds`` rounds of ~0.2 GFLOP of launches each, in a new
order every round; the median round counts. Ratios: each entry's time over the direct
default's (> 1: slower), and onnxruntime's time over the entry's (its speed against
onnxruntime: >= 1 at least as fast). ``--configs N`` adds the N fastest of ``--sample``
gemm configs drawn at random (each screened once), to see what the space holds.

    .venv/bin/python bench/conv_gemm.py                       # every such ResNet-50 layer
    .venv/bin/python bench/conv_gemm.py --layers 3x3s2 --configs 3 --sample 40
    .venv/bin/python bench/conv_gemm.py --model densenet121
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

from common import checked_launch, print_header
from conv1x1 import cpu_seconds, onnxruntime_prepared
from layers import conv_layers, select

from compiler.runtime import Device, open_device
from compiler.tasks import CONV_CPU, GEMM_CPU, WINOGRAD_CPU
from compiler.templates import IOLayout, get_template
from schemas import Config, Workload


def launcher(device: Device, workload: Workload, config: Config) -> Callable[[], None]:
    """One launch of ``config``, waited on, its output checked against numpy first."""
    template = get_template(workload.template)
    io = template.measure_io(workload, config) or IOLayout()
    launch = checked_launch(device, workload, config, io)

    def run() -> None:
        launch()
        device.synchronize()
    return run


def sampled(device: Device, workload: Workload, count: int, keep: int, seed: int,
            clock: Callable[[], float]) -> list[tuple[str, Config]]:
    """The ``keep`` fastest of ``count`` random gemm configs, each screened once."""
    template = get_template(workload.template)
    rng = random.Random(seed)
    screened = []
    for _ in range(count):
        config = template.random_config(workload, rng, device.limits)
        try:
            run = launcher(device, workload, config)
        except Exception as err:  # noqa: BLE001 - a config that fails is reported, not fatal
            print(f"#   config {config.index}: {str(err)[:160]}", file=sys.stderr)
            continue
        run()
        start = clock()
        for _ in range(3):
            run()
        screened.append(((clock() - start) / 3, config))
    screened.sort(key=lambda s: s[0])
    return [(f"gemm #{config.index}", config) for _, config in screened[:keep]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="a light model of the onnx package")
    p.add_argument("--layers", default="",
                   help="rows of bench/layers.py --list (indices or label substrings); "
                        "default: every layer but the unpadded 1x1 ones")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--wall", action="store_true", help="wall-clock seconds, not CPU seconds")
    p.add_argument("--configs", type=int, default=0, help="fastest sampled gemm configs timed")
    p.add_argument("--sample", type=int, default=30, help="gemm configs screened per layer")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = open_device()
    clock = time.perf_counter if args.wall else cpu_seconds
    rows = [la for la in select(conv_layers(device.target, args.model), args.layers or None)
            if la.gemm is None]
    print_header("bench/conv_gemm.py", device.info.name,
                 f" | {'wall' if args.wall else 'CPU'} seconds | lanes {device.limits.simd_lanes}")
    print("\n| # | layer | layers | load | direct GFLOP/s | entry: time / direct's "
          "| onnxruntime's time / entry's |")
    print("|---:|---|---:|---:|---:|---|---|")
    order = random.Random(args.seed)
    for la in rows:
        gemm = Workload(template=GEMM_CPU, args=la.cpu.args)
        entries: dict[str, tuple[Workload, Config]] = {
            "direct": (la.cpu, get_template(CONV_CPU).default_config(la.cpu, device.limits)),
            "gemm": (gemm, get_template(GEMM_CPU).default_config(gemm, device.limits)),
        }
        op = la.op
        if (op.kh, op.kw, op.stride, op.dilation) == (3, 3, (1, 1), (1, 1)):
            wino = Workload(template=WINOGRAD_CPU, args=la.cpu.args)
            entries["winograd"] = (wino, get_template(WINOGRAD_CPU).default_config(
                wino, device.limits))
        if args.configs:
            entries.update({name: (gemm, c) for name, c in sampled(
                device, gemm, args.sample, args.configs, args.seed, clock)})
        runs = {name: launcher(device, wl, c) for name, (wl, c) in entries.items()}
        runs["onnxruntime"] = onnxruntime_prepared(la.cpu)
        launches = max(3, round(0.2 / la.gflop))
        per: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name in order.sample(list(runs), len(runs)):
                run = runs[name]
                run()
                start = clock()
                for _ in range(launches):
                    run()
                per[name].append((clock() - start) / launches)
        med = {n: statistics.median(v) for n, v in per.items()}
        direct, ort = med["direct"], med["onnxruntime"]
        print(f"| {la.index} | {la.label} | {len(la.nodes)} | {os.getloadavg()[0]:.1f} "
              f"| {la.gflop / direct:.1f} | "
              + ", ".join(f"{n} {t / direct:.2f}x" for n, t in med.items() if n != "direct")
              + " | " + ", ".join(f"{n} {ort / t:.2f}x" for n, t in med.items()
                                  if n != "onnxruntime") + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

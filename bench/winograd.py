"""Tuned direct vs tuned Winograd on ResNet-50's 3x3 stride-1 layers, one run.

For each layer, ``tuner tune`` tunes ``conv2d_nchw.cuda`` (direct) and
``conv2d_nchw_winograd.cuda`` (filter transform at compile time) with the same budget
into one fresh database; then both best configs are re-measured side by side,
alternating, in this process. GFLOP/s count the direct convolution's FLOPs for both
(as AutoTVM does), so they compare as speed. The CPU template ``conv2d_NCHWc.x86`` at
its default config runs alongside as the build's usual choice on a CPU-class device.

    .venv/bin/python bench/winograd.py [--trials 32] [--layers 64x56,128x28,256x14,512x7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_model, git_revision
from tuning_real import tune

from compiler.runtime import open_device
from compiler.runtime.measure import MeasureRequest, measure
from compiler.tasks import CONV_CPU, CONV_GPU, WINOGRAD
from compiler.templates import get_template
from schemas import Config, MeasureOptions, Workload


def workload(template: str, spec: str) -> Workload:
    """``CxH``: ResNet-50's 3x3 stride-1 conv on C channels of HxH, for ``template``."""
    c, h = (int(v) for v in spec.lower().split("x"))
    layouts = ["NCHW", "NCHW"] if template == CONV_CPU else []
    return Workload(template=template, args=[
        ["TENSOR", [1, c, h, h], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], *layouts, "float32"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--layers", default="64x56,128x28,256x14,512x7")
    p.add_argument("--rounds", type=int, default=5, help="side-by-side re-measurements (5)")
    args = p.parse_args(argv)
    device = open_device()
    target = str(device.target)
    print(f"# bench/winograd.py  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"# command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# host: {cpu_model()}, {os.cpu_count()} CPUs | device {device.info.name} | "
          f"{git_revision()}")
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=50)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.layers.split(","):
            print(f"## layer {spec}", flush=True)
            best: dict[str, tuple[Workload, Config]] = {}
            for template in (CONV_GPU, WINOGRAD):
                wl = workload(template, spec)
                record, _ = tune(wl, target, "lgbm", args.trials, Path(tmp) / "bench.db")
                best[template] = (wl, record.config)
            cpu = workload(CONV_CPU, spec)
            best[CONV_CPU] = (cpu, get_template(CONV_CPU).default_config(cpu))
            costs: dict[str, list[float]] = {t: [] for t in best}
            for _ in range(args.rounds):
                for template, (wl, config) in best.items():
                    res = measure(device, MeasureRequest(template, wl, config, options))
                    if not res.ok:
                        raise SystemExit(f"{template} on {spec} failed now: {res.error_msg}")
                    costs[template].append(res.mean_cost)
            gflop = get_template(CONV_GPU).flops(best[CONV_GPU][0]) / 1e9
            speed = {t: gflop / statistics.median(c) for t, c in costs.items()}
            rows.append((spec, speed))
            print(f"   direct {speed[CONV_GPU]:.1f}  winograd {speed[WINOGRAD]:.1f}  "
                  f"x86 default {speed[CONV_CPU]:.1f} GFLOP/s", flush=True)
    print(f"\n{args.trials} lgbm trials per template and layer; median of {args.rounds} "
          "alternating re-measurements; GFLOP/s of the direct convolution's FLOPs\n")
    print("| layer (C x H, 3x3 s1) | direct conv2d_nchw.cuda | Winograd | Winograd / direct "
          "| conv2d_NCHWc.x86 default |")
    print("|---|---|---|---|---|")
    for spec, speed in rows:
        print(f"| {spec} | {speed[CONV_GPU]:.1f} | {speed[WINOGRAD]:.1f} | "
              f"{speed[WINOGRAD] / speed[CONV_GPU]:.2f}x | {speed[CONV_CPU]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real tuning run, not a replay: ``tuner tune`` on one ResNet-50 layer with
``--tuner lgbm`` and with ``--tuner random`` (same budget, each into its own fresh
database so neither learns from the other), then both best configs re-measured side
by side, alternating, in this process.

    .venv/bin/python bench/tuning_real.py [--trials 200] [--layer 128x28]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_header

from compiler.runtime import open_device
from compiler.runtime.measure import MeasureRequest, measure
from compiler.tasks import CONV_CPU
from compiler.templates import get_template
from schemas import MeasureOptions, Record, Workload

ROOT = Path(__file__).resolve().parent.parent
TUNER = Path(sys.executable).with_name("tuner")


def layer(spec: str) -> Workload:
    """``CxH``: ResNet-50's 3x3 stride-1 conv on C channels of HxH."""
    c, h = (int(v) for v in spec.lower().split("x"))
    return Workload(template=CONV_CPU, args=[
        ["TENSOR", [1, c, h, h], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])


def tune(workload: Workload, target: str, tuner: str, trials: int, db: Path) -> tuple[Record, float]:
    """Best record of a ``tuner tune`` run, and its wall time."""
    cmd = [str(TUNER), "tune", "--target", target, "--template", workload.template,
           "--args", json.dumps(workload.args), "--trials", str(trials), "--tuner", tuner,
           "--database-url", f"sqlite:///{db}"]
    start = time.time()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = time.time() - start
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stdout}\n{run.stderr}")
    lines = run.stdout.strip().splitlines()
    print(f"   {tuner}: {lines[-2] if len(lines) > 1 else ''} ({took:.0f} s)", flush=True)
    return Record.from_line(lines[-1]), took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--layer", default="128x28", help="CxH of a 3x3 stride-1 layer (128x28)")
    p.add_argument("--rounds", type=int, default=5, help="side-by-side re-measurements (5)")
    args = p.parse_args(argv)
    device = open_device()
    workload = layer(args.layer)
    target = str(device.target)
    print_header("bench/tuning_real.py", device.info.name)
    print(f"# workload: {workload.key}; {args.trials} trials per tuner, tuner tune's "
          "default measure options")
    best: dict[str, Record] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tuner in ("lgbm", "random"):
            best[tuner], _ = tune(workload, target, tuner, args.trials, Path(tmp) / f"{tuner}.db")
    options = MeasureOptions(number=1, repeat=5, min_repeat_ms=100)
    costs: dict[str, list[float]] = {t: [] for t in best}
    for _ in range(args.rounds):
        for tuner, record in best.items():
            res = measure(device, MeasureRequest(workload.template, workload, record.config,
                                                 options))
            if not res.ok:
                raise SystemExit(f"{tuner}'s best failed now: {res.error_msg}")
            costs[tuner].append(res.mean_cost)
    gflop = get_template(workload.template).flops(workload) / 1e9
    print(f"   {'tuner':8s} {'tuned ms':>9s} {'now ms':>8s} {'GFLOP/s':>8s}  config")
    for tuner, record in best.items():
        now = statistics.median(costs[tuner])
        print(f"   {tuner:8s} {record.result.mean_cost * 1e3:9.3f} {now * 1e3:8.3f} "
              f"{gflop / now:8.1f}  {record.config.index}")
    ratio = statistics.median(costs["random"]) / statistics.median(costs["lgbm"])
    print(f"## lgbm's best is {ratio:.3f}x the speed of random's best "
          f"(median of {args.rounds} alternating re-measurements; >= 1 meets the target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

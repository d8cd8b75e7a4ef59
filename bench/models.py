"""Whole models on the local OpenCL device: untuned vs tuned vs onnxruntime, one run.

For each light model shipped with the onnx package (ResNet-50, VGG-19, DenseNet-121,
random weights so no layer computes constants):

1. tune: ``tuner tune MODEL --trials N`` into a benchmark database (skipped for tasks
   that already have N records there, so reruns reuse it);
2. build twice: template default configs only ("untuned"), and the best records of the
   database ("tuned"); both outputs are checked against onnxruntime's;
3. time onnxruntime, untuned and tuned in alternating rounds, report medians and ratios,
   and the tuned model's slowest layers (each step's minimum of a few device-event
   profiles).

    .venv/bin/python bench/models.py                        # 16 trials per task
    .venv/bin/python bench/models.py --models resnet50 --trials 32
    .venv/bin/python bench/models.py --no-tune              # time what the database holds

``--also LABEL=URL`` (repeatable) builds the model from another tuning database as well
and times it in the same alternating rounds (two tunings side by side, say warm and cold
trials); its row's speed-up is over the same untuned build.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import settle, step_minima

import tuner
from compiler.build_module import Module, build
from compiler.frontend.samples import LIGHT_MODELS, light_path, with_random_weights
from compiler.runtime import open_device

BENCH_DB = Path(__file__).resolve().parent / "data" / "models.db"
TUNER = Path(sys.executable).with_name("tuner")
# device-event profiles whose per-step minima rank the slowest layers (one is noisy)
PROFILES = 5


def tune(path: str, target: str, device: str, trials: int, database_url: str) -> float:
    """Run ``tuner tune`` on the model's tasks; returns wall seconds."""
    start = time.time()
    cmd = [str(TUNER), "tune", path, "--target", target, "--device", device,
           "--trials", str(trials), "--database-url", database_url,
           "--number", "1", "--repeat", "3", "--min-repeat-ms", "20", "--timeout", "60"]
    print("$", " ".join(f"'{c}'" if " " in c else c for c in cmd), flush=True)
    subprocess.run(cmd, check=True)
    return time.time() - start


def untuned_tasks(module: Module, database_url: str, trials: int) -> int:
    """Tasks with fewer than ``trials`` records of this device in the database."""
    source = tuner.records.database(database_url)
    have: dict[str, int] = {}
    for cand in source.candidates([t.workload for t in module.tasks], module.device.target):
        if cand.record.target.model == module.device.target.model:
            have[cand.record.workload.key] = have.get(cand.record.workload.key, 0) + 1
    return sum(1 for t in module.tasks if have.get(t.workload.key, 0) < trials)


def onnxruntime_timer(model: Any, x: np.ndarray) -> tuple[Any, Any]:
    """(run: one run's output, seconds(number): seconds per run over ``number`` runs
    after a warm-up), for onnxruntime's CPU provider on ``model``."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the light models carry unused shape initializers
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run() -> np.ndarray:
        return session.run(None, {name: x})[0]

    def seconds(number: int) -> float:
        run()
        start = time.perf_counter()
        for _ in range(number):
            run()
        return (time.perf_counter() - start) / number

    return run, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(LIGHT_MODELS))
    parser.add_argument("--trials", type=int, default=16, help="tuning trials per task")
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--database-url", default=f"sqlite:///{BENCH_DB}")
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=URL",
                        help="another tuning database whose build is timed alongside")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    parser.add_argument("--number", type=int, default=2, help="runs per timing")
    args = parser.parse_args()
    also = [tuple(item.split("=", 1)) for item in args.also]
    if any(len(pair) != 2 or not all(pair) for pair in also):
        parser.error("--also: write it LABEL=DATABASE_URL")
    labels = [label for label, _url in also]
    if len(set(labels)) < len(labels) or {"onnxruntime", "untuned", "tuned"} & set(labels):
        parser.error("--also: each LABEL once, and none of onnxruntime, untuned, tuned")

    import onnx

    BENCH_DB.parent.mkdir(parents=True, exist_ok=True)
    dev = open_device(args.device)
    target = str(dev.target)
    print(f"device: {dev.info.name} ({dev.info.platform}), target {target}")
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
          f"database {args.database_url}; {args.trials} trials per task\n")
    rows = []
    for name in args.models.split(","):
        path = light_path(name)
        model = with_random_weights(onnx.load(path), seed=LIGHT_MODELS.index(name))
        x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
        untuned = build(model, records=None, device=dev)
        missing = untuned_tasks(untuned, args.database_url, args.trials)
        tune_s = 0.0
        if missing and not args.no_tune:
            print(f"{name}: {missing} of {len(untuned.tasks)} tasks need tuning")
            tune_s = tune(path, target, args.device, args.trials, args.database_url)
            # built again: the untuned and tuned builds of the table come from one tree
            untuned = build(model, records=None, device=dev)
        source = tuner.records.database(args.database_url)
        tuned = build(model, records=source, device=dev)
        modules = {"untuned": untuned, "tuned": tuned}
        for label, url in also:
            modules[label] = build(model, records=tuner.records.database(url), device=dev)
        ort_run, ort_seconds = onnxruntime_timer(model, x)
        want = ort_run()
        for label, module in modules.items():
            (got,) = module.run([x])
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5,
                                       err_msg=f"{name} {label} differs from onnxruntime")
        times: dict[str, list[float]] = {"onnxruntime": [], **{k: [] for k in modules}}
        for _ in range(args.rounds):
            settle()
            times["onnxruntime"].append(ort_seconds(args.number))
            for label, module in modules.items():
                settle()
                times[label].append(module.benchmark(number=args.number, repeat=1).mean)
        med = {k: statistics.median(v) for k, v in times.items()}
        flops = sum(t.total_flops for t in untuned.tasks)
        served = {s: sum(c.source == s for c in tuned.choices)
                  for s in ("this device", "other device", "default")}
        rows.append((name, flops, med, tune_s, served, len(tuned.tasks)))
        print(f"\n{name}: {flops / 1e9:.2f} GFLOP in conv/dense, {len(tuned.tasks)} tasks "
              f"({served['this device']} tuned here, {served['default']} default)")
        for k, v in med.items():
            print(f"  {k:12s} {v * 1e3:10.1f} ms   {flops / v / 1e9:7.1f} GFLOP/s")
        print(f"  slowest layers of the tuned build (minima of {PROFILES} profiles):")
        steps = tuned.program.steps
        minima = step_minima({"tuned": tuned}, PROFILES)["tuned"]
        for seconds, step in sorted(zip(minima, steps), key=lambda pair: -pair[0])[:5]:
            dims = " ".join("x".join(map(str, b.shape)) for b in step.kernel.buffers)
            print(f"    {seconds * 1e3:9.2f} ms {seconds / sum(minima) * 100:5.1f}%  "
                  f"{step.name}: {dims}")
        print(flush=True)

    print("| model | GFLOP | onnxruntime ms | untuned ms | tuned ms | tuned speed-up "
          "over untuned | tuned / onnxruntime time | tuning wall time |")
    print("|---|---|---|---|---|---|---|---|")
    for name, flops, med, tune_s, _served, _n in rows:
        print(f"| {name} | {flops / 1e9:.2f} | {med['onnxruntime'] * 1e3:.1f} | "
              f"{med['untuned'] * 1e3:.1f} | {med['tuned'] * 1e3:.1f} | "
              f"{med['untuned'] / med['tuned']:.2f}x | {med['tuned'] / med['onnxruntime']:.2f}x | "
              f"{tune_s / 60:.0f} min |")
        for label, _url in also:
            print(f"| {name} ({label}) | {flops / 1e9:.2f} | {med['onnxruntime'] * 1e3:.1f} | "
                  f"{med['untuned'] * 1e3:.1f} | {med[label] * 1e3:.1f} | "
                  f"{med['untuned'] / med[label]:.2f}x | "
                  f"{med[label] / med['onnxruntime']:.2f}x | - |")


if __name__ == "__main__":
    main()

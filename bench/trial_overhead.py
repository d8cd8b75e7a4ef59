"""Overhead per trial of an embedded tuning, with and without kernels built ahead.

Runs the command of docs/BENCHMARKS.md ("Overhead per trial") -- one embedded job of
random configs of ResNet-50's 64x56x56 3x3 conv on ``conv2d_NCHWc.x86``, each timed once
-- with $TUNER_PREBUILD=0 (each kernel compiled by the measuring child as its trial
comes) and =1 (a leased batch built ahead by a pool of builder processes), alternating,
each run with a fresh database and a fresh kernel cache, and prints per run:

- wall: the command's wall time (start-up included) per record it stored (its trials,
  and the configs a job measures again at its end, where it does);
- steady: seconds per trial between the records of whole lease batches, i.e. from the
  last record of the first batch to the last record, over the trials in between
  (start-up and the first batch's build excluded, every later batch's build included);
- all_cost: a trial inside the measuring child (build, check, time), mean / median;
- own: the kernel's own run time per trial (a checked run and a timed one: 2 x cost);
- overhead: steady - own, everything but the kernel's own run.

``--modes ahead`` runs the built-ahead mode alone; to compare two source trees (a change to
the kernels' source, say) run it once per tree with PYTHONPATH=TREE, alternating.
``--templates`` tunes the same conv on each template given, alternating (say
``conv2d_NCHWc.x86,conv2d_NCHWc_gemm.x86``: what its compiles cost a trial).
``--compiles`` then builds each built-ahead run's trials again, one after another in a
process of their own (fresh kernel cache, build and first launch, as a builder does), and
prints per lease batch: their compile seconds in all, the longest, and how long the
builders take over them handed out in order (each takes the next as it comes free, as
``BuildPool`` does on a GPU), largest source first (as it does on a CPU device, less the
few milliseconds of its sizing), longest first (known only afterwards), and the bound no
order beats, max(longest, sum / builders); then in order over lease batches 2 and 4
times as large. So a run's steady time splits into compile work, builders idle at a
batch's end, and the rest, and what an order takes back.

Usage: python bench/trial_overhead.py [--trials 32] [--rounds 1] [--modes as-it-comes,ahead]
       [--templates conv2d_NCHWc.x86] [--compiles]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tuner
from compiler.runtime.prebuild import default_builders, lease_batch

ARGS = ('[["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],[1,1],'
        '[1,1,1,1],[1,1],"NCHW","NCHW","float32"]')
TARGET = "opencl -model=pocl-cpu"


def database_url(scratch: Path, name: str) -> str:
    return f"sqlite:///{scratch / f'{name}.db'}"


def run(prebuild: bool, trials: int, scratch: Path, name: str,
        template: str = "conv2d_NCHWc.x86") -> dict[str, float]:
    """One ``tuner tune`` in a process of its own; its figures from the records."""
    env = dict(os.environ, TUNER_PREBUILD="1" if prebuild else "0",
               TUNER_KERNEL_CACHE=str(scratch / f"kernels-{name}"))
    url = database_url(scratch, name)
    command = [str(Path(sys.executable).with_name("tuner")), "tune", "--target", TARGET,
               "--template", template, "--args", ARGS, "--trials", str(trials),
               "--tuner", "random", "--number", "1", "--repeat", "1",
               "--min-repeat-ms", "0", "--database-url", url]
    began = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    os.environ["TUNER_PREBUILD"] = env["TUNER_PREBUILD"]  # the batch the run leased
    batch = lease_batch()
    with tuner.Database(url) as db:
        measured = sorted((r.result for r in db.records(TARGET)), key=lambda r: r.timestamp)
    # the job's own trials; a job may end by measuring its best configs again
    results = measured[:trials]
    ok = [r for r in results if r.ok]
    if len(results) <= batch or not ok:
        raise SystemExit(f"{name}: {len(results)} records ({len(ok)} ok), batch {batch}")
    stamps = [r.timestamp for r in results]
    steady = (stamps[-1] - stamps[batch - 1]) / (len(stamps) - batch)
    own = 2 * statistics.mean(r.costs[0] for r in ok)
    costs = [r.all_cost for r in results]
    return {"wall": wall / len(measured), "steady": steady,
            "all_cost mean": statistics.mean(costs), "all_cost median": statistics.median(costs),
            "own": own, "overhead": steady - own, "records": len(measured), "batch": batch}


def measured_configs(url: str, trials: int) -> list[Any]:
    """The records of a run's own trials, in the order they were measured."""
    with tuner.Database(url) as db:
        records = sorted(db.records(TARGET), key=lambda r: r.result.timestamp)
    return records[:trials]


def compile_one_after_another(url: str, trials: int) -> None:
    """(In a process of its own, started with a fresh kernel cache.) Build and first-launch
    each trial's kernel in turn, as a builder does; print the seconds of each as JSON."""
    from compiler.runtime import open_device
    from compiler.runtime.measure import MeasureRequest
    from compiler.runtime.prebuild import source_size, warm
    from schemas import MeasureOptions

    device = open_device(None, TARGET)
    seconds, sizes = [], []
    for record in measured_configs(url, trials):
        workload = record.input.workload
        request = MeasureRequest(workload.template, workload, record.input.config,
                                 MeasureOptions(number=1, repeat=1, timeout_s=600))
        began = time.perf_counter()
        warm(device, request, launch=True)
        seconds.append(time.perf_counter() - began)
        kind, *sized = source_size(device, request)  # as the builders size it
        sizes.append(sized[0] if kind == "sized" else 0)
    print(json.dumps([seconds, sizes]))


def in_order(seconds: list[float], builders: int) -> float:
    """How long ``builders`` take over these compiles handed out in order."""
    free = [0.0] * builders
    for s in seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


def batched(seconds: list[float], batch: int, builders: int,
            key: Callable[[int], float] | None = None) -> float:
    """The builders' time over ``seconds`` leased ``batch`` at a time, each batch handed
    out in order or sorted by ``key`` (of an index into ``seconds``)."""
    total = 0.0
    for start in range(0, len(seconds), batch):
        part = sorted(range(start, min(start + batch, len(seconds))), key=key)
        total += in_order([seconds[i] for i in part], builders)
    return total


def compiles(url: str, trials: int, scratch: Path, name: str, batch: int) -> list[str]:
    """Table rows: a run's lease batches, their compiles one after another."""
    env = dict(os.environ, TUNER_KERNEL_CACHE=str(scratch / f"kernels-{name}-again"))
    out = subprocess.run([sys.executable, __file__, "--compile-db", url, "--trials", str(trials)],
                         env=env, check=True, capture_output=True, text=True).stdout
    seconds, sizes = json.loads(out.strip().splitlines()[-1])
    n = default_builders()
    rows = []
    for start in [*range(0, len(seconds), batch), None]:
        first, end = (0, len(seconds)) if start is None else (start, start + batch)
        part = seconds[first:end]
        bound = sum(max(max(p), sum(p) / n) for p in (
            seconds[i:i + batch] for i in range(first, min(end, len(seconds)), batch)))
        rows.append(f"| {name} | {'all' if start is None else start // batch} | {len(part)} | "
                    f"{sum(part):.2f} | {max(part):.2f} | {batched(part, batch, n):.2f} | "
                    f"{batched(part, batch, n, lambda i, f=first: -sizes[f + i]):.2f} | "
                    f"{batched(part, batch, n, lambda i, p=part: -p[i]):.2f} | {bound:.2f} |")
    rows.append(f"| {name} | in order, lease batches of {2 * batch} / {4 * batch} | "
                f"{len(seconds)} | | | {batched(seconds, 2 * batch, n):.2f} / "
                f"{batched(seconds, 4 * batch, n):.2f} | | | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="as-it-comes,ahead",
                        help="comma-separated: as-it-comes (TUNER_PREBUILD=0), ahead (=1)")
    parser.add_argument("--templates", default="conv2d_NCHWc.x86",
                        help="comma-separated templates tuning the same conv, alternating")
    parser.add_argument("--compiles", action="store_true",
                        help="then build each run's trials one after another (see above)")
    parser.add_argument("--compile-db", help=argparse.SUPPRESS)  # that build's own process
    opts = parser.parse_args()
    if opts.compile_db:
        compile_one_after_another(opts.compile_db, opts.trials)
        return
    templates = [t.strip() for t in opts.templates.split(",") if t.strip()]
    modes = {m.strip() for m in opts.modes.split(",") if m.strip()}
    if not modes or modes - {"as-it-comes", "ahead"}:
        parser.error(f"--modes {opts.modes!r}: expected as-it-comes and/or ahead")
    rows: list[tuple[str, dict[str, float]]] = []
    compile_rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(opts.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for prebuild in order:
                if ("ahead" if prebuild else "as-it-comes") not in modes:
                    continue
                for template in templates if i % 2 == 0 else templates[::-1]:
                    name = f"{'ahead' if prebuild else 'as-it-comes'}-{i}"
                    if len(templates) > 1:
                        name += f" {template}"
                    file = name.replace(" ", "-")
                    figures = run(prebuild, opts.trials, Path(tmp), file, template)
                    rows.append((name, figures))
                    print(f"done: {name}", file=sys.stderr, flush=True)
                    if opts.compiles and prebuild:  # as it comes: no builders
                        compile_rows += compiles(database_url(Path(tmp), file), opts.trials,
                                                 Path(tmp), file, int(figures["batch"]))
    keys = ["wall", "steady", "all_cost mean", "all_cost median", "own", "overhead"]
    print("| run | batch | records | " + " | ".join(keys) + " |")
    print("|---|---:|---:|" + "---:|" * len(keys))
    for name, fig in rows:
        print(f"| {name} | {int(fig['batch'])} | {int(fig['records'])} | "
              + " | ".join(f"{fig[k]:.3f}" for k in keys) + " |")
    if compile_rows:
        print(f"\n| run | lease batch | kernels | compiles one after another, s | longest | "
              f"{default_builders()} builders in order | largest source first | longest first | "
              "max(longest, sum / builders) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(compile_rows))
    try:
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
              f"on {os.cpu_count()} cores")
    except OSError:
        pass


if __name__ == "__main__":
    main()

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

Usage: python bench/trial_overhead.py [--trials 32] [--rounds 1] [--modes as-it-comes,ahead]
       [--templates conv2d_NCHWc.x86]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tuner
from compiler.runtime.prebuild import lease_batch

ARGS = ('[["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],[1,1],'
        '[1,1,1,1],[1,1],"NCHW","NCHW","float32"]')
TARGET = "opencl -model=pocl-cpu"


def run(prebuild: bool, trials: int, scratch: Path, name: str,
        template: str = "conv2d_NCHWc.x86") -> dict[str, float]:
    """One ``tuner tune`` in a process of its own; its figures from the records."""
    env = dict(os.environ, TUNER_PREBUILD="1" if prebuild else "0",
               TUNER_KERNEL_CACHE=str(scratch / f"kernels-{name}"))
    url = f"sqlite:///{scratch / f'{name}.db'}"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="as-it-comes,ahead",
                        help="comma-separated: as-it-comes (TUNER_PREBUILD=0), ahead (=1)")
    parser.add_argument("--templates", default="conv2d_NCHWc.x86",
                        help="comma-separated templates tuning the same conv, alternating")
    opts = parser.parse_args()
    templates = [t.strip() for t in opts.templates.split(",") if t.strip()]
    modes = {m.strip() for m in opts.modes.split(",") if m.strip()}
    if not modes or modes - {"as-it-comes", "ahead"}:
        parser.error(f"--modes {opts.modes!r}: expected as-it-comes and/or ahead")
    rows: list[tuple[str, dict[str, float]]] = []
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
                    rows.append((name, run(prebuild, opts.trials, Path(tmp),
                                           name.replace(" ", "-"), template)))
                    print(f"done: {name}", file=sys.stderr, flush=True)
    keys = ["wall", "steady", "all_cost mean", "all_cost median", "own", "overhead"]
    print("| run | batch | records | " + " | ".join(keys) + " |")
    print("|---|---:|---:|" + "---:|" * len(keys))
    for name, fig in rows:
        print(f"| {name} | {int(fig['batch'])} | {int(fig['records'])} | "
              + " | ".join(f"{fig[k]:.3f}" for k in keys) + " |")
    try:
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
              f"on {os.cpu_count()} cores")
    except OSError:
        pass


if __name__ == "__main__":
    main()

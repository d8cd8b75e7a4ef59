"""The stem's max-pool in its producer's block, or plain: one model built both ways.

``plan_layouts`` lets a pool that reads and writes one NCHW[b]c block (``BLOCKED_POOLS``)
keep its producer's block when only CPU convs read it: ResNet-50's stem then stores
vectors into its own block instead of lanes into NCHW. This builds a light model twice
from one tuning database (the second with ``BLOCKED_POOLS`` emptied while it builds),
checks both outputs against each other, then, alternating: whole runs
(``Module.benchmark``, medians of ``--rounds``) and each step's minimum over
``--rounds`` profiles (the first steps printed, and the sum of all).

    .venv/bin/python bench/pool_layout.py --database-url sqlite:////tmp/r50.db --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
from unittest import mock

import numpy as np
from common import light_model, print_header, step_minima

import tuner
from compiler import build_module
from compiler.runtime import open_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--database-url", help="a tuning's database (none: untuned build)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4, help="first steps to print")
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header("bench/pool_layout.py", device.info.name)
    records = tuner.records.database(opts.database_url) if opts.database_url else None
    for name in opts.models.split(","):
        model = light_model(name)
        builds = {"blocked pool": build_module.build(model, records=records, device=device)}
        with mock.patch.dict(build_module.BLOCKED_POOLS, clear=True):
            builds["plain pool"] = build_module.build(model, records=records, device=device)
        x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
        (a,), (b,) = (m.run([x]) for m in builds.values())
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        runs: dict[str, list[float]] = {k: [] for k in builds}
        for r in range(opts.rounds):
            for label in list(builds) if r % 2 == 0 else list(builds)[::-1]:
                runs[label].append(builds[label].benchmark(number=10, repeat=1).mean)
        minima = step_minima(builds, opts.rounds)
        print(f"\n## {name}\n")
        print("| build | run ms (median) | all steps ms | "
              + " | ".join(s.name for s in builds["blocked pool"].program.steps[:opts.steps])
              + " |")
        print("|---|---:|---:|" + "---:|" * opts.steps)
        for label in builds:
            steps = " | ".join(f"{t * 1e3:.3f}" for t in minima[label][:opts.steps])
            print(f"| {label} | {statistics.median(runs[label]) * 1e3:.2f} | "
                  f"{sum(minima[label]) * 1e3:.2f} | {steps} |")
        speed = statistics.median(runs["plain pool"]) / statistics.median(runs["blocked pool"])
        print(f"\nplain / blocked pool, whole runs: {speed:.3f}x")


if __name__ == "__main__":
    main()

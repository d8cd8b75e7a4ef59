"""One model built two ways in one process, a build switch off for the second: both
outputs checked against each other, then, alternating, whole runs (``Module.benchmark``,
medians of ``--rounds``) and each step's minimum over ``--rounds`` profiles (the first
steps printed, and the sum of all).

Switches: ``pool`` (``BLOCKED_POOLS`` emptied: ResNet-50's stem then stores lanes into
NCHW for its max-pool instead of vectors into its own block), ``prologue``
(``build(fold_prologues=False)``: DenseNet's pre-activation chains run as their own
kernels instead of in the 1x1 convs' data loads), ``pool-first`` (the
``pool_before_conv`` pass left out: DenseNet's transition convs run on the unpooled
image, their average pool after them), ``prologue-1x1`` (a tuned build's 1x1 layers
under a prologue take their fastest record, not the 1x1 template's: ``select_layers``).

    .venv/bin/python bench/build_ab.py --switch pool --database-url sqlite:////tmp/r50.db
    .venv/bin/python bench/build_ab.py --switch prologue --models densenet121
    .venv/bin/python bench/build_ab.py --switch pool-first --models densenet121
    .venv/bin/python bench/build_ab.py --switch prologue-1x1 --models densenet121 \
        --database-url sqlite:////tmp/dn.db
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import AbstractContextManager, nullcontext
from typing import Any
from unittest import mock

import numpy as np
from common import light_model, print_header, step_minima

import tuner
from compiler import build_module, passes
from compiler.runtime import open_device

# switch -> (label on, label off, the context and build arguments that turn it off)
SWITCHES: dict[str, tuple[str, str, Any]] = {
    "pool": ("blocked pool", "plain pool",
             lambda: (mock.patch.dict(build_module.BLOCKED_POOLS, clear=True), {})),
    "prologue": ("prologue in the conv", "chain kernels",
                 lambda: (nullcontext(), {"fold_prologues": False})),
    "prologue-1x1": ("1x1 template under a prologue", "fastest record",
                     lambda: (mock.patch.object(build_module, "held_for_prologues",
                                                lambda *_: set()), {})),
    "pool-first": ("pool before the 1x1 conv", "pool after it",
                   lambda: (mock.patch.object(passes, "PIPELINE", tuple(
                       p for p in passes.PIPELINE if p[0] != "pool_before_conv")), {})),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--switch", choices=sorted(SWITCHES), required=True)
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--database-url", help="a tuning's database (none: untuned build)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4, help="first steps to print")
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header(f"bench/build_ab.py --switch {opts.switch}", device.info.name)
    records = tuner.records.database(opts.database_url) if opts.database_url else None
    on, off, turn_off = SWITCHES[opts.switch]
    for name in opts.models.split(","):
        model = light_model(name)
        builds = {on: build_module.build(model, records=records, device=device)}
        context: AbstractContextManager[Any]
        context, kwargs = turn_off()
        with context:
            builds[off] = build_module.build(model, records=records, device=device, **kwargs)
        x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
        (a,), (b,) = (m.run([x]) for m in builds.values())
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        runs: dict[str, list[float]] = {k: [] for k in builds}
        for r in range(opts.rounds):
            for label in list(builds) if r % 2 == 0 else list(builds)[::-1]:
                runs[label].append(builds[label].benchmark(number=10, repeat=1).mean)
        minima = step_minima(builds, opts.rounds)
        shown = [s.name for s in builds[on].program.steps[:opts.steps]]
        print(f"\n## {name}\n")
        print("| build | steps | run ms (median) | all steps ms | " + " | ".join(shown) + " |")
        print("|---|---:|---:|---:|" + "---:|" * len(shown))
        for label, module in builds.items():  # the same steps by name ("-": none such)
            times = {s.name: t for s, t in zip(module.program.steps, minima[label])}
            steps = " | ".join(f"{times[n] * 1e3:.3f}" if n in times else "-" for n in shown)
            print(f"| {label} | {len(minima[label])} | "
                  f"{statistics.median(runs[label]) * 1e3:.2f} | "
                  f"{sum(minima[label]) * 1e3:.2f} | {steps} |")
        speed = statistics.median(runs[off]) / statistics.median(runs[on])
        print(f"\n{off} / {on}, whole runs: {speed:.3f}x")


if __name__ == "__main__":
    main()

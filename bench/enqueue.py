"""A model run's launches on the host, prepared or not, side by side in one process.

``GraphExecutor`` prepares each step's launch once (``Device.prepare``: on OpenCL the
global size and argument handles worked out at build time, a launch then a check and an
enqueue); before, every launch went through ``Device.launch``, which works them out
again. On a 2-core CPU device the host enqueues a run's launches on a core PoCL's
threads compute on. Per light model (random weights), two builds on one device, the
second with ``prepare`` patched to a plain ``launch`` per call ("launch"), and in
alternating rounds:

- enqueue: host seconds to enqueue one run's launches (the executor's launch loop,
  ``perf_counter``), per step (a staged step, Winograd's, is three launches);
- run: seconds per run of ``--number`` back-to-back runs (``Module.benchmark``: device
  events of the first and last launch).

Outputs of both builds are checked against each other first. The "launch" side is
today's ``Device.launch``, which builds its closure per call: a little slower than the
launch before ``prepare`` existed, so the gap is an upper bound.

    .venv/bin/python bench/enqueue.py --models densenet121,resnet50 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from typing import Any
from unittest import mock

import numpy as np
from common import light_model, print_header

from compiler.build_module import Module, build
from compiler.runtime import Device, open_device


def launch_per_call(device: Device) -> Any:
    """Executors made meanwhile launch through ``Device.launch`` each time (the other
    side of the A/B)."""
    return mock.patch.object(device, "prepare", partial(Device.prepare, device))


def enqueue_seconds(module: Module) -> float:
    """Host seconds to enqueue one run's launches, per step (the device drained first
    and after)."""
    executor = module.executor
    module.device.synchronize()
    began = time.perf_counter()
    executor._launch_all()
    seconds = time.perf_counter() - began
    module.device.synchronize()
    return seconds / len(module.program.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="densenet121,resnet50")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=10, help="runs per timing")
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header("bench/enqueue.py", device.info.name)
    print("| model | steps | enqueue us / step: prepared | launch | run ms: prepared "
          "| launch | launch / prepared |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in opts.models.split(","):
        model = light_model(name)
        builds = {"prepared": build(model, device=device)}
        with launch_per_call(device):
            builds["launch"] = build(model, device=device)
        x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
        (a,), (b,) = (m.run([x]) for m in builds.values())
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        times: dict[str, dict[str, list[float]]] = {k: {"enqueue": [], "run": []}
                                                    for k in builds}
        for r in range(opts.rounds):
            for label in (list(builds) if r % 2 == 0 else list(builds)[::-1]):
                module: Any = builds[label]
                times[label]["enqueue"].append(enqueue_seconds(module))
                times[label]["run"].append(module.benchmark(number=opts.number, repeat=1).mean)
        med = {k: {m: statistics.median(v) for m, v in t.items()} for k, t in times.items()}
        print(f"| {name} | {len(builds['prepared'].program.steps)} | "
              f"{med['prepared']['enqueue'] * 1e6:.1f} | {med['launch']['enqueue'] * 1e6:.1f} | "
              f"{med['prepared']['run'] * 1e3:.2f} | {med['launch']['run'] * 1e3:.2f} | "
              f"{med['launch']['run'] / med['prepared']['run']:.3f}x |", flush=True)


if __name__ == "__main__":
    main()

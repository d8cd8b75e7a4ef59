"""How often does a verification name the faster of two configs? (issue 17, point 5)

A job's verification measured each config as one trial (the verification's options:
twice the repeats, each >= 100 ms), the configs one after another, two rounds in turned
order, and ranked them by their upper median; on a device whose speed moves within a
second that compares timings taken seconds apart. A worker now times a batch's
verification trials the third way below (``measure_group``). Here, per pair of a
ResNet-50 layer's candidates (each template's 16-lane default, as a trial times it: data
NCHW16c, output in its own block), ``--tries`` times:

- trial-level: a then b, then b then a, each a whole measurement (``measure``, as the
  measuring child runs a trial), the upper medians compared (what the scheduler does);
- short rounds: the same repeats as ``--short-rounds`` rounds of shorter trials (the
  repeats spread over the rounds, each as long), a and b in turned order, the upper
  medians of the rounds compared (the scheduler's plan with more, shorter rounds);
- interleaved: the same number of repeats (each >= the verification's min_repeat_ms),
  alternating a and b every repeat, the medians compared: ``measure_group``, as a worker
  times a batch's verification trials.

The answer each gives is scored against the pair's order by the medians of
``--truth`` alternating timings taken first. Every kernel is checked against numpy by
its first measurement.

    .venv/bin/python bench/verify_interleave.py --tries 10
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable

from common import print_header

from compiler.runtime import open_device
from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, measure, measure_group, ready_trial
from compiler.tasks import CONV1X1_CPU, CONV_CPU
from compiler.templates import get_template
from schemas import MeasureOptions, Workload
from tuner_server.services.dispatch import verify_measure

# (C, image side, K): ResNet-50's 1x1 layers where a tuning's build took the direct
# template's record over the 1x1 template's default (docs/BENCHMARKS.md)
LAYERS = ((128, 28, 512), (1024, 14, 256))


def request(device: Device, name: str, c: int, side: int, k: int,
            options: MeasureOptions) -> MeasureRequest:
    workload = Workload(template=name, args=[
        ["TENSOR", [1, c, side, side], "float32"], ["TENSOR", [k, c, 1, 1], "float32"],
        [1, 1], [0, 0, 0, 0], [1, 1], "NCHW", "NCHW", "float32"])
    config = get_template(name).default_config(workload, device.limits)
    return MeasureRequest(template=name, workload=workload, config=config, options=options)


def repeat_timer(device: Device, req: MeasureRequest) -> Callable[[], float]:
    """One repeat of ``req``'s kernel as a trial times it (launches enough for its
    min_repeat_ms), on the operands a trial builds."""
    return ready_trial(device, req).repeat


def trial_cost(device: Device, req: MeasureRequest) -> float:
    result = measure(device, req)
    if result.error_no != 0:
        raise SystemExit(f"{req.template}: {result.error_no.name} {result.error_msg}")
    return statistics.mean(result.costs)


def upper_median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--truth", type=int, default=41, help="alternating timings")
    parser.add_argument("--short-rounds", type=int, default=6)
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header("bench/verify_interleave.py", device.info.name)
    options = MeasureOptions.model_validate(verify_measure(
        MeasureOptions(number=1, repeat=3, min_repeat_ms=20).model_dump()))
    repeats = 2 * options.repeat  # per config: two rounds of a whole trial's
    short = options.model_copy(update={"repeat": repeats // opts.short_rounds})
    long = options.model_copy(update={"repeat": repeats})
    print("| layer | a | b | b / a (truth) | trial-level right | short rounds right "
          "| interleaved right |")
    print("|---|---|---|---:|---:|---:|---:|")
    for c, side, k in LAYERS:
        a, b = (request(device, name, c, side, k, options) for name in (CONV_CPU, CONV1X1_CPU))
        for req in (a, b):  # numpy checks, and warm
            trial_cost(device, req)
        time_a, time_b = repeat_timer(device, a), repeat_timer(device, b)
        truth_a, truth_b = [], []
        for _ in range(opts.truth):
            truth_a.append(time_a())
            truth_b.append(time_b())
        ratio = statistics.median(truth_b) / statistics.median(truth_a)
        right = {"trial": 0, "short": 0, "interleaved": 0}
        short_a, short_b = (dataclasses.replace(r, options=short) for r in (a, b))
        long_a, long_b = (dataclasses.replace(r, options=long) for r in (a, b))
        for _ in range(opts.tries):
            costs_a = [trial_cost(device, a)]
            costs_b = [trial_cost(device, b), trial_cost(device, b)]
            costs_a.append(trial_cost(device, a))
            right["trial"] += (max(costs_b) < max(costs_a)) == (ratio < 1)
            rounds_a, rounds_b = [], []
            for r in range(opts.short_rounds):
                for req in ((short_a, short_b) if r % 2 == 0 else (short_b, short_a)):
                    (rounds_a if req is short_a else rounds_b).append(trial_cost(device, req))
            right["short"] += (upper_median(rounds_b) < upper_median(rounds_a)) == (ratio < 1)
            side_a, side_b = measure_group(device, [long_a, long_b])
            if side_a is None or side_b is None or not (side_a.ok and side_b.ok):
                raise SystemExit(f"measure_group: {side_a}, {side_b}")
            right["interleaved"] += (statistics.median(side_b.costs)
                                     < statistics.median(side_a.costs)) == (ratio < 1)
        print(f"| {c}->{k} 1x1 {side}x{side} | direct default | 1x1 default | {ratio:.3f} | "
              f"{right['trial']}/{opts.tries} | {right['short']}/{opts.tries} | "
              f"{right['interleaved']}/{opts.tries} |",
              flush=True)


if __name__ == "__main__":
    main()

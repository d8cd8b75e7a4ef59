"""A conv layer's time inside the model against its trial's (issue 17): are the records'
costs what the build's steps take?

For a light model built from a tuning database (``bench/models.py --database-url``), per
CPU conv task the build runs (its chosen template and config, in the layout a trial
times it in, ``Template.measure_io``; output checked against numpy first):

- record: the chosen record's cost (the trial's or the verification's mean);
- model: the task's steps in the whole model, device events, each step's minimum over
  ``--rounds`` profiles, the mean over the task's layers;
- warm: the kernel alone, ``--number`` launches back to back on the same operands (as a
  trial times it: its weight stays in the caches);
- cold: the same launches, each on the next of K copies of its packed weight, round
  all K from timing to timing (K copies of at least ``--cold-mb`` MB in all, at most
  ``MAX_COPIES``), so a launch reads a weight it has not read lately, as a model's step
  does: between two runs of a layer the model reads every other layer's weight. (Small
  weights: K x the weight may still fit the last-level cache.)
- cold out: the warm launches, each writing the next of K copies of its output buffer
  (sized as the weight's), so its stores miss as a model's do where the step's output
  buffer was last touched a run ago (a trial rewrites one buffer in place).

The kernels alone run without the fused epilogue (bias, residual, ReLU) the model's
steps carry: a few percent of a step, on its output.

warm, cold and cold out alternate, ``--rounds`` times (medians, ms). A kernel that reads
its weight once per run and is limited by that read runs at the cold figure in the
model; the warm one is what its record says.

``--ab-prefetch``: the same build twice, with the kernels' prefetch of the next channel
block's weight (``compiler.templates.prefetch``) and without it (``prefetch.wanted``
patched to False while the second builds), profiled in turn; per task whose kernel
prefetches, its steps in both models and its kernel alone cold and warm in both forms
(alternating), and the sums of every step.

    .venv/bin/python bench/in_model.py --database-url sqlite:////tmp/r50.db --models resnet50
    .venv/bin/python bench/in_model.py --database-url sqlite:////tmp/r50.db --ab-prefetch
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from typing import Any
from unittest import mock

import numpy as np
from common import checked_kernel, light_model, print_header, step_minima

import tuner
from compiler.build_module import build
from compiler.runtime import Device, open_device
from compiler.tasks import Task
from compiler.templates import Epilogue, IOLayout, get_template, prefetch
from schemas import Config

MAX_COPIES = 128


def layer_seconds(task: Task, minima: dict[str, float]) -> float | None:
    """The mean of the task's layers' step minima (a step is named '<kind> <layer>')."""
    found = [t for name, t in minima.items() for layer in task.layers
             if name.split(" ")[-1] == layer]
    return statistics.mean(found) if found else None


def kernel_timers(device: Device, task: Task, config: Config, number: int,
                  cold_mb: float) -> dict[str, Any]:
    """warm, cold and cold out: seconds per launch of ``config``'s kernel, back to back
    on one weight and output, on copies of the weight in turn, on copies of the output
    in turn."""
    workload = task.workload
    template = get_template(workload.template)
    io = template.measure_io(workload, config) or IOLayout()
    program, kernel, args = checked_kernel(device, workload, config, io)
    weight = template.pack_weight(workload, config, template.make_inputs(
        workload, Epilogue(), np.random.default_rng(0))[1])
    copies = max(2, min(MAX_COPIES, math.ceil(cold_mb * 2**20 / weight.nbytes)))
    cold_weights = [device.upload(weight) for _ in range(copies)]
    out_shape = kernel.buffers[-1].shape
    out_bytes = 4 * math.prod(out_shape)
    # written once here: a buffer's first touch (page faults) is not what a model pays
    zeros = np.zeros(out_shape, dtype=np.float32)
    cold_outs = [device.upload(zeros) for _ in range(
        max(2, min(MAX_COPIES, math.ceil(cold_mb * 2**20 / out_bytes))))]
    turn = [0]  # the next copy: the cold launches go round all of them, timing to timing

    def launches(weights: list[Any], outs: list[Any]) -> float:
        """Seconds per launch of ``number`` back to back, each on the next of ``weights``
        and of ``outs``."""
        handles = []
        for i in range(number):
            w, o = weights[turn[0] % len(weights)], outs[turn[0] % len(outs)]
            turn[0] += len(weights) > 1 or len(outs) > 1
            handles.append(device.launch(program, kernel, [args[0], w, o],
                                         timed=i in (0, number - 1)))
        return device.elapsed(handles[0], handles[-1]) / number

    return {"warm": lambda: launches([args[1]], [args[2]]),
            "cold": lambda: launches(cold_weights, [args[2]]),
            "cold out": lambda: launches([args[1]], cold_outs),
            "copies": copies, "weight_mb": weight.nbytes / 2**20, "out_mb": out_bytes / 2**20}


def prefetch_off() -> Any:
    """Kernels generated meanwhile do not prefetch (the A/B's other side)."""
    return mock.patch.object(prefetch, "wanted", lambda *args: False)


def label_of(task: Task, template: str) -> str:
    """A row's name: template, channels, kernel, stride, input size."""
    args = task.workload.args
    return (f"{template.split('.')[0]} {args[0][1][1]}->{args[1][1][0]} "
            f"{args[1][1][2]}x{args[1][1][3]} s{args[2][0]} {args[0][1][2]}x{args[0][1][3]}")


def prefetch_ab(device: Device, name: str, model: Any, records: Any,
                opts: argparse.Namespace) -> None:
    """The build with and without the prefetch, side by side (``--ab-prefetch``)."""
    on = build(model, records=records, device=device)
    with prefetch_off():
        off = build(model, records=records, device=device)
    minima = step_minima({"on": on, "off": off}, opts.rounds)
    steps = {label: dict(zip((step.name for step in on.program.steps), minima[label]))
             for label in minima}
    print(f"\n## {name}: prefetch on / off; ms per layer; {opts.rounds} rounds, "
          f"{opts.number} launches a timing\n")
    print("| layer | layers | weight MB | model on | off | off / on | cold on | off | "
          "off / on | warm on | off | off / on |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for task, choice in zip(on.tasks, on.choices):
        template = get_template(choice.template)
        if not template.blocked_io:
            continue
        io = template.measure_io(task.workload, choice.config) or IOLayout()
        source = template.codegen(task.workload, choice.config, device.dialect, Epilogue(), io)
        if "PREFETCH(wf" not in source.source:
            continue
        model_on, model_off = (layer_seconds(task, steps[k]) for k in ("on", "off"))
        timers = {"on": kernel_timers(device, task, choice.config, opts.number, opts.cold_mb)}
        with prefetch_off():
            timers["off"] = kernel_timers(device, task, choice.config, opts.number,
                                          opts.cold_mb)
        times: dict[str, list[float]] = defaultdict(list)
        for r in range(opts.rounds):
            for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
                for kind in ("cold", "warm"):
                    times[f"{kind} {side}"].append(timers[side][kind]())
        med = {key: statistics.median(values) for key, values in times.items()}
        cells = [f"{label_of(task, choice.template)}", str(len(task.layers)),
                 f"{timers['on']['weight_mb']:.2f}"]
        for a, b in ((model_on, model_off), (med["cold on"], med["cold off"]),
                     (med["warm on"], med["warm off"])):
            cells += [f"{a * 1e3:.3f}" if a else "-", f"{b * 1e3:.3f}" if b else "-",
                      f"{b / a:.2f}" if a and b else "-"]
        print("| " + " | ".join(cells) + " |")
    total_on, total_off = sum(minima["on"]), sum(minima["off"])
    print(f"| all steps | | | {total_on * 1e3:.2f} | {total_off * 1e3:.2f} | "
          f"{total_off / total_on:.3f} | | | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--database-url", help="a tuning's database (none: untuned build)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20, help="launches per timing")
    parser.add_argument("--cold-mb", type=float, default=512.0,
                        help="MB of weight copies the cold launches cycle through")
    parser.add_argument("--ab-prefetch", action="store_true",
                        help="the build with and without the next block's prefetch")
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header("bench/in_model.py", device.info.name)
    records = tuner.records.database(opts.database_url) if opts.database_url else None
    for name in opts.models.split(","):
        model = light_model(name)
        if opts.ab_prefetch:
            prefetch_ab(device, name, model, records, opts)
            continue
        module = build(model, records=records, device=device)
        minima = dict(zip((step.name for step in module.program.steps),
                          step_minima({name: module}, opts.rounds)[name]))
        rows = []
        totals: dict[str, float] = defaultdict(float)
        for task, choice in zip(module.tasks, module.choices):
            if not get_template(choice.template).blocked_io:
                continue
            in_model = layer_seconds(task, minima)
            if in_model is None:
                continue
            timers = kernel_timers(device, task, choice.config, opts.number, opts.cold_mb)
            kinds = ["warm", "cold", "cold out"]
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for r in range(opts.rounds):
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    times[kind].append(timers[kind]())
            warm, cold, cold_out = (statistics.median(times[k]) for k in kinds)
            layers = len(task.layers)
            for key, value in (("model", in_model), ("warm", warm), ("cold", cold),
                               ("cold out", cold_out), ("record", choice.cost or math.nan)):
                totals[key] += value * layers
            label = label_of(task, choice.template)
            rows.append((in_model / warm, label, layers, timers["weight_mb"], timers["copies"],
                         timers["out_mb"], choice.cost, in_model, warm, cold, cold_out))
        print(f"\n## {name}: {'tuned from ' + opts.database_url if records else 'untuned'}; "
              f"ms per layer; {opts.rounds} rounds, {opts.number} launches a timing\n")
        print("| layer | layers | weight MB (copies) | out MB | record | model | warm | cold | "
              "cold out | model / warm | model / cold |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (ratio, label, layers, mb, copies, out_mb, record, in_model, warm, cold,
             cold_out) in sorted(rows, key=lambda r: -r[0]):
            rec = f"{record * 1e3:.3f}" if record else "-"
            print(f"| {label} | {layers} | {mb:.2f} ({copies}) | {out_mb:.2f} | {rec} | "
                  f"{in_model * 1e3:.3f} | {warm * 1e3:.3f} | {cold * 1e3:.3f} | "
                  f"{cold_out * 1e3:.3f} | {ratio:.2f} | {in_model / cold:.2f} |")
        print(f"| all conv layers | | | | {totals['record'] * 1e3:.2f} | "
              f"{totals['model'] * 1e3:.2f} | {totals['warm'] * 1e3:.2f} | "
              f"{totals['cold'] * 1e3:.2f} | {totals['cold out'] * 1e3:.2f} | "
              f"{totals['model'] / totals['warm']:.2f} | "
              f"{totals['model'] / totals['cold']:.2f} |")


if __name__ == "__main__":
    main()

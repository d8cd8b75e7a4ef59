"""``tuner demo``: the quick start's main job on the embedded default.

Measures the default and a few random configs of ResNet-50's first 3x3 conv on the
local OpenCL device and prints a table, each kernel checked against numpy first.
"""

from __future__ import annotations

import random

import typer
from rich.console import Console
from rich.table import Table

from compiler.runtime import open_device
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest
from compiler.templates import get_template
from schemas import MeasureOptions, Workload

# ResNet-50, stage 2: the first 3x3 convolution (64 -> 64 channels on 56x56).
RESNET50_FIRST_3X3 = [["TENSOR", [1, 64, 56, 56], "float32"],
                      ["TENSOR", [64, 64, 3, 3], "float32"],
                      [1, 1], [1, 1, 1, 1], [1, 1], "float32"]


def demo(
    trials: int = typer.Option(8, "--trials", min=1, help="random configs besides the default"),
    seed: int = typer.Option(0, "--seed"),
    device: str | None = typer.Option(None, "--device", help="device spec, e.g. opencl:0"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds per trial"),
) -> None:
    """Measure ResNet-50's first 3x3 conv: the default config and random ones."""
    template = get_template("conv2d_nchw.cuda")
    workload = Workload(template=template.name, args=RESNET50_FIRST_3X3)
    with open_device(device) as dev:  # closed: the measuring child opens its own
        limits, name, target = dev.limits, dev.info.name, dev.target
    rng = random.Random(seed)
    configs = [("default", template.default_config(workload, limits))]
    configs += [(f"random {i + 1}", template.random_config(workload, rng, limits))
                for i in range(trials)]
    console = Console(width=max(Console().width, 140))  # pipes get 80 columns
    console.print(f"conv2d_nchw.cuda {workload.args_json()}\non {name} ({target}), "
                  f"{template.flops(workload) / 1e9:.3f} GFLOP per run")
    table = Table("config", "index", "tile_f", "tile_y", "tile_x", "tile_rc", "unroll",
                  "ms", "GFLOP/s", "status")
    options = MeasureOptions(number=3, repeat=3, min_repeat_ms=50, timeout_s=timeout)
    best = None
    with IsolatedMeasurer(device) as measurer:
        for label, config in configs:
            result = measurer.measure(MeasureRequest(template.name, workload, config, options))
            knobs = template.decode(workload, config)
            row = [label, str(config.index)] + [
                str(list(knobs[k])) for k in ("tile_f", "tile_y", "tile_x", "tile_rc")
            ] + [f"{knobs['auto_unroll_max_step']}/{knobs['unroll_explicit']}"]
            if result.ok:
                gflops = template.flops(workload) / result.mean_cost / 1e9
                best = max(best or 0.0, gflops)
                row += [f"{result.mean_cost * 1e3:.3f}", f"{gflops:.2f}", "ok (checked)"]
            else:
                row += ["-", "-", f"error {int(result.error_no)} {result.error_no.name}"]
            table.add_row(*row)
    console.print(table)
    if best is None:
        raise typer.Exit(1)
    console.print(f"best: {best:.2f} GFLOP/s")

"""Default-config variants of ``conv2d_NCHWc.x86`` on the layers a best-template build
leaves to it (no Winograd, no 1x1 template: strided 3x3, the 7x7 stem, padded 1x1),
timed in CPU seconds, alternating, in one run (issue 17).

Why: the default's register tile depends on the vector unit. An AVX2 core has 16
registers of 8 floats, where AutoTVM's reg_n up to 8 (128 accumulators) spills: the
8-lane default takes ``default_reg_n``'s 4-6 pixels x oc_bn 16. An AVX-512 core has 32
registers of 16 floats and two FMA units: there the 16-lane default takes oc_bn 32 x
reg_n up to 8 (``default_oc_bn``). Each variant below changes the default's lanes, oc_bn,
reg_n or vec; every kernel's output is checked against numpy first (the measurer's
tolerance), then ``--rounds`` alternating rounds of enough launches for ~0.2 GFLOP; the
median round counts. Data in NCHW[16]c and the output in NCHW[oc_bn]c, as a build chains
CPU convs (CPU seconds: see bench/conv1x1.py).

    .venv/bin/python bench/direct_defaults.py --models resnet50,densenet121
    .venv/bin/python bench/direct_defaults.py --models resnet50 --all   # every direct layer
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

from common import checked_launch, print_header
from conv1x1 import cpu_seconds

from compiler.build_module import load_graph
from compiler.frontend.samples import light_path
from compiler.passes import optimize
from compiler.runtime import Device, open_device
from compiler.tasks import CONV1X1_CPU, CONV_CPU, WINOGRAD_CPU, extract_tasks
from compiler.templates import IOLayout, get_template
from schemas import Config, DeviceLimits, Workload

# label -> knob overrides of the default config (reg_n: the largest factor of OW up to
# it); the first is the baseline every ratio divides
VARIANTS: dict[str, dict[str, int]] = {
    "8-lane default (AVX2)": {},
    "16-lane default (AVX-512)": {"lanes": 16},
    "16-lane, reg_n<=14": {"lanes": 16, "reg_n": 14},
    "8-lane, reg_n<=8": {"reg_n": 8},
    "8-lane, oc_bn 64, reg_n<=4": {"oc_bn": 64, "reg_n": 4},
    "16-lane, order_oc 1": {"lanes": 16, "order_oc": 1},
}


def variant(workload: Workload, overrides: dict[str, int]) -> Config:
    """The default config for ``lanes`` (8 unless given) with the other ``overrides``
    applied (``reg_n``: the largest factor of OW up to the value given; ``vec`` where it
    divides oc_bn; ``oc_bn`` with ic_bn and vec capped by it; ``order_oc`` as given)."""
    template = get_template(CONV_CPU)
    limits = DeviceLimits(simd_lanes=overrides.get("lanes", 8))
    values = dict(template.space(workload).decode(template.default_config(workload, limits)))
    if "vec" in overrides and values["tile_oc"][1] % overrides["vec"] == 0:
        values["vec"] = overrides["vec"]
    if "oc_bn" in overrides and template.parse(workload).co % overrides["oc_bn"] == 0:
        co, oc_bn = template.parse(workload).co, overrides["oc_bn"]
        values["tile_oc"] = (co // oc_bn, oc_bn)
        values["tile_ic"] = (values["tile_ic"][0] * values["tile_ic"][1] // min(
            values["tile_ic"][1], oc_bn), min(values["tile_ic"][1], oc_bn))
        values["vec"] = min(values["vec"], oc_bn)
    if "order_oc" in overrides:
        values["order_oc"] = overrides["order_oc"]
    if "reg_n" in overrides:
        ow = template.parse(workload).ow
        reg_n = max(f for f in range(1, overrides["reg_n"] + 1) if ow % f == 0)
        values["tile_ow"] = (ow // reg_n, reg_n)
    return template.space(workload).to_config(values)


def prepared(device: Device, workload: Workload, config: Config) -> Callable[[], None]:
    """One launch of ``config`` on blocked data, its output checked against numpy."""
    template = get_template(workload.template)
    # as a build runs it: a build's first conv reads the plain NCHW image
    launch = checked_launch(device, workload, config,
                            template.measure_io(workload, config) or IOLayout())

    def run() -> None:
        launch()
        device.synchronize()
    return run


def direct_only(name: str, device: Device, every: bool) -> list[tuple[Workload, int]]:
    """The model's direct-template workloads no Winograd/1x1 task covers (``every``: all
    of them), with layer counts."""
    import onnx

    graph = optimize(load_graph(onnx.load(light_path(name))))
    tasks = extract_tasks(graph, device.target)
    covered = {tuple(map(str, t.workload.args)) for t in tasks
               if t.template in (WINOGRAD_CPU, CONV1X1_CPU)}
    return [(t.workload, len(t.layers)) for t in tasks
            if t.template == CONV_CPU
            and (every or tuple(map(str, t.workload.args)) not in covered)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,vgg19,densenet121")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--all", action="store_true",
                   help="every direct-template workload (what an untuned build runs)")
    args = p.parse_args(argv)
    device = open_device()
    print_header("bench/direct_defaults.py", device.info.name,
                 " | CPU seconds; ratios: the first variant's time / the variant's")
    names = list(VARIANTS)
    base = names[0]
    print("\n| model | layer | layers | load | " + base + " GFLOP/s | "
          + " | ".join(names[1:]) + " |")
    print("|---|---|---:|---:|---:|" + "---:|" * (len(names) - 1))
    totals = {n: 0.0 for n in names}
    for model in args.models.split(","):
        for workload, layers in direct_only(model, device, args.all):
            template = get_template(CONV_CPU)
            op = template.parse(workload)
            gflop = template.flops(workload) / 1e9
            runs = {n: prepared(device, workload, variant(workload, o))
                    for n, o in VARIANTS.items()}
            launches = max(3, round(0.2 / gflop))
            per: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(args.rounds):
                for n, launch in runs.items():
                    start = cpu_seconds()
                    for _ in range(launches):
                        launch()
                    per[n].append((cpu_seconds() - start) / launches)
            med = {n: statistics.median(v) for n, v in per.items()}
            for n in names:
                totals[n] += med[n] * layers
            label = (f"{op.c}->{op.co} {op.kh}x{op.kw} s{op.stride[0]} "
                     f"{op.input_shapes[0][2]}x{op.input_shapes[0][3]}")
            print(f"| {model} | {label} | {layers} | {os.getloadavg()[0]:.1f} "
                  f"| {gflop / med[base]:.1f} | "
                  + " | ".join(f"{med[base] / med[n]:.2f}x" for n in names[1:]) + " |",
                  flush=True)
    print("\n# all rows, weighted by layer count: "
          + ", ".join(f"{n} {totals[base] / totals[n]:.2f}x" for n in names[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

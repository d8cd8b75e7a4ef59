"""``conv2d_NCHWc.x86`` on the layers a best-template build leaves to it (ResNet-50's
3x3 stride-2 layers and the 7x7 stride-2 stem) against onnxruntime's Conv on the same
arrays, side by side, wall clock (issue 17: no conv layer under 0.8x onnxruntime).

Per layer: the default config, ``--sample`` configs drawn from the space restricted to
what can fit the register file (``MAX_ACC`` accumulator floats, oc_bn 8-64, vec 8 or
16, wg 1 or 2), and any ``--config`` given (knob=value,... over the default). Each kernel
is built for the layouts a build gives it (data in NCHW[16]c, or plain NCHW when C is not
a multiple of 16: the stem reads the model's input; the output in NCHW[oc_bn]c; ``--io
plain``: NCHW in and out, as the measurer times trials) and its output checked against
numpy (the measurer's tolerance) before it is timed. Screening: each config once, CPU
seconds per launch over ~``--screen-ms`` (bench/conv1x1.py says why). Then the default,
every ``--config``, the ``--top`` fastest of the sample and onnxruntime (intra-op threads
= CPU count) in ``--rounds`` rounds, each in a new order: wall and CPU seconds
per launch, the ratio onnxruntime / kernel per round (median) and of the fastest rounds
(on a shared machine wall times swing between rounds; alternating keeps the ratio fair,
the fastest round is the least disturbed; onnxruntime's CPU seconds include its threads'
spinning, which goes on after a run: each entry waits 0.1 s before it is timed).

    .venv/bin/python bench/direct_strided.py                      # rows 0, 6, 12, 18
    .venv/bin/python bench/direct_strided.py --layers 12 --sample 150
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from common import cpu_model, git_revision, onnxruntime_conv
from conv1x1 import CHECK, cpu_seconds
from layers import conv_layers, select

from compiler.runtime import Device, open_device
from compiler.runtime.measure import max_abs_error_ok
from compiler.tasks import CONV_CPU
from compiler.templates import Epilogue, IOLayout, get_template
from compiler.templates.base import from_blocked, to_blocked
from schemas import Config, Workload

LAYERS = "0,6,12,18"
DATA_BLOCK = 16
# accumulator floats a sampled config may hold: 28 of the 32 vector registers of 16
# floats (PoCL compiles for skylake-avx512 here: the host has AVX-512)
MAX_ACC = 28 * 16
OC_BN = (8, 16, 32, 64)


def fits_registers(values: dict[str, Any]) -> bool:
    """A config whose accumulators can live in the vector registers."""
    oc_bn = values["tile_oc"][1]
    acc = values.get("tile_oh", 1) * values["tile_ow"][1] * oc_bn
    return (oc_bn in OC_BN and values["vec"] in (8, 16) and oc_bn % values["vec"] == 0
            and acc <= MAX_ACC and values["wg"] <= 2
            and values["tile_ic"][1] % values["unroll_ci"] == 0)


def sample(workload: Workload, count: int, seed: int) -> list[Config]:
    """``count`` distinct configs of the space that ``fits_registers``."""
    space = get_template(CONV_CPU).space(workload)
    rng = random.Random(seed)
    chosen: dict[int, Config] = {}
    for _ in range(200_000):
        if len(chosen) == count:
            break
        index = rng.randrange(len(space))
        if index not in chosen and fits_registers(space.values_at(index)):
            chosen[index] = space.get(index)
    return list(chosen.values())


class Prepared:
    """One config of a layer, built, its output checked: ``launch`` runs it once."""

    def __init__(self, device: Device, workload: Workload, config: Config,
                 arrays: list[np.ndarray], want: np.ndarray, blocked: bool = True) -> None:
        template = get_template(CONV_CPU)
        op = template.parse(workload)
        data_block = DATA_BLOCK if op.c % DATA_BLOCK == 0 and blocked else 0
        io = IOLayout(data_block, template.out_block(workload, config) if blocked else 0)
        self.kernel = template.codegen(workload, config, device.dialect, Epilogue(), io)
        self.program = device.build(self.kernel)
        self.buffers = [device.upload(np.ascontiguousarray(to_blocked(arrays[0], data_block))),
                        device.upload(template.pack_weight(workload, config, arrays[1])),
                        device.alloc(self.kernel.buffers[-1].shape)]
        self.device = device
        device.run(self.program, self.kernel, self.buffers)
        got = from_blocked(device.download(self.buffers[-1], self.kernel.buffers[-1].shape),
                           io.out_block)
        ok, why = max_abs_error_ok(got, want, CHECK)
        if not ok:
            raise RuntimeError(f"differs from numpy: {why}")

    def run(self) -> None:
        self.device.run(self.program, self.kernel, self.buffers)

    def cpu_seconds(self, budget_s: float) -> float:
        """CPU seconds (this process, PoCL's threads included) per launch over about
        ``budget_s``: less swayed by other work on the machine than wall time."""
        self.run()
        t0 = cpu_seconds()
        self.run()
        number = max(1, int(budget_s / max(cpu_seconds() - t0, 1e-4)))
        t0 = cpu_seconds()
        for _ in range(number):
            self.run()
        return (cpu_seconds() - t0) / number


def wall(call: Callable[[], Any], budget_s: float) -> tuple[float, float]:
    """(wall, CPU) seconds per call over about ``budget_s`` (one warm-up call first)."""
    call()
    once = time.perf_counter()
    call()
    once = time.perf_counter() - once
    number = max(1, int(budget_s / max(once, 1e-6)))
    t0, c0 = time.perf_counter(), cpu_seconds()
    for _ in range(number):
        call()
    return (time.perf_counter() - t0) / number, (cpu_seconds() - c0) / number


def knobs_text(workload: Workload, config: Config) -> str:
    values = get_template(CONV_CPU).decode(workload, config)
    short = {"tile_ic": "ic_bn", "tile_oc": "oc_bn", "tile_ow": "reg_n"}
    return " ".join(f"{short.get(k, k)}={v[1] if isinstance(v, tuple) else int(v)}"
                    for k, v in values.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default=LAYERS, help=f"rows of bench/layers.py ({LAYERS})")
    p.add_argument("--sample", type=int, default=100, help="configs sampled per layer (100)")
    p.add_argument("--config", action="append", default=[],
                   help="extra config as knob=value,... over the default (repeatable)")
    p.add_argument("--top", type=int, default=3,
                   help="fastest screened configs of the sample timed (3)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (5)")
    p.add_argument("--screen-ms", type=float, default=30.0, help="screening time per config")
    p.add_argument("--round-ms", type=float, default=150.0, help="time per entry per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--io", choices=("blocked", "plain"), default="blocked",
                   help="blocked: the layouts a build gives the kernel (default); plain: "
                        "NCHW in and out, as the measurer times trials")
    args = p.parse_args(argv)

    device = open_device(None)
    template = get_template(CONV_CPU)
    threads = os.cpu_count() or 1
    print(f"# {cpu_model()}, {device.info.name}, {git_revision()}, load {os.getloadavg()}")
    for layer in select(conv_layers(device.target), args.layers):
        workload, op = layer.cpu, layer.op
        rng = np.random.default_rng(args.seed)
        arrays = template.make_inputs(workload, Epilogue(), rng)
        want = template.reference(workload, arrays)
        space = template.space(workload)
        default = template.default_config(workload)
        extra = []
        for spec in args.config:
            values = dict(space.decode(default))
            for item in spec.split(","):
                name, value = item.split("=")
                if name in ("ic_bn", "oc_bn", "reg_n"):
                    extent = {"ic_bn": op.c, "oc_bn": op.co, "reg_n": op.ow}[name]
                    knob = {"ic_bn": "tile_ic", "oc_bn": "tile_oc", "reg_n": "tile_ow"}[name]
                    values[knob] = (extent // int(value), int(value))
                else:
                    values[name] = type(values[name])(int(value))
            extra.append(space.to_config(values))
        configs = [default, *extra, *sample(workload, args.sample, args.seed)]
        screened: list[tuple[float, Config, Prepared]] = []
        t0 = time.perf_counter()
        for config in configs:
            try:
                prepared = Prepared(device, workload, config, arrays, want,
                                    args.io == "blocked")
            except Exception as err:  # noqa: BLE001 - a config that fails is reported
                print(f"#   {knobs_text(workload, config)}: {str(err)[:200]}", file=sys.stderr)
                continue
            screened.append((prepared.cpu_seconds(args.screen_ms / 1e3), config, prepared))
        build_s = time.perf_counter() - t0
        ranked = sorted(screened, key=lambda s: s[0])
        ort = onnxruntime_conv(op, arrays[1], threads)
        got = ort(arrays[0])
        ok, why = max_abs_error_ok(got, want, CHECK)
        if not ok:
            raise SystemExit(f"onnxruntime differs from numpy: {why}")
        entries: dict[str, Callable[[], Any]] = {
            "onnxruntime": lambda f=ort, x=arrays[0]: f(x)}
        entries["default"] = screened[0][2].run
        labels = {"default": knobs_text(workload, default)}
        # every --config is timed (as configN); of the sampled ones the --top fastest
        given = {config.index: f"config{i + 1}" for i, config in enumerate(extra)}
        sampled = []
        for _, config, prep in ranked:
            if config.index in given:
                entries[given[config.index]] = prep.run
                labels[given[config.index]] = (f"{knobs_text(workload, config)} "
                                               f"(index {config.index})")
            elif prep is not screened[0][2]:
                sampled.append((config, prep))
        for rank, (config, prep) in enumerate(sampled[:args.top]):
            entries[f"best{rank + 1}"] = prep.run
            labels[f"best{rank + 1}"] = f"{knobs_text(workload, config)} (index {config.index})"
        times: dict[str, list[float]] = {k: [] for k in entries}
        cpu: dict[str, list[float]] = {k: [] for k in entries}
        order = random.Random(args.seed)
        for _ in range(args.rounds):
            # a new order each round: onnxruntime's threads spin on for a while after a
            # run, slowing whatever comes next, so no entry always follows it
            for name in order.sample(list(entries), len(entries)):
                call = entries[name]
                time.sleep(0.1)  # let the last entry's threads go idle
                w, c = wall(call, args.round_ms / 1e3)
                times[name].append(w)
                cpu[name].append(c)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = {k: statistics.median(o / t for o, t in zip(times["onnxruntime"], v))
                 for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        print(f"\n## {layer.index} {layer.label}: {len(screened)} configs built and checked "
              f"in {build_s:.0f} s; load {os.getloadavg()[0]:.2f}")
        print("| entry | ms median | ms min | CPU ms median | onnxruntime / entry: median "
              "of rounds | of the min | config |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for name, seconds in med.items():
            print(f"| {name} | {seconds * 1e3:.3f} | {best[name] * 1e3:.3f} "
                  f"| {statistics.median(cpu[name]) * 1e3:.3f} | {ratio[name]:.2f}x "
                  f"| {best['onnxruntime'] / best[name]:.2f}x | {labels.get(name, '')} |")
        print(f"# screening (CPU seconds): default {screened[0][0] * 1e3:.2f} ms; fastest 8: "
              + "; ".join(
            f"{s * 1e3:.2f} ms {knobs_text(workload, c)}" for s, c, _ in ranked[:8]))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

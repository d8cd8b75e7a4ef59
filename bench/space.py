"""Does the widened ``conv2d_NCHWc.x86`` space hold faster kernels? The best of a small
search over the whole space against the best of the same search restricted to the knobs
the template had before (the loop knobs ``order_oc`` and ``unroll_ci`` at their defaults),
against onnxruntime's Conv, on ResNet-50's conv layers, side by side in one run.

Per layer (the rows of ``bench/layers.py``, ``--layers`` picks them):

1. search, the same budget in both spaces: old space, the default config (loop knobs at
   their defaults) and ``--configs`` configs drawn at random (seeded) that fit the
   device's limits; new space, the first half of that draw (measured once, reused), then
   the loop-knob variants (order_oc x unroll_ci) of the fastest configs found so far,
   best first, until as many configs are measured: what a tuner's local search does with
   two knobs appended to a space it has already explored. Every trial is checked against
   numpy first (error_no 0, else it is dropped and counted);
2. verify: the best config of each search, the default config, the default config
   before the loop knobs ("old default": unroll_ci 1) and onnxruntime's Conv on the same
   arrays, re-measured in alternation for ``--rounds`` rounds; the medians and their
   ratios are printed (GFLOP/s).

The search uses a short timing rule (``--search-min-repeat-ms``) so it stays cheap; the
verification uses the full one. On a loaded machine the medians of the alternated rounds
are the figures to read, never a single time.

    .venv/bin/python bench/space.py --layers 1x1 --configs 40
    .venv/bin/python bench/space.py --layers 1,3,5,7,2,10 --configs 40 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
from common import cpu_model, git_revision, host_seconds, onnxruntime_conv
from layers import Layer, conv_layers, select

from compiler.runtime import Device, open_device
from compiler.runtime.measure import MeasureRequest, max_abs_error_ok, measure, task_operands
from compiler.tasks import CONV_CPU
from compiler.templates import Epilogue, get_template
from compiler.templates.conv2d_nchwc import LOOP_DEFAULTS
from schemas import Config, MeasureOptions, Workload

TEMPLATE = get_template(CONV_CPU)


@dataclass
class Search:
    """One search's measured configs: (seconds, config), fastest first."""

    found: list[tuple[float, Config]] = field(default_factory=list)
    failed: int = 0

    @property
    def best(self) -> Config:
        return self.found[0][1]


def old_space(workload: Workload, config: Config) -> Config:
    """``config`` with the loop knobs at their defaults: a point of the old space."""
    space = TEMPLATE.space(workload)
    values = TEMPLATE.decode(workload, config)
    values.update(LOOP_DEFAULTS)
    return space.to_config(values)


def draw(workload: Workload, device: Device, count: int, seed: int) -> list[Config]:
    """The old space's default config, then ``count`` distinct configs of the old space
    that fit the device, drawn at random (seeded)."""
    rng = random.Random(zlib.crc32(f"{workload.key}/{seed}".encode()))
    default = old_space(workload, TEMPLATE.default_config(workload))
    configs = {default.index: default}
    tries = 0
    while len(configs) < count + 1:
        tries += 1
        if tries > 100 * (count + 1):
            raise RuntimeError(f"{workload.key}: not {count} configs fit the device")
        config = old_space(workload, TEMPLATE.random_config(workload, rng, device.limits))
        configs.setdefault(config.index, config)
    return list(configs.values())


def measure_into(out: Search, device: Device, workload: Workload, config: Config,
                 options: MeasureOptions, seed: int) -> None:
    """One trial (checked against numpy by the measurer); a failure is counted, not kept."""
    result = measure(device, MeasureRequest(CONV_CPU, workload, config, options, seed=seed))
    if result.error_no != 0:
        out.failed += 1
        print(f"    error {int(result.error_no)}: {(result.error_msg or '')[:200]}",
              file=sys.stderr)
        return
    out.found.append((result.mean_cost, config))
    out.found.sort(key=lambda item: item[0])


def search(device: Device, workload: Workload, configs: list[Config],
           options: MeasureOptions, seed: int) -> Search:
    out = Search()
    for config in configs:
        measure_into(out, device, workload, config, options, seed)
    if not out.found:
        raise RuntimeError(f"{workload.key}: every config of the search failed")
    return out


def loop_variants(workload: Workload, config: Config, device: Device) -> list[Config]:
    """``config`` with each other value of the loop knobs, those that fit the device."""
    space = TEMPLATE.space(workload)
    values = TEMPLATE.decode(workload, config)
    knobs = {k.name: k.values for k in space.knobs}
    out = []
    for order in knobs["order_oc"]:
        for unroll in knobs["unroll_ci"]:
            variant = space.to_config({**values, "order_oc": order, "unroll_ci": unroll})
            if (variant.index != config.index
                    and not TEMPLATE.check_limits(workload, variant, device.limits)):
                out.append(variant)
    return out


def search_new(device: Device, workload: Workload, old: Search, old_draw: list[Config],
               options: MeasureOptions, seed: int) -> Search:
    """The new space with the old search's budget: the first half of the old search's
    draw (their measurements reused: the same kernels), then, best first, the loop-knob
    variants of the fastest configs found so far until as many configs are measured."""
    first = {c.index for c in old_draw[:len(old_draw) // 2]}
    out = Search(found=[(t, c) for t, c in old.found if c.index in first])
    out.failed = len(first) - len(out.found)
    tried = set(first)
    while len(out.found) + out.failed < len(old_draw):
        todo = next((v for _, c in out.found for v in loop_variants(workload, c, device)
                     if v.index not in tried), None)
        if todo is None:
            break
        tried.add(todo.index)
        measure_into(out, device, workload, todo, options, seed)
    return out


def knobs_text(workload: Workload, config: Config) -> str:
    k = TEMPLATE.decode(workload, config)
    parts = [f"ic{k['tile_ic'][1]} oc{k['tile_oc'][1]} ow{k['tile_ow'][1]}"]
    parts += [f"{name}={value}" for name, value in k.items()
              if name not in ("tile_ic", "tile_oc", "tile_ow")]
    return " ".join(parts)


def verify(device: Device, layer: Layer, configs: dict[str, Config], options: MeasureOptions,
           rounds: int, seed: int, threads: int) -> dict[str, list[float]]:
    """Each config and onnxruntime, ``rounds`` times in alternation: seconds per run."""
    inputs, reference = task_operands(CONV_CPU, layer.cpu, Epilogue(), seed)
    conv = onnxruntime_conv(layer.op, inputs[1], threads)
    ok, why = max_abs_error_ok(conv(inputs[0]), reference(), options)
    if not ok:
        raise RuntimeError(f"onnxruntime differs from numpy on {layer.label}: {why}")
    times: dict[str, list[float]] = {name: [] for name in [*configs, "onnxruntime"]}
    # a config named twice (the old default is the default) is measured once per round
    first = {config.index: name for name, config in reversed(configs.items())}
    for _ in range(rounds):
        for name, config in configs.items():
            if first[config.index] != name:
                continue
            result = measure(device, MeasureRequest(CONV_CPU, layer.cpu, config, options,
                                                    seed=seed))
            if result.error_no != 0:
                raise RuntimeError(f"{layer.label} {name}: error {int(result.error_no)} "
                                   f"{result.error_msg}")
            times[name].append(result.mean_cost)
        times["onnxruntime"].append(host_seconds(lambda: conv(inputs[0]), options.number,
                                                 options.repeat, options.min_repeat_ms))
    for name, config in configs.items():
        times[name] = times[first[config.index]]
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default="1x1",
                   help="rows of bench/layers.py: indices or label substrings (default 1x1)")
    p.add_argument("--configs", type=int, default=40,
                   help="random configs per search, besides the default (40)")
    p.add_argument("--rounds", type=int, default=5, help="alternated verification rounds (5)")
    p.add_argument("--device", default=None, help="device spec, e.g. opencl:0")
    p.add_argument("--search-min-repeat-ms", type=float, default=20.0,
                   help="timing floor per repeat in the search (20)")
    p.add_argument("--min-repeat-ms", type=float, default=100.0,
                   help="timing floor per repeat in the verification (100)")
    p.add_argument("--seed", type=int, default=0, help="draws and input arrays (0)")
    p.add_argument("--ort-threads", type=int, default=os.cpu_count() or 1,
                   help="onnxruntime intra-op threads (default: CPU count)")
    args = p.parse_args(argv)

    device = open_device(args.device)
    chosen = select(conv_layers(device.target), args.layers)
    search_options = MeasureOptions(number=1, repeat=3, min_repeat_ms=args.search_min_repeat_ms)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=args.min_repeat_ms)
    import onnxruntime as ort

    print(f"# bench/space.py  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"# command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device: {device.info.spec} {device.info.name} | {device.info.platform}")
    print(f"# host: {platform.machine()} {cpu_model()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at start | code: {git_revision()}")
    print(f"# search: default + {args.configs} random configs per space, min_repeat_ms "
          f"{args.search_min_repeat_ms:g}; verify: {args.rounds} alternated rounds, "
          f"min_repeat_ms {args.min_repeat_ms:g}, medians; onnxruntime {ort.__version__} "
          f"{args.ort_threads} threads")
    sys.stdout.flush()
    rows = []
    started = time.time()
    for layer in chosen:
        log = (lambda msg, la=layer: print(f"  [{la.index} {la.label}] {msg}", file=sys.stderr,
                                           flush=True))
        found = {}
        old_draw = draw(layer.cpu, device, args.configs, args.seed)
        found[True] = search(device, layer.cpu, old_draw, search_options, args.seed)
        found[False] = search_new(device, layer.cpu, found[True], old_draw, search_options,
                                  args.seed)
        for old in (True, False):
            log(f"{'old' if old else 'new'} space: best {knobs_text(layer.cpu, found[old].best)}"
                f" ({len(found[old].found)} measured, {found[old].failed} failed)")
        default = TEMPLATE.default_config(layer.cpu)
        configs = {"old default": old_space(layer.cpu, default), "default": default,
                   "old best": found[True].best, "new best": found[False].best}
        times = verify(device, layer, configs, options, args.rounds, args.seed, args.ort_threads)
        med = {name: statistics.median(t) for name, t in times.items()}
        rows.append((layer, med, configs))
        gf = {name: layer.gflop / s for name, s in med.items()}
        log(" | ".join(f"{name} {g:.2f} GFLOP/s" for name, g in gf.items()))

    print()
    print("| # | layer | GFLOP | old default | default | old-space best | new-space best "
          "| onnxruntime | new / old | new / onnxruntime | old / onnxruntime |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layer, med, _ in rows:
        g = {name: layer.gflop / s for name, s in med.items()}
        print(f"| {layer.index} | {layer.label} | {layer.gflop:.3f} | {g['old default']:.2f} "
              f"| {g['default']:.2f} | {g['old best']:.2f} | {g['new best']:.2f} "
              f"| {g['onnxruntime']:.2f} "
              f"| {med['old best'] / med['new best']:.2f}x "
              f"| {med['onnxruntime'] / med['new best']:.2f}x "
              f"| {med['onnxruntime'] / med['old best']:.2f}x |")
    print()
    print("# GFLOP/s from the medians of the alternated rounds; ratios are speed ratios")
    for layer, _, configs in rows:
        print(f"# {layer.index} {layer.label}: old best "
              f"{knobs_text(layer.cpu, configs['old best'])}; new best "
              f"{knobs_text(layer.cpu, configs['new best'])}")
    ratios = [med["old best"] / med["new best"] for _, med, _ in rows]
    print(f"# new / old: geometric mean {float(np.exp(np.mean(np.log(ratios)))):.2f}x over "
          f"{len(rows)} layers; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"at the end; total {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Direct vs Winograd on ResNet-50's 3x3 stride-1 layers, one run.

For each layer, ``tuner tune`` tunes ``conv2d_nchw.cuda`` (direct) and
``conv2d_nchw_winograd.cuda`` (filter transform at compile time) with the same budget
into one fresh database; then both best configs are re-measured side by side,
alternating, in this process. GFLOP/s count the direct convolution's FLOPs for both
(as AutoTVM does), so they compare as speed. The CPU template ``conv2d_NCHWc.x86`` at
its default config runs alongside as the build's usual choice on a CPU-class device.

    .venv/bin/python bench/winograd.py [--trials 32] [--layers 64x56,128x28,256x14,512x7]

``--cpu``: the CPU Winograd ``conv2d_NCHWc_winograd.x86`` against onnxruntime's Conv
(MLAS: direct / im2col, no Winograd) and ``conv2d_NCHWc.x86``'s default. Per layer a
small search (``cpu_search_configs``: tile size x oc_bn x register block, 8 lanes, every
config checked against numpy by the measurer) measures each config once, briefly; then
onnxruntime (same arrays, output checked against numpy), the direct default, Winograd's
default and the search's three fastest are re-measured side by side in ``--rounds``
alternating rounds. Reported: medians as GFLOP/s of the direct convolution's FLOPs and
ratios to onnxruntime; "best" is the finalist with the lowest median.

    .venv/bin/python bench/winograd.py --cpu [--rounds 5] [--layers ...] [--ort-threads 2]

``--cpu-model resnet50``: the same end to end, on the onnx package's light model with
random weights (up to its logits): onnxruntime, the default build (direct template) and
a build whose 3x3 stride-1 layers take Winograd's default config (offered as records
measured here), both outputs checked against onnxruntime's, timed in alternating rounds.

    .venv/bin/python bench/winograd.py --cpu-model resnet50 [--rounds 5]

``--lanes``: Winograd's default config for an 8-lane device (AVX2) against its default
for a 16-lane one (AVX-512) on every Winograd layer of ``--models`` (3x3 stride-1, where
``compiler.tasks.winograd_preferred``), with onnxruntime's Conv on the same
arrays. Each kernel runs on data in NCHW[16]c with its output in NCHW[oc_bn]c (as a
build chains CPU convs) and is checked against numpy first, onnxruntime too; then
``--rounds`` alternating rounds (each kernel first in turn) of enough launches for
~0.3 GFLOP, a 0.1 s pause after each batch, the median round counts. The two defaults
are timed in CPU seconds (the ratio to read on a shared machine, see bench/conv1x1.py)
and wall clock; onnxruntime in wall clock only (its pool spins ~40 ms of this process's
CPU after a run: the pause keeps that out of the next kernel's CPU seconds). Totals
weight each row by its layer count.

    .venv/bin/python bench/winograd.py --lanes [--models resnet50,vgg19,densenet121]

``--tile-sizes``: on the same layers, Winograd's default config against the same knobs
at F(6x6) (``wide_tile``; ``tile_p`` as the default's, and 6) and at F(4x4) with
``tile_p`` 6, timed as ``--lanes`` times its two defaults (CPU seconds, alternating, each
checked against numpy first); ratios > 1: the variant is faster; "-" where the variant
is not a valid config on this device (too many accumulators) or is the default itself.
What F(6x6) adds to the search space.

    .venv/bin/python bench/winograd.py --tile-sizes [--models vgg19,resnet50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    host_seconds,
    offered_defaults,
    onnxruntime_conv,
    print_header,
    settle,
)
from tuning_real import tune

from compiler.runtime import Device, open_device
from compiler.runtime.measure import (
    MeasureRequest,
    max_abs_error_ok,
    measure,
    task_operands,
)
from compiler.tasks import CONV_CPU, CONV_GPU, WINOGRAD, WINOGRAD_CPU
from compiler.templates import Epilogue, get_template
from compiler.templates.conv2d_nchwc_winograd import WIDE_TILE, winograd_op
from compiler.templates.ops import Conv2dOp
from schemas import Config, DeviceLimits, MeasureOptions, Workload


def workload(template: str, spec: str) -> Workload:
    """``CxH``: ResNet-50's 3x3 stride-1 conv on C channels of HxH, for ``template``."""
    c, h = (int(v) for v in spec.lower().split("x"))
    layouts = ["NCHW", "NCHW"] if template in (CONV_CPU, WINOGRAD_CPU) else []
    return Workload(template=template, args=[
        ["TENSOR", [1, c, h, h], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], *layouts, "float32"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--layers", default="64x56,128x28,256x14,512x7")
    p.add_argument("--rounds", type=int, default=5, help="side-by-side re-measurements (5)")
    p.add_argument("--cpu", action="store_true",
                   help="CPU Winograd vs onnxruntime and the direct CPU template")
    p.add_argument("--cpu-model", default="",
                   help="a light model: default build vs Winograd on its 3x3 layers")
    p.add_argument("--ort-threads", type=int, default=os.cpu_count() or 1,
                   help="onnxruntime intra-op threads (default: CPU count)")
    p.add_argument("--lanes", action="store_true",
                   help="Winograd's 8-lane default vs its 16-lane default (and onnxruntime)")
    p.add_argument("--tile-sizes", action="store_true",
                   help="Winograd's default vs the same knobs at F(6x6) (and tile_p 6)")
    p.add_argument("--models", default="resnet50,vgg19,densenet121",
                   help="--lanes, --tile-sizes: the light models whose Winograd layers "
                        "are timed")
    args = p.parse_args(argv)
    device = open_device()
    target = str(device.target)
    print_header("bench/winograd.py", device.info.name, f" | load average {os.getloadavg()[0]:.1f}")
    if args.cpu_model:
        return cpu_model_main(device, args.cpu_model, args.rounds)
    if args.lanes:
        return lanes_main(device, args.models.split(","), args.rounds, args.ort_threads)
    if args.tile_sizes:
        return tile_sizes_main(device, args.models.split(","), args.rounds)
    if args.cpu:
        return cpu_main(device, args.layers.split(","), args.rounds, args.ort_threads)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=50)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.layers.split(","):
            print(f"## layer {spec}", flush=True)
            best: dict[str, tuple[Workload, Config]] = {}
            for template in (CONV_GPU, WINOGRAD):
                wl = workload(template, spec)
                record, _ = tune(wl, target, "lgbm", args.trials, Path(tmp) / "bench.db")
                best[template] = (wl, record.config)
            cpu = workload(CONV_CPU, spec)
            best[CONV_CPU] = (cpu, get_template(CONV_CPU).default_config(cpu, device.limits))
            costs: dict[str, list[float]] = {t: [] for t in best}
            for _ in range(args.rounds):
                for template, (wl, config) in best.items():
                    res = measure(device, MeasureRequest(template, wl, config, options))
                    if not res.ok:
                        raise SystemExit(f"{template} on {spec} failed now: {res.error_msg}")
                    costs[template].append(res.mean_cost)
            gflop = get_template(CONV_GPU).flops(best[CONV_GPU][0]) / 1e9
            speed = {t: gflop / statistics.median(c) for t, c in costs.items()}
            rows.append((spec, speed))
            print(f"   direct {speed[CONV_GPU]:.1f}  winograd {speed[WINOGRAD]:.1f}  "
                  f"x86 default {speed[CONV_CPU]:.1f} GFLOP/s", flush=True)
    print(f"\n{args.trials} lgbm trials per template and layer; median of {args.rounds} "
          "alternating re-measurements; GFLOP/s of the direct convolution's FLOPs\n")
    print("| layer (C x H, 3x3 s1) | direct conv2d_nchw.cuda | Winograd | Winograd / direct "
          "| conv2d_NCHWc.x86 default |")
    print("|---|---|---|---|---|")
    for spec, speed in rows:
        print(f"| {spec} | {speed[CONV_GPU]:.1f} | {speed[WINOGRAD]:.1f} | "
              f"{speed[WINOGRAD] / speed[CONV_GPU]:.2f}x | {speed[CONV_CPU]:.1f} |")
    return 0


def cpu_search_configs(wl: Workload, limits: DeviceLimits) -> list[Config]:
    """The configs the CPU search measures: F(2x2) and F(4x4); oc_bn 8, 16 or 32; 2-8
    tiles per register block; 8 lanes (an AVX2 register); those that fit the device."""
    template = get_template(WINOGRAD_CPU)
    op = template.parse(wl)
    space = template.space(wl)
    found = []
    for m in (2, 4):
        for oc_bn in (8, 16, 32):
            for tile_p in (2, 4, 6, 8):
                if op.co % oc_bn:
                    continue
                config = space.to_config({"tile_size": m, "tile_oc": (op.co // oc_bn, oc_bn),
                                          "tile_p": tile_p, "vec": 8, "wg": 1,
                                          "wide_tile": False})
                if not template.check_limits(wl, config, limits):
                    found.append(config)
    return found


FINALISTS = 3  # the search's fastest configs, re-measured side by side


def cpu_main(device: Device, specs: list[str], rounds: int, ort_threads: int) -> int:
    """The ``--cpu`` comparison: search, then alternating rounds, then the table."""
    winograd = get_template(WINOGRAD_CPU)
    direct = get_template(CONV_CPU)
    quick = MeasureOptions(number=1, repeat=3, min_repeat_ms=20)
    options = MeasureOptions(number=1, repeat=3, min_repeat_ms=50)
    rows: list[tuple[str, float, dict[str, float], dict[str, Any]]] = []
    for spec in specs:
        wl = workload(WINOGRAD_CPU, spec)
        op: Conv2dOp = winograd.parse(wl)
        gflop = op.flops / 1e9
        searched = []
        for config in cpu_search_configs(wl, device.limits):
            res = measure(device, MeasureRequest(WINOGRAD_CPU, wl, config, quick))
            if not res.ok:
                raise SystemExit(f"{spec} {winograd.decode(wl, config)} failed: {res.error_msg}")
            searched.append((res.mean_cost, config))
        searched.sort(key=lambda item: item[0])
        finalists = [config for _, config in searched[:FINALISTS]]
        print(f"## {spec}: {len(searched)} Winograd configs searched; re-measured: " +
              ", ".join(f"{winograd.decode(wl, c)} ({gflop / t:.1f} GFLOP/s)"
                        for t, c in searched[:FINALISTS]), flush=True)
        arrays, reference = task_operands(CONV_CPU, workload(CONV_CPU, spec), Epilogue(), 0)
        conv = onnxruntime_conv(op, arrays[1], ort_threads)
        ok, why = max_abs_error_ok(np.asarray(conv(arrays[0])), reference(), options)
        if not ok:
            raise SystemExit(f"onnxruntime on {spec} disagrees with numpy: {why}")
        kernels = {
            "direct": (CONV_CPU, workload(CONV_CPU, spec),
                       direct.default_config(workload(CONV_CPU, spec), device.limits)),
            "winograd default": (WINOGRAD_CPU, wl, winograd.default_config(wl, device.limits)),
            **{f"winograd #{i + 1}": (WINOGRAD_CPU, wl, c) for i, c in enumerate(finalists)},
        }
        costs: dict[str, list[float]] = {"onnxruntime": [], **{k: [] for k in kernels}}
        for _ in range(rounds):
            costs["onnxruntime"].append(host_seconds(lambda: conv(arrays[0]), options.number,
                                                     options.repeat, options.min_repeat_ms))
            for name, (template, wl_k, config) in kernels.items():
                res = measure(device, MeasureRequest(template, wl_k, config, options))
                if not res.ok:
                    raise SystemExit(f"{name} on {spec} failed now: {res.error_msg}")
                costs[name].append(res.mean_cost)
        median = {k: statistics.median(v) for k, v in costs.items()}
        # the search's best: the finalist of the lowest median in the rounds
        pick = min(range(len(finalists)), key=lambda i: median[f"winograd #{i + 1}"])
        median["winograd best"] = median[f"winograd #{pick + 1}"]
        rows.append((spec, gflop, median, winograd.decode(wl, finalists[pick])))
        ort = median["onnxruntime"]
        print("   " + "  ".join(f"{k} {gflop / v:.1f} GFLOP/s ({ort / v:.2f}x)"
                                for k, v in median.items()), flush=True)
    print(f"\nmedians of {rounds} alternating rounds; GFLOP/s of the direct convolution's "
          "FLOPs; (x) = onnxruntime's time / this one's\n")
    print("| layer (C x H, 3x3 s1) | onnxruntime Conv | conv2d_NCHWc.x86 default | "
          "Winograd default | Winograd best of search | best config |")
    print("|---|---|---|---|---|---|")
    for spec, gflop, median, knobs in rows:
        ort = median["onnxruntime"]
        cells = [f"{gflop / median[k]:.1f} ({ort / median[k]:.2f}x)"
                 for k in ("direct", "winograd default", "winograd best")]
        best = (f"F({knobs['tile_size']}x{knobs['tile_size']}) oc_bn {knobs['tile_oc'][1]} "
                f"tile_p {knobs['tile_p']} vec {knobs['vec']}")
        print(f"| {spec} | {gflop / ort:.1f} | {' | '.join(cells)} | {best} |")
    return 0


def winograd_layers(device: Device, name: str) -> list[tuple[Workload, int]]:
    """The light model's workloads a default build runs on Winograd (3x3 stride 1, where
    ``winograd_preferred``), with layer counts."""
    import onnx

    from compiler.build_module import load_graph
    from compiler.frontend.samples import light_path
    from compiler.passes import optimize
    from compiler.tasks import extract_tasks, winograd_preferred

    graph = optimize(load_graph(onnx.load(light_path(name))))
    template = get_template(WINOGRAD_CPU)
    ops = [(t, template.parse(t.workload)) for t in extract_tasks(graph, device.target)
           if t.template == WINOGRAD_CPU]
    return [(t.workload, len(t.layers)) for t, op in ops
            if winograd_preferred(op.c, op.co, op.h, op.w, device.limits.simd_lanes)]


LANES = (8, 16)  # the devices whose defaults --lanes compares: AVX2, AVX-512


def lanes_main(device: Device, models: list[str], rounds: int, ort_threads: int) -> int:
    """``--lanes``: per layer, the 8-lane and the 16-lane default and onnxruntime, one run."""
    from conv1x1 import CHECK
    from direct_defaults import prepared

    winograd = get_template(WINOGRAD_CPU)
    labels = [f"{lanes} lanes" for lanes in LANES]
    print("\nratios: the 8-lane default's time (or onnxruntime's) / the 16-lane default's; "
          "load: 1-minute load average after the row\n")
    print("| model | layer | layers | load | 16-lane config | 8-lane GFLOP/s (CPU s) "
          "| 16 / 8 lanes (CPU s) | 16 / 8 lanes (wall) | onnxruntime / 16 lanes (wall) |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|")
    totals: dict[str, dict[str, float]] = {}
    for model in models:
        for wl, layers in winograd_layers(device, model):
            op: Conv2dOp = winograd.parse(wl)
            gflop = op.flops / 1e9
            configs = {label: winograd.default_config(wl, device.limits.model_copy(
                update={"simd_lanes": lanes})) for label, lanes in zip(labels, LANES)}
            runs = {label: prepared(device, wl, config) for label, config in configs.items()}
            arrays = winograd.make_inputs(wl, Epilogue(), np.random.default_rng(0))
            conv = onnxruntime_conv(op, arrays[1], ort_threads)
            ok, why = max_abs_error_ok(np.asarray(conv(arrays[0])),
                                       winograd.reference(wl, arrays), CHECK)
            if not ok:
                raise SystemExit(f"onnxruntime on {op.input_shapes} disagrees with numpy: {why}")
            runs["onnxruntime"] = lambda conv=conv, x=arrays[0]: conv(x)
            med = alternating_times(runs, rounds, gflop)
            for scope in (model, "all models"):
                row = totals.setdefault(scope, dict.fromkeys(med, 0.0))
                for k, v in med.items():
                    row[k] += v * layers
            knobs = winograd.decode(wl, configs[labels[1]])
            print(f"| {model} | {op.c}->{op.co} {op.h}x{op.w} | {layers} "
                  f"| {os.getloadavg()[0]:.1f} | F({knobs['tile_size']}) oc_bn "
                  f"{knobs['tile_oc'][1]} tile_p {knobs['tile_p']} vec {knobs['vec']} "
                  f"| {gflop / med['8 lanes cpu']:.1f} | " + " | ".join(lanes_ratios(med))
                  + " |", flush=True)
    print("\nweighted by layer count (sums of median times):\n")
    print("| models | 16 / 8 lanes (CPU s) | 16 / 8 lanes (wall) | onnxruntime / 16 lanes "
          "(wall) | onnxruntime / 8 lanes (wall) |")
    print("|---|---:|---:|---:|---:|")
    for scope, med in sorted(totals.items(), key=lambda item: item[0] == "all models"):
        print(f"| {scope} | " + " | ".join(lanes_ratios(med)) + " | "
              f"{med['onnxruntime wall'] / med['8 lanes wall']:.2f}x |")
    return 0


def alternating_times(runs: dict[str, Any], rounds: int, gflop: float) -> dict[str, float]:
    """Median seconds per launch of each of ``runs`` ("LABEL cpu": CPU seconds, "LABEL
    wall": wall clock) over ``rounds`` rounds, each going first in turn, of enough
    launches for ~0.3 GFLOP."""
    from conv1x1 import cpu_seconds

    launches = max(3, round(0.3 / gflop))
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for i in range(rounds):
        for label in order[i % len(order):] + order[:i % len(order)]:  # each goes first in turn
            launch = runs[label]
            launch()
            cpu0, wall0 = cpu_seconds(), time.perf_counter()
            for _ in range(launches):
                launch()
            cpu[label].append((cpu_seconds() - cpu0) / launches)
            wall[label].append((time.perf_counter() - wall0) / launches)
            # onnxruntime's pool spins a while after a run, in this process: let it park
            # before the next kernel's clocks start
            settle()
    return {f"{k} {clock}": statistics.median(v)
            for clock, per in (("cpu", cpu), ("wall", wall)) for k, v in per.items()}


def tile_sizes_main(device: Device, models: list[str], rounds: int) -> int:
    """``--tile-sizes``: per Winograd layer, its default against F(6x6) and tile_p 6."""
    from direct_defaults import prepared

    winograd = get_template(WINOGRAD_CPU)
    variants = (("F(6x6)", 6, None), ("F(6x6) tile_p 6", 6, 6), ("F(4x4) tile_p 6", 4, 6))
    names = [name for name, _, _ in variants]
    print("\nCPU seconds, the default's over the variant's (> 1: the variant is faster); "
          "each row's fastest in bold\n")
    print("| model | layer | layers | default | " + " | ".join(names) + " |")
    print("|---|---|---:|---|" + "---:|" * len(names))
    totals: dict[str, dict[str, float]] = {}
    for model in models:
        for wl, layers in winograd_layers(device, model):
            op: Conv2dOp = winograd.parse(wl)
            default = winograd.default_config(wl, device.limits)
            knobs = winograd.decode(wl, default)
            configs = {"default": default}
            for name, m, tile_p in variants:
                tiles = winograd_op(op, m).tiles
                config = winograd.space(wl).to_config(
                    dict(knobs, tile_size=4, wide_tile=m == WIDE_TILE,
                         tile_p=min(tile_p or knobs["tile_p"], tiles)))
                if (config.index not in {c.index for c in configs.values()}
                        and not winograd.check_limits(wl, config, device.limits)):
                    configs[name] = config
            runs = {label: prepared(device, wl, config) for label, config in configs.items()}
            med = alternating_times(runs, rounds, op.flops / 1e9)
            fastest = min(med[f"{label} cpu"] for label in configs)
            for scope in (model, "all models"):
                row = totals.setdefault(scope, dict.fromkeys(["default", *names, "fastest"], 0.0))
                for label in ["default", *names]:  # a variant left out counts as the default
                    row[label] += med[f"{label if label in configs else 'default'} cpu"] * layers
                row["fastest"] += fastest * layers
            ratios = {n: med["default cpu"] / med[f"{n} cpu"] for n in names if n in configs}
            best = max(ratios.values(), default=0.0)
            cells = [("-" if n not in ratios else f"**{ratios[n]:.2f}x**"
                      if ratios[n] == best and best > 1 else f"{ratios[n]:.2f}x")
                     for n in names]
            print(f"| {model} | {op.c}->{op.co} {op.h}x{op.w} | {layers} | F({knobs['tile_size']}) "
                  f"tile_p {knobs['tile_p']} oc_bn {knobs['tile_oc'][1]} | " + " | ".join(cells)
                  + " |", flush=True)
    print("\nweighted by layer count (sums of median CPU seconds; a layer without the "
          "variant counts its default), and each layer's fastest:\n")
    print("| models | " + " | ".join(names) + " | fastest per layer |")
    print("|---|" + "---:|" * (len(names) + 1))
    for scope, row in sorted(totals.items(), key=lambda item: item[0] == "all models"):
        print(f"| {scope} | " + " | ".join(f"{row['default'] / row[n]:.3f}x"
                                           for n in [*names, "fastest"]) + " |")
    return 0


def lanes_ratios(med: dict[str, float]) -> list[str]:
    """16 / 8 lanes in CPU seconds and wall clock, onnxruntime / 16 lanes in wall clock."""
    return [f"{med['8 lanes cpu'] / med['16 lanes cpu']:.2f}x",
            f"{med['8 lanes wall'] / med['16 lanes wall']:.2f}x",
            f"{med['onnxruntime wall'] / med['16 lanes wall']:.2f}x"]


def without_final_softmax(model: Any) -> Any:
    """``model`` ending at its logits: with random weights a final softmax is one-hot,
    which would hide any difference between the builds' outputs."""
    import onnx
    from onnx import helper

    g = model.graph
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if not softmax or softmax[-1].output[0] != g.output[0].name:
        return model
    last = softmax[-1]
    out = helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None)
    graph = helper.make_graph([n for n in g.node if n is not last], g.name, g.input, [out],
                              list(g.initializer))
    new = helper.make_model(graph, opset_imports=model.opset_import)
    new.ir_version = model.ir_version
    return new


def light_model(name: str, seed: int) -> tuple[Any, np.ndarray]:
    """One of the light models with random weights (``seed``) and no final softmax, and
    its input: what every whole-model bench compares builds and onnxruntime on."""
    import onnx

    from compiler.frontend.samples import light_path, runner_input, with_random_weights

    model = without_final_softmax(with_random_weights(onnx.load(light_path(name)), seed=seed))
    x = np.random.default_rng(1).uniform(0, 1, size=runner_input(model).shape)
    return model, x.astype(np.float32)


def cpu_model_main(device: Device, name: str, rounds: int) -> int:
    """``--cpu-model``: onnxruntime, the default build and the Winograd build, one run."""
    from models import onnxruntime_timer

    from compiler.build_module import build, load_graph
    from compiler.passes import optimize
    from compiler.records import MemorySource
    from compiler.tasks import extract_tasks

    model, x = light_model(name, seed=0)
    ort_run, ort_seconds = onnxruntime_timer(model, x)
    want = ort_run()
    graph = optimize(load_graph(model))
    # Winograd's default config as this device's fastest record: the build takes it
    records = offered_defaults(extract_tasks(graph, device.target), device, [WINOGRAD_CPU])
    modules = {"default build": build(graph, device=device, optimized=True),
               "Winograd build": build(graph, device=device, optimized=True,
                                       records=MemorySource(records))}
    layers = sum(len(t.layers) for t in modules["Winograd build"].tasks
                 if t.template == WINOGRAD_CPU)
    print(f"## {name}: {len(records)} 3x3 stride-1 workloads ({layers} layers) on Winograd")
    for label, module in modules.items():
        (got,) = module.run([x])
        scale = float(np.abs(want).max())
        err = float(np.abs(got - want).max()) / scale
        if not np.allclose(got, want, rtol=1e-3, atol=1e-5 * scale):
            raise SystemExit(f"{label} disagrees with onnxruntime: max error {err:.2e} of max")
        print(f"   {label}: output matches onnxruntime (max error {err:.2e} of max |output|)")
    costs: dict[str, list[float]] = {"onnxruntime": [], **{k: [] for k in modules}}
    for _ in range(rounds):
        costs["onnxruntime"].append(ort_seconds(3))
        for label, module in modules.items():
            costs[label] += module.benchmark(number=3, repeat=1).costs
    median = {k: statistics.median(v) for k, v in costs.items()}
    print(f"\nms per run, medians of {rounds} alternating rounds (3 runs each)\n")
    print("| model | onnxruntime | default build | Winograd build | Winograd / default |")
    print("|---|---|---|---|---|")
    print(f"| {name} | {median['onnxruntime'] * 1e3:.1f} | {median['default build'] * 1e3:.1f} "
          f"| {median['Winograd build'] * 1e3:.1f} | "
          f"{median['default build'] / median['Winograd build']:.2f}x faster |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

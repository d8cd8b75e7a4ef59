"""ResNet-50's 1x1 conv layers: ``conv2d_NCHWc_1x1.x86`` against ``conv2d_NCHWc.x86``,
both at their default config, in the layouts a build gives them, timed in CPU seconds.

Why CPU seconds: on a machine shared with other work, wall-clock times of one kernel
swing by 2-5x between rounds (the OS hands the cores to others), so ratios of wall
times taken one after another mean little. The CPU time this process spends (user +
system, PoCL's worker threads included) per launch counts the work the kernel does and
not the waits; both templates are measured the same way, alternating, so their ratio is
the figure to read. (onnxruntime is left out: its thread pool spins while it waits, so
its CPU seconds are not its work.) ``--wall`` times wall clock instead.

Per layer and template: the kernel is built for ``--io`` (``blocked``: data in
NCHW[16]c and the output in NCHW[oc_bn]c, as a build chains CPU convs; ``plain``: NCHW,
as the measurer times trials), its output checked against numpy (the measurer's
tolerance), then ``--rounds`` alternating rounds of enough launches for ~0.2 GFLOP;
the median round counts.

``--model resnet50``: end to end on the onnx package's light model with random weights
(up to its logits), two builds: Winograd's default config on the 3x3 stride-1 layers
(the best build so far, docs/BENCHMARKS.md) and the same plus the 1x1 template's default
config on every 1x1 layer (each offered as a record measured here, so the build takes
it); both outputs checked against onnxruntime's, then alternating rounds of 3 runs
each, CPU seconds (``--wall``: wall clock) per run. Beside them the untuned build (which
runs the 1x1 template on a 16-lane device, ``compiler.tasks``) and the same with the direct
default offered on its 1x1 layers.

``--lanes``: the 1x1 template's default config for an 8-lane device (AVX2) against its
default for a 16-lane one (AVX-512), on every 1x1 layer without padding of ``--models``
(one row per workload, weighted by its layers), beside the direct template's 16-lane
default (a build takes the faster record) and onnxruntime's Conv (CPUExecutionProvider,
this machine's cores, its threads told not to spin, so its CPU seconds are its work) on
the same arrays; CPU seconds (``--wall``: wall clock). Every kernel's and onnxruntime's
output is checked against numpy first; blocked data and output as a build chains them.

    .venv/bin/python bench/conv1x1.py                    # every 1x1 layer, blocked
    .venv/bin/python bench/conv1x1.py --io plain --layers 1x1s2
    .venv/bin/python bench/conv1x1.py --model resnet50
    .venv/bin/python bench/conv1x1.py --lanes --models resnet50,densenet121
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from common import checked_launch, offered_defaults, onnxruntime_conv, print_header
from layers import Layer, conv_layers, select

from compiler.runtime import Device, open_device
from compiler.runtime.measure import max_abs_error_ok
from compiler.tasks import CONV1X1_CPU, CONV_CPU
from compiler.templates import Epilogue, IOLayout, get_template
from schemas import DeviceLimits, MeasureOptions, Workload

DATA_BLOCK = 16  # what the layer before writes by default (its oc_bn)
CHECK = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prepared(device: Device, workload: Workload, blocked: bool,
             limits: DeviceLimits | None = None) -> Callable[[], None]:
    """One launch of ``workload``'s default config (for ``limits``), its output checked
    against numpy."""
    template = get_template(workload.template)
    config = template.default_config(workload, limits)
    io = template.measure_io(workload, config) if blocked else None  # as a build runs it
    launch = checked_launch(device, workload, config, io or IOLayout())

    def run() -> None:
        launch()
        device.synchronize()
    return run


def onnxruntime_prepared(workload: Workload) -> Callable[[], None]:
    """One run of onnxruntime's Conv on ``workload``'s arrays (plain NCHW, as its graph
    has them), its output checked against numpy. Its intra-op threads (this machine's
    cores) block rather than spin when idle, so its CPU seconds count its work."""
    template = get_template(workload.template)
    op = template.parse(workload)
    arrays = template.make_inputs(workload, Epilogue(), np.random.default_rng(0))
    conv = onnxruntime_conv(op, arrays[1], os.cpu_count() or 1, spin=False)
    ok, why = max_abs_error_ok(conv(arrays[0]), template.reference(workload, arrays), CHECK)
    if not ok:
        raise SystemExit(f"onnxruntime {workload.args[:3]}: differs from numpy: {why}")
    return lambda: conv(arrays[0])


def lanes_main(device: Device, models: list[str], rounds: int,
               clock: Callable[[], float]) -> int:
    """``--lanes``: the 1x1 default for 8 lanes against it for 16 lanes, the direct 16-lane
    default and onnxruntime, alternating; ratios are the 8-lane default's time over each
    one's."""
    import onnx

    from compiler.build_module import load_graph
    from compiler.frontend.samples import light_path
    from compiler.passes import optimize
    from compiler.tasks import extract_tasks

    lanes8 = device.limits.model_copy(update={"simd_lanes": 8})
    lanes16 = device.limits.model_copy(update={"simd_lanes": 16})
    names = ("1x1, 8 lanes", "1x1, 16 lanes", "direct, 16 lanes", "onnxruntime")
    base = names[0]
    print(f"\nratios: the {base} default's time / each one's\n")
    print(f"| model | layer | layers | load | {base} GFLOP/s | " + " | ".join(names[1:]) + " |")
    print("|---|---|---:|---:|---:|" + "---:|" * (len(names) - 1))
    columns = (*names, "faster 16-lane template")
    totals = {m: {n: 0.0 for n in columns} for m in (*models, "all")}
    for model in models:
        graph = optimize(load_graph(onnx.load(light_path(model))))
        for task in extract_tasks(graph, device.target, every_candidate=True):
            if task.template != CONV1X1_CPU:
                continue
            gemm = task.workload
            direct = Workload(template=CONV_CPU, args=gemm.args)
            runs = dict(zip(names, (prepared(device, gemm, True, lanes8),
                                    prepared(device, gemm, True, lanes16),
                                    prepared(device, direct, True, lanes16),
                                    onnxruntime_prepared(gemm))))
            op = get_template(CONV1X1_CPU).parse(gemm)
            gflop = op.flops / 1e9
            launches = max(3, round(0.2 / gflop))
            per: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(rounds):
                for n, launch in runs.items():
                    start = clock()
                    for _ in range(launches):
                        launch()
                    per[n].append((clock() - start) / launches)
            med = {n: statistics.median(v) for n, v in per.items()}
            med["faster 16-lane template"] = min(med[names[1]], med[names[2]])
            layers = len(task.layers)
            for m in (model, "all"):
                for n in columns:
                    totals[m][n] += med[n] * layers
            label = f"{op.c}->{op.co} s{op.stride[0]} {op.h}x{op.w}"
            print(f"| {model} | {label} | {layers} | {os.getloadavg()[0]:.1f} "
                  f"| {gflop / med[base]:.1f} | "
                  + " | ".join(f"{med[base] / med[n]:.2f}x" for n in names[1:]) + " |",
                  flush=True)
    print("\n# weighted by layers, the 8-lane 1x1 default's time over each one's:")
    for m, t in totals.items():
        print(f"#   {m}: " + ", ".join(f"{n} {t[base] / t[n]:.2f}x" for n in columns[1:]))
    return 0


def model_main(device: Device, name: str, rounds: int, clock: Callable[[], float]) -> int:
    """``--model``: the Winograd build against Winograd + the 1x1 template."""
    import onnxruntime as ort
    from winograd import light_model

    from compiler.build_module import build, load_graph
    from compiler.passes import optimize
    from compiler.records import MemorySource
    from compiler.tasks import WINOGRAD_CPU, extract_tasks

    model, x = light_model(name, seed=0)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    graph = optimize(load_graph(model))
    tasks = extract_tasks(graph, device.target)
    winograd = offered_defaults(tasks, device, [WINOGRAD_CPU])
    gemm = offered_defaults(tasks, device, [CONV1X1_CPU])
    ones = {w.workload.key for w in gemm}
    direct = offered_defaults([t for t in extract_tasks(graph, device.target,
                                                             every_candidate=True)
                               if t.template == CONV_CPU
                               and Workload(template=CONV1X1_CPU, args=t.workload.args).key
                               in ones], device, [CONV_CPU])
    modules = {"Winograd build": build(graph, device=device, optimized=True,
                                       records=MemorySource(winograd)),
               "Winograd + 1x1 build": build(graph, device=device, optimized=True,
                                             records=MemorySource(winograd + gemm)),
               "untuned, direct on 1x1": build(graph, device=device, optimized=True,
                                               records=MemorySource(direct)),
               "untuned build": build(graph, device=device, optimized=True)}
    layers = sum(len(t.layers) for t in modules["Winograd + 1x1 build"].tasks
                 if t.template == CONV1X1_CPU)
    print(f"## {name}: {len(gemm)} 1x1 workloads ({layers} layers) on {CONV1X1_CPU}")
    scale = float(np.abs(want).max())
    for label, module in modules.items():
        (got,) = module.run([x])
        err = float(np.abs(got - want).max()) / scale
        if not np.allclose(got, want, rtol=1e-3, atol=1e-5 * scale):
            raise SystemExit(f"{label} disagrees with onnxruntime: max error {err:.2e} of max")
        print(f"   {label}: output matches onnxruntime (max error {err:.2e} of max |output|)")
    costs: dict[str, list[float]] = {k: [] for k in modules}
    for _ in range(rounds):
        for label, module in modules.items():
            start = clock()
            for _ in range(3):
                module.run([x])
            costs[label].append((clock() - start) / 3)
    base, new, direct_ms, untuned = (statistics.median(costs[k]) for k in modules)
    print(f"\nms per run, medians of {rounds} alternating rounds (3 runs each), load "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| model | Winograd build | Winograd + 1x1 build | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| {name} | {base * 1e3:.1f} | {new * 1e3:.1f} | {base / new:.2f}x |")
    print("\nthe untuned build (its template choice: the 1x1 template on a 16-lane device) "
          "against the same with the direct default on the 1x1 layers\n")
    print("| model | untuned, direct on 1x1 | untuned build | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| {name} | {direct_ms * 1e3:.1f} | {untuned * 1e3:.1f} | {direct_ms / untuned:.2f}x |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="1x1",
                   help="rows of bench/layers.py --list (indices or label substrings); "
                        "1x1 layers only (default: every one)")
    p.add_argument("--io", choices=("blocked", "plain"), default="blocked")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--wall", action="store_true", help="wall-clock seconds, not CPU seconds")
    p.add_argument("--model", default="", help="a light model: builds with and without it")
    p.add_argument("--lanes", action="store_true",
                   help="the 8-lane default against the 16-lane one (and the direct "
                        "template's, onnxruntime's) on --models' 1x1 layers")
    p.add_argument("--models", default="resnet50,densenet121",
                   help="light models whose 1x1 layers --lanes times")
    args = p.parse_args(argv)
    device = open_device()
    clock = time.perf_counter if args.wall else cpu_seconds
    rows: list[Layer] = [la for la in select(conv_layers(device.target), args.layers)
                         if la.gemm is not None]
    print_header("bench/conv1x1.py", device.info.name, f" | io {args.io} | {'wall' if args.wall else 'CPU'} seconds")
    if args.model:
        return model_main(device, args.model, args.rounds, clock)
    if args.lanes:
        return lanes_main(device, args.models.split(","), args.rounds, clock)
    print("\n| # | layer | load | direct default | 1x1 default | 1x1 / direct |")
    print("|---:|---|---:|---:|---:|---:|")
    ratios = []
    for la in rows:
        assert la.gemm is not None
        runs = {name: prepared(device, wl, args.io == "blocked")
                for name, wl in ((CONV_CPU, la.cpu), (CONV1X1_CPU, la.gemm))}
        launches = max(3, round(0.2e9 / (la.gflop * 1e9)))
        per: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, launch in runs.items():
                start = clock()
                for _ in range(launches):
                    launch()
                per[name].append((clock() - start) / launches)
        direct, gemm = (statistics.median(per[n]) for n in (CONV_CPU, CONV1X1_CPU))
        ratios.append(direct / gemm)
        print(f"| {la.index} | {la.label} | {os.getloadavg()[0]:.1f} "
              f"| {la.gflop / direct:.1f} | {la.gflop / gemm:.1f} | {direct / gemm:.2f}x |",
              flush=True)
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        print(f"\n# GFLOP per {'second' if args.wall else 'CPU-second'}; 1x1 / direct: "
              f"geometric mean {geo:.2f}x, min {min(ratios):.2f}x, max {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

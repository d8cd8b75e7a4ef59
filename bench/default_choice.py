"""What an untuned or partly tuned CPU build should run per conv layer (issue 17): the
preferred template's default config (``compiler.tasks``: Winograd on 3x3 stride-1 layers
of >= 16 input channels, direct elsewhere), the direct template's default (what untuned
builds ran before), the 1x1 template's default, or another device's record of some
candidate template (TopHub's logs), timed side by side in one run.

1. Per distinct conv workload of ``--model`` with more than one option: each option's
   kernel (its output checked against numpy first), ``--rounds`` alternating rounds of
   enough launches for ~0.2 GFLOP, median CPU seconds (PoCL runs on this process's
   threads: CPU time counts the work, not the other processes' load; see
   bench/conv1x1.py). Options: the preferred default, the direct and 1x1 defaults, and
   per candidate template the record the fallback chain takes from TopHub as another
   device's: llvm_v0.04.log's ``conv2d_NCHWc.x86`` records (skylake-avx512 and other
   x86 CPUs; their target key ``cpu`` does not match ``opencl -model=pocl-cpu``, so they
   are offered relabelled as another OpenCL CPU's) and the opencl (1080ti) and cuda logs'
   GPU-template records (key ``opencl``/``gpu``: they apply here as they are).
2. The whole model, outputs checked against onnxruntime, timed in alternating rounds
   (wall clock and the process's CPU time): the direct default everywhere (before), the
   preferred defaults with the 1x1 template's on every 1x1 layer without padding, the
   preferred defaults (an untuned build now), "foreign first" (on every layer the first
   candidate with a TopHub record runs that record: the rule before, where any other
   device's record beat a default) and the build the current rule makes with the TopHub
   records.

Options are forced by offering their config as this device's record (the build takes
the fastest of those), as bench/model_ops.py does.

    .venv/bin/python bench/default_choice.py --model resnet50 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from common import print_header
from conv1x1 import CHECK, DATA_BLOCK, cpu_seconds
from models import onnxruntime_timer
from winograd import light_model

from compiler.build_module import build, load_graph
from compiler.frontend.samples import (
    LIGHT_MODELS,
    light_path,
)
from compiler.ir import Graph, Node
from compiler.passes import optimize
from compiler.records import (
    OTHER_DEVICE,
    TOPHUB_DIR,
    Choice,
    MemorySource,
    choose_configs,
)
from compiler.records.memory import parse_log
from compiler.runtime import Device, open_device
from compiler.runtime.measure import max_abs_error_ok
from compiler.tasks import CONV1X1_CPU, CONV_CPU, candidates
from compiler.templates import Epilogue, IOLayout, get_template
from compiler.templates.base import from_blocked, to_blocked
from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target, Workload

X86_AS = Target.parse("opencl -model=skylake-avx512-cpu")  # the llvm log's records here
GPU_LOGS = ("opencl_v0.04.log", "cuda_v0.10.log")


def tophub_source() -> MemorySource:
    """TopHub's x86 records relabelled as another OpenCL CPU's, and its GPU logs' records."""
    def log(name: str) -> list[Record]:
        path = TOPHUB_DIR / name
        return parse_log(path.read_text().splitlines(), str(path))

    x86 = [r.model_copy(update={"target": X86_AS}) for r in log("llvm_v0.04.log")]
    return MemorySource([*x86, *(r for name in GPU_LOGS for r in log(name))])


def forced(workload: Workload, config: Config, target: Target) -> Record:
    """``config`` offered as this device's fastest record of ``workload``."""
    return Record(target=target, workload=workload, config=config,
                  result=MeasureResult(costs=(1e-9,), error_no=MeasureErrorNo.NO_ERROR))


def prepared(device: Device, workload: Workload, config: Config) -> Callable[[], None]:
    """One launch of ``config`` (blocked data as a build chains CPU convs, plain NCHW for
    the GPU templates), its output checked against numpy."""
    template = get_template(workload.template)
    arrays = template.make_inputs(workload, Epilogue(), np.random.default_rng(0))
    want = template.reference(workload, arrays)
    io = IOLayout()
    if template.blocked_io:
        data_block = DATA_BLOCK if arrays[0].shape[1] % DATA_BLOCK == 0 else 0
        io = IOLayout(data_block, template.out_block(workload, config))
    kernel = template.codegen(workload, config, device.dialect, Epilogue(), io)
    program = device.build(kernel)
    inputs = template.kernel_inputs(workload, config, arrays)
    buffers = [device.upload(np.ascontiguousarray(to_blocked(inputs[0], io.data_block))),
               *[device.upload(np.ascontiguousarray(a)) for a in inputs[1:]]]
    out = device.alloc(kernel.buffers[-1].shape)
    device.run(program, kernel, [*buffers, out])
    got = from_blocked(device.download(out, kernel.buffers[-1].shape), io.out_block)
    ok, why = max_abs_error_ok(got.reshape(want.shape), want, CHECK)
    if not ok:
        raise SystemExit(f"{workload.template} {workload.args[:3]} {config}: differs from "
                         f"numpy: {why}")
    return lambda: device.run(program, kernel, [*buffers, out])


def short(template: str) -> str:
    return {"conv2d_NCHWc.x86": "direct", "conv2d_NCHWc_winograd.x86": "wino",
            "conv2d_NCHWc_1x1.x86": "1x1", "conv2d_nchw.cuda": "gpu-direct",
            "conv2d_nchw_winograd.cuda": "gpu-wino"}.get(template, template)


def layer_options(node: Node, target: Target, found: dict[str, Choice]
                  ) -> dict[str, tuple[Workload, Config]]:
    """label -> (workload, config): the preferred default, the direct default, and each
    candidate's TopHub record (another device's)."""
    options = candidates(node, target)
    first = options[0]
    out = {f"{short(first.template)} default (preferred)":
           (first, get_template(first.template).default_config(first))}
    for w in options:
        if w is not first and w.template in (CONV_CPU, CONV1X1_CPU):
            label = "direct default (before)" if w.template == CONV_CPU else "1x1 default"
            out[label] = (w, get_template(w.template).default_config(w))
    for w in options:
        choice = found[w.key]
        if choice.source == OTHER_DEVICE and choice.record is not None:
            out[f"{short(w.template)} {choice.record.target.model}"] = (w, choice.config)
    return out


def per_layer(device: Device, graph: Graph, source: MemorySource, rounds: int) -> None:
    """Part 1: each distinct CPU-template conv workload's options, side by side."""
    nodes: dict[str, Node] = {}
    counts: dict[str, int] = {}
    for node in graph.ops():
        options = candidates(node, device.target)
        if options and get_template(options[0].template).blocked_io:
            nodes.setdefault(options[0].key, node)
            counts[options[0].key] = counts.get(options[0].key, 0) + 1
    every = [w for n in nodes.values() for w in candidates(n, device.target)]
    found = dict(zip((w.key for w in every),
                     choose_configs(every, source, device.target, device.limits)))
    print(f"\n## per layer: median CPU ms of {rounds} alternating rounds; ratio = the "
          "preferred default's time / the option's (> 1: the option is faster)\n")
    print("| layer | layers | load | option | ms | vs preferred default |")
    print("|---|---:|---:|---|---:|---:|")
    for key, node in nodes.items():
        opts = layer_options(node, device.target, found)
        if len(opts) < 2:
            continue
        runs = {label: prepared(device, w, c) for label, (w, c) in opts.items()}
        preferred = candidates(node, device.target)[0]
        template = get_template(preferred.template)
        op = template.parse(preferred)
        launches = max(3, round(0.2e9 / template.flops(preferred)))
        per: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(rounds):
            for label, launch in runs.items():
                start = cpu_seconds()
                for _ in range(launches):
                    launch()
                per[label].append((cpu_seconds() - start) / launches)
        med = {label: statistics.median(v) for label, v in per.items()}
        base = next(iter(med.values()))
        name = (f"{op.c}->{op.co} {op.kh}x{op.kw} s{op.stride[0]} "
                f"{op.input_shapes[0][2]}x{op.input_shapes[0][3]}")
        for label, seconds in med.items():
            print(f"| {name} | {counts[key]} | {os.getloadavg()[0]:.1f} | {label} "
                  f"| {seconds * 1e3:.2f} | {base / seconds:.2f}x |", flush=True)


def first_foreign(graph: Graph, source: MemorySource, device: Device) -> list[Record]:
    """Records forcing the rule before: per layer, the first candidate with another
    device's record runs it; layers without one run their preferred default."""
    every = [w for n in graph.ops() for w in candidates(n, device.target)]
    found = dict(zip((w.key for w in every),
                     choose_configs(every, source, device.target, device.limits)))
    records = []
    for node in graph.ops():
        options = candidates(node, device.target)
        other = [found[w.key] for w in options if found[w.key].source == OTHER_DEVICE]
        if other:
            records.append(forced(other[0].workload, other[0].config, device.target))
    return records


def whole_model(device: Device, name: str, source: MemorySource, rounds: int) -> None:
    """Part 2: the model's builds against onnxruntime, alternating."""

    model, x = light_model(name, seed=LIGHT_MODELS.index(name))
    ort_run, _ = onnxruntime_timer(model, x)
    want = ort_run()
    graph = optimize(load_graph(model))

    def defaults(pick: Callable[[list[Workload]], Workload]) -> MemorySource:
        """Per layer, the default config of the candidate ``pick`` names, forced."""
        return MemorySource(
            forced(w, get_template(w.template).default_config(w, device.limits), device.target)
            for w in (pick(candidates(n, device.target)) for n in graph.ops()
                      if candidates(n, device.target)))

    def direct(options: list[Workload]) -> Workload:
        return next((w for w in options if w.template == CONV_CPU), options[0])

    def with_1x1(options: list[Workload]) -> Workload:
        return next((w for w in options if w.template == CONV1X1_CPU), options[0])

    sources: dict[str, MemorySource | None] = {
        "direct defaults (before)": defaults(direct),
        "preferred, 1x1 default on 1x1 layers": defaults(with_1x1),
        "preferred defaults (untuned now)": None,
        "foreign first (rule before)": MemorySource(first_foreign(graph, source, device)),
        "TopHub, current rule": source,
    }
    builds = {label: build(graph, device=device, optimized=True, records=records)
              for label, records in sources.items()}
    scale = float(np.abs(want).max())
    for label, module in builds.items():
        (got,) = module.run([x])
        if not np.allclose(got, want, rtol=1e-3, atol=1e-5 * scale):
            raise SystemExit(f"{name} {label} disagrees with onnxruntime")
        took = sorted({f"{short(c.template)} {c.source}" for c in module.choices})
        print(f"# {label}: output matches onnxruntime; tasks: {', '.join(took)}")
    labels = ["onnxruntime", *builds]
    wall: dict[str, list[float]] = {k: [] for k in labels}
    cpu: dict[str, list[float]] = {k: [] for k in labels}
    for _ in range(rounds):
        for label in labels:
            start, start_cpu = time.perf_counter(), cpu_seconds()
            for _ in range(2):
                if label == "onnxruntime":
                    ort_run()
                else:
                    builds[label].run([x])
            wall[label].append((time.perf_counter() - start) / 2)
            cpu[label].append((cpu_seconds() - start_cpu) / 2)
    print(f"\n## {name}: ms per run (wall clock, and CPU time of all the process's "
          f"threads), medians of {rounds} alternating rounds of 2 runs, load "
          f"{os.getloadavg()[0]:.1f}; ratios = the preferred defaults' time / the build's\n")
    print("| build | wall ms | vs preferred | CPU ms | vs preferred | wall / onnxruntime |")
    print("|---|---:|---:|---:|---:|---:|")
    base = "preferred defaults (untuned now)"
    w = {k: statistics.median(v) for k, v in wall.items()}
    c = {k: statistics.median(v) for k, v in cpu.items()}
    for label in labels:
        print(f"| {label} | {w[label] * 1e3:.1f} | {w[base] / w[label]:.2f}x "
              f"| {c[label] * 1e3:.1f} | {c[base] / c[label]:.2f}x "
              f"| {w[label] / w['onnxruntime']:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip-layers", action="store_true", help="only the whole model")
    p.add_argument("--skip-model", action="store_true", help="only the per-layer table")
    args = p.parse_args(argv)
    device = open_device()
    print_header("bench/default_choice.py", device.info.name)
    import onnx

    source = tophub_source()
    if not args.skip_layers:
        per_layer(device, optimize(load_graph(onnx.load(light_path(args.model)))), source,
                  args.rounds)
    if not args.skip_model:
        whole_model(device, args.model, source, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

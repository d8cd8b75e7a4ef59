"""ResNet-50's 3x3 convolutions: our conv2d template on OpenCL vs onnxruntime's Conv.

(``bench/templates.py cpu-layers [options]`` runs ``bench/layers.py``: every ResNet-50
conv layer with the CPU template ``conv2d_NCHWc.x86``, tuned, against onnxruntime.)

For each layer, in one run: GFLOP/s of ``conv2d_nchw.cuda``'s default (fallback) config,
of the best of N random configs (drawn as the tuner draws them, fitted to the device's
limits), and of onnxruntime's Conv (CPUExecutionProvider) on the same shape and the
same input arrays. Every kernel time counts only after its output matched numpy (the
measurer checks it); onnxruntime's output is checked against the same numpy reference.

    .venv/bin/python bench/templates.py                 # 50 random configs, 4 layers
    .venv/bin/python bench/templates.py --trials 3 --layers s2_64x56

Kernel times are device-event times per launch (mean of the middle repeats, AutoTVM's
method); onnxruntime's are ``time.perf_counter`` around ``session.run`` with the same
number / repeat / min_repeat_ms rule, so they include onnxruntime's small per-call
overhead (a few microseconds).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from common import cpu_model, git_revision, host_seconds, onnxruntime_conv

from compiler.runtime import open_device
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest, max_abs_error_ok
from compiler.templates import ConfigError, Epilogue, get_template
from schemas import MeasureOptions, Workload

TEMPLATE = "conv2d_nchw.cuda"

# name -> (in channels, height = width, out channels, stride); 3x3 kernel, pad 1.
LAYERS: dict[str, tuple[int, int, int, int]] = {
    # ResNet-50 v1: the 3x3 conv of each stage's bottleneck blocks (stride 1).
    "s2_64x56": (64, 56, 64, 1),
    "s3_128x28": (128, 28, 128, 1),
    "s4_256x14": (256, 14, 256, 1),
    "s5_512x7": (512, 7, 512, 1),
    # ResNet-50 v1.5: the stride-2 3x3 conv of the first block of stages 3-5.
    "s3_128x56_s2": (128, 56, 128, 2),
    "s4_256x28_s2": (256, 28, 256, 2),
    "s5_512x14_s2": (512, 14, 512, 2),
}
DEFAULT_LAYERS = ["s2_64x56", "s3_128x28", "s4_256x14", "s5_512x7"]


def workload_for(layer: str) -> Workload:
    c, hw, co, s = LAYERS[layer]
    return Workload(template=TEMPLATE, args=[
        ["TENSOR", [1, c, hw, hw], "float32"], ["TENSOR", [co, c, 3, 3], "float32"],
        [s, s], [1, 1, 1, 1], [1, 1], "float32"])


@dataclass
class LayerResult:
    layer: str
    gflop: float
    default_s: float | None = None
    default_error: str = ""
    best_s: float | None = None
    best_trial: int | None = None  # 1-based among the random configs
    best_index: int | None = None  # the config's index in the space
    best_knobs: dict = field(default_factory=dict)
    ort_s: float | None = None
    ort_max_err: float = 0.0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def time_onnxruntime(workload: Workload, inputs: list[np.ndarray], reference: np.ndarray,
                     args: argparse.Namespace) -> tuple[float, float]:
    """Seconds per Conv run and the worst |ort - numpy| (checked loosely first)."""
    data, weight = inputs
    op = get_template(TEMPLATE).parse(workload)
    conv = onnxruntime_conv(op, weight, args.ort_threads)
    got = conv(data)
    ok, why = max_abs_error_ok(got, reference, MeasureOptions(rtol=1e-3, atol=1e-3))
    if not ok:
        raise RuntimeError(f"onnxruntime's Conv does not match numpy: {why}")
    max_err = float(np.max(np.abs(got.astype(np.float64) - reference.astype(np.float64))))
    seconds = host_seconds(lambda: conv(data), args.number, args.repeat, args.min_repeat_ms)
    return seconds, max_err


def run_layer(layer: str, measurer: IsolatedMeasurer, limits, args: argparse.Namespace,
              options: MeasureOptions) -> LayerResult:
    template = get_template(TEMPLATE)
    workload = workload_for(layer)
    flops = template.flops(workload)
    res = LayerResult(layer, flops / 1e9)
    log = (lambda msg: print(f"  [{layer}] {msg}", file=sys.stderr, flush=True))

    def measure(config):
        t0 = time.time()
        r = measurer.measure(MeasureRequest(template.name, workload, config, options,
                                            seed=args.seed))
        return r, time.time() - t0

    r, wall = measure(template.default_config(workload))
    if r.ok:
        res.default_s = r.mean_cost
        log(f"default: {flops / r.mean_cost / 1e9:.2f} GFLOP/s ({wall:.1f} s)")
    else:
        res.default_error = f"{int(r.error_no)} {r.error_no.name}"
        log(f"default: error {res.default_error}: {(r.error_msg or '')[:200]}")

    rng = random.Random(f"{args.seed}:{layer}")
    for i in range(1, args.trials + 1):
        try:
            config = template.random_config(workload, rng, limits)
        except ConfigError as err:
            res.errors["NO_CONFIG"] = res.errors.get("NO_CONFIG", 0) + 1
            log(f"random {i}: {err}")
            continue
        r, wall = measure(config)
        if r.ok:
            res.ok += 1
            gf = flops / r.mean_cost / 1e9
            log(f"random {i} (index {config.index}): {gf:.2f} GFLOP/s ({wall:.1f} s)")
            if res.best_s is None or r.mean_cost < res.best_s:
                res.best_s, res.best_trial, res.best_index = r.mean_cost, i, config.index
                res.best_knobs = template.decode(workload, config)
        else:
            name = r.error_no.name
            res.errors[name] = res.errors.get(name, 0) + 1
            log(f"random {i} (index {config.index}): error {int(r.error_no)} {name} "
                f"({wall:.1f} s): {(r.error_msg or '')[:200]}")

    inputs = template.make_inputs(workload, Epilogue(), np.random.default_rng(args.seed))
    reference = template.reference(workload, inputs)
    res.ort_s, res.ort_max_err = time_onnxruntime(workload, inputs, reference, args)
    log(f"onnxruntime: {flops / res.ort_s / 1e9:.2f} GFLOP/s "
        f"(max |ort - numpy| {res.ort_max_err:.2e})")
    return res


def gflops(res: LayerResult, seconds: float | None) -> str:
    return "-" if seconds is None else f"{res.gflop / seconds:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    # a, b are seconds; the speed ratio of a over b is b / a
    return "-" if a is None or b is None else f"{b / a:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=50, help="random configs per layer (50)")
    p.add_argument("--seed", type=int, default=0, help="config draws and input arrays (0)")
    p.add_argument("--layers", default=",".join(DEFAULT_LAYERS),
                   help=f"comma-separated subset of: {', '.join(LAYERS)}; or 'all'")
    p.add_argument("--device", default=None, help="device spec, e.g. opencl:0 (first OpenCL)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds per trial: build + check + timing (60)")
    p.add_argument("--number", type=int, default=1, help="runs per repeat, at least (1)")
    p.add_argument("--repeat", type=int, default=3, help="repeats; middle ones averaged (3)")
    p.add_argument("--min-repeat-ms", type=float, default=100.0,
                   help="raise number until a repeat lasts this long (100)")
    p.add_argument("--ort-threads", type=int, default=os.cpu_count() or 1,
                   help="onnxruntime intra-op threads (default: CPU count)")
    args = p.parse_args(argv)
    layers = list(LAYERS) if args.layers == "all" else [s.strip() for s in args.layers.split(",")]
    unknown = [name for name in layers if name not in LAYERS]
    if unknown:
        p.error(f"unknown layer(s) {', '.join(unknown)}; known: {', '.join(LAYERS)}")

    import onnxruntime as ort

    dev = open_device(args.device)
    info, limits = dev.info, dev.limits
    del dev  # the measuring child opens its own
    options = MeasureOptions(number=args.number, repeat=args.repeat,
                             min_repeat_ms=args.min_repeat_ms, timeout_s=args.timeout)
    print(f"# bench/templates.py  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"# command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device: {info.spec} {info.name} | platform: {info.platform} | target: {info.target}")
    print(f"# host: {platform.processor() or platform.machine()} {cpu_model()}, "
          f"{os.cpu_count()} CPUs | python {platform.python_version()} | numpy {np.__version__}")
    print(f"# code: {git_revision()}")
    print(f"# onnxruntime {ort.__version__} CPUExecutionProvider, "
          f"intra_op_num_threads={args.ort_threads}")
    print(f"# template {TEMPLATE}: default config + {args.trials} random configs per layer "
          f"(seed {args.seed}); number>={args.number}, repeat={args.repeat}, "
          f"min_repeat_ms={args.min_repeat_ms:g}, timeout={args.timeout:g} s per trial")
    sys.stdout.flush()

    started = time.time()
    results = []
    with IsolatedMeasurer(args.device) as measurer:
        for layer in layers:
            results.append(run_layer(layer, measurer, limits, args, options))

    n = args.trials
    print()
    print(f"| layer | GFLOP | default GFLOP/s | best-of-{n} GFLOP/s (trial, index) "
          f"| onnxruntime GFLOP/s | best/default | best/ort | random ok / failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        default = gflops(r, r.default_s) if r.default_s else f"error {r.default_error}"
        best = ("-" if r.best_s is None else
                f"{gflops(r, r.best_s)} (#{r.best_trial}, {r.best_index})")
        failed = sum(r.errors.values())
        detail = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items()))
        print(f"| {r.layer} | {r.gflop:.3f} | {default} | {best} | {gflops(r, r.ort_s)} "
              f"| {ratio(r.best_s, r.default_s)} | {ratio(r.best_s, r.ort_s)} "
              f"| {r.ok} / {failed}{f' ({detail})' if detail else ''} |")
    print()
    for r in results:
        if r.best_knobs:
            knobs = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}"
                              for k, v in r.best_knobs.items())
            print(f"# best {r.layer}: {knobs}")
    for r in results:
        print(f"# onnxruntime {r.layer}: {r.ort_s * 1e3:.3f} ms/run, "
              f"max |ort - numpy| = {r.ort_max_err:.2e}")
    print(f"# total {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["cpu-layers"]:
        # every ResNet-50 conv layer with the CPU template, tuned records from the bench
        # database, against onnxruntime: bench/layers.py, reached from here as well
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from layers import main as layers_main

        sys.exit(layers_main(sys.argv[2:]))
    sys.exit(main())

"""Every conv2d layer of ResNet-50: tuned CPU template vs its default vs the GPU template
vs onnxruntime's Conv, on the local OpenCL device, in one run.

The layers are those the compiler sees: the onnx package's light ResNet-50, imported and
optimized (batch-norm folded, epilogues fused), one row per distinct conv workload (with
how many layers run it). Per row, in one run on the same device:

- ``conv2d_NCHWc.x86`` tuned: the best record of the workload measured on this device,
  read from a tuning database (the one ``bench/models.py`` tunes into), re-measured now.
  Without such a record the row says "untuned" and the default config is measured;
- ``conv2d_NCHWc.x86`` default config;
- ``conv2d_nchw.cuda``: its best record of this device in the same database, else its
  default config;
- ``conv2d_NCHWc_1x1.x86`` (the packed-GEMM template of 1x1 layers without padding):
  its best record of this device in the same database, else its default config;
- onnxruntime's Conv (a one-node ONNX model, CPUExecutionProvider) on the same shape and
  the same input arrays;
- the speed ratio CPU-tuned / onnxruntime (``✗`` marks 3x3 layers below 0.5x), and the
  best CPU template's of the two timed here (direct or 1x1; a build may also take
  Winograd or the implicit GEMM: bench/winograd.py, bench/conv_gemm.py) / onnxruntime.

Every kernel time counts only after its output matched numpy (the measurer checks it:
error_no 0); onnxruntime's output is checked against the same numpy reference. Kernel
times are device-event times per launch (number x repeat, raised until a repeat lasts
min_repeat_ms; the fastest and slowest repeat dropped, as AutoTVM); onnxruntime's are
``time.perf_counter`` around ``session.run`` under the same rule (so they include its
few microseconds of per-call overhead).

Tune first (this script only reads the database), e.g. ``bench/models.py --models
resnet50`` or ``tuner tune MODEL --target 'opencl -model=pocl-cpu' --database-url ...``.

    .venv/bin/python bench/layers.py                        # all 23 conv workloads (53 layers)
    .venv/bin/python bench/layers.py --list                 # the rows and their indices
    .venv/bin/python bench/layers.py --layers 3x3,0 --min-repeat-ms 20
    .venv/bin/python bench/layers.py --database-url sqlite:////tmp/other.db
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from common import cpu_model, git_revision, host_seconds, onnxruntime_conv

import tuner
from compiler.build_module import load_graph
from compiler.frontend.samples import light_path
from compiler.passes import optimize
from compiler.records import RecordSource, choose_configs
from compiler.records.choose import THIS_DEVICE
from compiler.runtime import Device, open_device
from compiler.runtime.measure import (
    MeasureRequest,
    max_abs_error_ok,
    measure,
    task_operands,
)
from compiler.tasks import CONV1X1_CPU, CONV_CPU, CONV_GPU, extract_tasks
from compiler.templates import Epilogue, get_template
from compiler.templates.ops import Conv2dOp
from schemas import Config, MeasureOptions, Record, Target, Workload

MODEL = "resnet50"
ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = ROOT / "bench" / "data" / "models.db"
RATIO_3X3, RATIO_ANY = 0.5, 1.0  # the targets: every 3x3 >= 0.5x, one >= 1.0x
MARK = "✗"


@dataclass
class Layer:
    """One distinct conv workload: the templates' workloads and the layers running it
    (``gemm``: the 1x1 template's, for 1x1 layers without padding)."""

    index: int
    cpu: Workload
    gpu: Workload
    nodes: list[str]
    gemm: Workload | None = None

    @property
    def op(self) -> Conv2dOp:
        return get_template(CONV_CPU).parse(self.cpu)

    @property
    def label(self) -> str:
        """``3x3s1_64x56x56_64``: kernel, stride, input C x H x W, output channels (and
        the padding when it is not the kernel's "same" padding)."""
        op = self.op
        text = f"{op.kh}x{op.kw}s{op.stride[0]}_{op.c}x{op.h}x{op.w}_{op.co}"
        if op.stride[0] != op.stride[1]:
            text = text.replace(f"s{op.stride[0]}", f"s{op.stride[0]}x{op.stride[1]}", 1)
        if op.pad != (op.kh // 2, op.kw // 2, op.kh // 2, op.kw // 2):
            text += "_p" + "-".join(map(str, op.pad))
        if op.dilation != (1, 1):
            text += f"_d{op.dilation[0]}x{op.dilation[1]}"
        return text

    @property
    def is_3x3(self) -> bool:
        op = self.op
        return (op.kh, op.kw) == (3, 3)

    @property
    def gflop(self) -> float:
        return self.op.flops / 1e9


@dataclass
class Timing:
    """One kernel (or onnxruntime) measured now: seconds, or why it has none."""

    seconds: float | None = None
    error: str = ""
    note: str = ""  # "default", "tuned, 32 trials", ...


@dataclass
class Row:
    layer: Layer
    tuned: bool = False
    cpu_trials: int = 0  # records of the CPU workload measured on this device
    cpu_record_s: float | None = None  # the tuned record's cost when it was tuned
    cpu_knobs: dict = field(default_factory=dict)
    cpu_tuned: Timing = field(default_factory=Timing)
    cpu_default: Timing = field(default_factory=Timing)
    gpu: Timing = field(default_factory=Timing)
    gemm: Timing = field(default_factory=Timing)
    ort: Timing = field(default_factory=Timing)
    ort_max_err: float = 0.0

    @property
    def ratio(self) -> float | None:
        """Speed of the CPU template's tuned (or, untuned, default) config over ort's."""
        if self.cpu_tuned.seconds is None or self.ort.seconds is None:
            return None
        return self.ort.seconds / self.cpu_tuned.seconds

    @property
    def best_ratio(self) -> float | None:
        """Speed of the faster of the direct (as in ``ratio``) and 1x1 templates over
        onnxruntime's."""
        times = [t.seconds for t in (self.cpu_tuned, self.gemm) if t.seconds is not None]
        if not times or self.ort.seconds is None:
            return None
        return self.ort.seconds / min(times)


def conv_layers(target: Target, model: str = MODEL) -> list[Layer]:
    """A light model's (ResNet-50's) conv2d layers as the compiler sees them, one per
    distinct workload in first-use order, each with its CPU- and GPU-template workload."""
    graph = optimize(load_graph(light_path(model)))
    tasks = extract_tasks(graph, target, every_candidate=True)
    # both templates' workloads share the conv arguments: data, weight, strides, pads,
    # dilation
    gpu_by_conv = {repr(t.workload.args[:5]): t.workload for t in tasks
                   if t.template == CONV_GPU}
    gemm_by_conv = {repr(t.workload.args[:5]): t.workload for t in tasks
                    if t.template == CONV1X1_CPU}
    layers: list[Layer] = []
    for task in tasks:
        if task.template != CONV_CPU:
            continue
        gpu = gpu_by_conv.get(repr(task.workload.args[:5]))
        if gpu is None:  # every conv the CPU template takes, the GPU template takes too
            raise RuntimeError(f"{task.workload.key}: no {CONV_GPU} candidate")
        layers.append(Layer(len(layers), task.workload, gpu, list(task.layers),
                            gemm_by_conv.get(repr(task.workload.args[:5]))))
    return layers


def select(layers: list[Layer], spec: str | None) -> list[Layer]:
    """``--layers``: comma-separated row indices or substrings of a row's label or of its
    layers' node names; None: every row."""
    if not spec:
        return layers
    chosen: dict[int, Layer] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.isdigit():
            found = [la for la in layers if la.index == int(item)]
        else:
            found = [la for la in layers
                     if item in la.label or any(item == n for n in la.nodes)]
        if not found:
            raise ValueError(f"--layers {item!r} matches no conv layer; --list shows them")
        chosen.update((la.index, la) for la in found)
    return [chosen[i] for i in sorted(chosen)]


def _this_device(record: Record, target: Target) -> bool:
    return record.target.kind == target.kind and record.target.model == target.model


def time_kernel(device: Device, template: str, workload: Workload, config: Config,
                options: MeasureOptions, seed: int) -> Timing:
    result = measure(device, MeasureRequest(template, workload, config, options, seed=seed))
    if result.error_no != 0:
        return Timing(error=f"error {int(result.error_no)} {result.error_no.name}: "
                            f"{(result.error_msg or '')[:300]}")
    return Timing(seconds=result.mean_cost)


def time_onnxruntime(op: Conv2dOp, inputs: list[np.ndarray], reference: np.ndarray,
                     options: MeasureOptions, threads: int) -> tuple[Timing, float]:
    """onnxruntime's Conv on ``inputs`` (data, OIHW weight), checked against ``reference``
    as the measurer checks kernels, and timed under the measurer's rule; the second value
    is the worst |ort - numpy|."""
    data, weight = inputs[:2]
    conv = onnxruntime_conv(op, weight, threads)
    got = conv(data)
    max_err = float(np.max(np.abs(got.astype(np.float64) - reference.astype(np.float64))))
    ok, why = max_abs_error_ok(got, reference, options)
    if not ok:
        return Timing(error=f"onnxruntime differs from numpy: {why}"), max_err
    seconds = host_seconds(lambda: conv(data), options.number, options.repeat,
                           options.min_repeat_ms)
    return Timing(seconds=seconds), max_err


def run_layer(layer: Layer, device: Device, source: RecordSource | None, options: MeasureOptions,
              args: argparse.Namespace) -> Row:
    target, limits = device.target, device.limits
    row = Row(layer)
    log = (lambda msg: print(f"  [{layer.index} {layer.label}] {msg}", file=sys.stderr,
                             flush=True))

    def gf(t: Timing) -> str:
        return f"{layer.gflop / t.seconds:.2f} GFLOP/s" if t.seconds else t.error

    cpu_t, gpu_t = get_template(CONV_CPU), get_template(CONV_GPU)
    cpu_choice, gpu_choice = choose_configs([layer.cpu, layer.gpu], source, target, limits)
    if source is not None:
        row.cpu_trials = sum(1 for c in source.candidates([layer.cpu], target)
                             if _this_device(c.record, target))
    default = cpu_t.default_config(layer.cpu, limits)

    row.cpu_default = time_kernel(device, CONV_CPU, layer.cpu, default, options, args.seed)
    row.cpu_default.note = "default"
    log(f"{CONV_CPU} default: {gf(row.cpu_default)}")
    if cpu_choice.source == THIS_DEVICE and cpu_choice.record is not None:
        row.tuned = True
        row.cpu_record_s = cpu_choice.record.result.mean_cost
        row.cpu_knobs = cpu_t.decode(layer.cpu, cpu_choice.config)
        row.cpu_tuned = time_kernel(device, CONV_CPU, layer.cpu, cpu_choice.config, options,
                                    args.seed)
        row.cpu_tuned.note = f"tuned, {row.cpu_trials} trials"
        log(f"{CONV_CPU} tuned (index {cpu_choice.config.index}, best of {row.cpu_trials} "
            f"trials): {gf(row.cpu_tuned)}")
    else:
        row.cpu_tuned = Timing(row.cpu_default.seconds, row.cpu_default.error, "untuned")

    if gpu_choice.source == THIS_DEVICE and gpu_choice.record is not None:
        assert source is not None
        gpu_trials = sum(1 for c in source.candidates([layer.gpu], target)
                         if _this_device(c.record, target))
        gpu_config, note = gpu_choice.config, f"tuned, {gpu_trials} trials"
    else:
        gpu_config, note = gpu_t.default_config(layer.gpu), "default"
    row.gpu = time_kernel(device, CONV_GPU, layer.gpu, gpu_config, options, args.seed)
    row.gpu.note = note
    log(f"{CONV_GPU} {note}: {gf(row.gpu)}")

    if layer.gemm is not None:
        gemm_t = get_template(CONV1X1_CPU)
        (gemm_choice,) = choose_configs([layer.gemm], source, target, limits)
        if gemm_choice.source == THIS_DEVICE and gemm_choice.record is not None:
            assert source is not None
            gemm_trials = sum(1 for c in source.candidates([layer.gemm], target)
                              if _this_device(c.record, target))
            gemm_config, note = gemm_choice.config, f"tuned, {gemm_trials} trials"
        else:
            gemm_config, note = gemm_t.default_config(layer.gemm, limits), "default"
        row.gemm = time_kernel(device, CONV1X1_CPU, layer.gemm, gemm_config, options,
                               args.seed)
        row.gemm.note = note
        log(f"{CONV1X1_CPU} {note}: {gf(row.gemm)}")

    # the very arrays (and numpy reference) the measurer gave the CPU template's kernels
    inputs, reference = task_operands(CONV_CPU, layer.cpu, Epilogue(), args.seed)
    row.ort, row.ort_max_err = time_onnxruntime(layer.op, inputs, reference(), options,
                                                args.ort_threads)
    log(f"onnxruntime: {gf(row.ort)} (max |ort - numpy| {row.ort_max_err:.2e})")
    return row


def fmt_gflops(row: Row, t: Timing, note: bool = False) -> str:
    if t.seconds is None:
        return t.error.split(":", 1)[0] or "-"
    text = f"{row.layer.gflop / t.seconds:.2f}"
    return f"{text} ({t.note})" if note and t.note else text


def fmt_ratio(row: Row) -> str:
    r = row.ratio
    if r is None:
        return "-"
    text = f"{r:.2f}x"
    if row.layer.is_3x3 and r < RATIO_3X3:
        text += f" {MARK}"
    if not row.tuned:
        text += " (untuned)"
    return text


def print_table(rows: list[Row]) -> None:
    print("| # | layer (k s C x H x W K) | layers | GFLOP | NCHWc tuned GFLOP/s | trials "
          "| NCHWc default GFLOP/s | nchw.cuda GFLOP/s | NCHWc_1x1 GFLOP/s "
          "| onnxruntime GFLOP/s | tuned / onnxruntime | best CPU / onnxruntime |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for r in rows:
        la = r.layer
        tuned = fmt_gflops(r, r.cpu_tuned) if r.tuned else (
            f"untuned ({fmt_gflops(r, r.cpu_tuned)})")
        print(f"| {la.index} | {la.label} | {len(la.nodes)} | {la.gflop:.3f} | {tuned} "
              f"| {r.cpu_trials if r.tuned else '-'} | {fmt_gflops(r, r.cpu_default)} "
              f"| {fmt_gflops(r, r.gpu, note=True)} "
              f"| {fmt_gflops(r, r.gemm, note=True) if la.gemm else '-'} "
              f"| {fmt_gflops(r, r.ort)} | {fmt_ratio(r)} "
              f"| {'-' if r.best_ratio is None else f'{r.best_ratio:.2f}x'} |")


def print_summary(rows: list[Row]) -> None:
    def count(pred: Callable[[Row], bool], among: list[Row]) -> str:
        hit = [r for r in among if pred(r)]
        return (f"{len(hit)} of {len(among)} workloads ({sum(len(r.layer.nodes) for r in hit)} "
                f"of {sum(len(r.layer.nodes) for r in among)} layers)")

    threes = [r for r in rows if r.layer.is_3x3]
    tuned = [r for r in rows if r.tuned]
    trials = sorted(r.cpu_trials for r in tuned)
    print()
    print(f"# 3x3 at >= {RATIO_3X3}x onnxruntime: "
          f"{count(lambda r: (r.ratio or 0) >= RATIO_3X3, threes)}; "
          f"at >= {RATIO_ANY}x: {count(lambda r: (r.ratio or 0) >= RATIO_ANY, rows)}; "
          f"{MARK}: 3x3 below {RATIO_3X3}x")
    if tuned:
        print(f"# tuned records: {len(tuned)} of {len(rows)} workloads; trials per tuned "
              f"workload (records of {CONV_CPU} measured on this device): min {trials[0]}, "
              f"median {statistics.median(trials):g}, max {trials[-1]}, total {sum(trials)}")
    else:
        print(f"# tuned records: none of {len(rows)} workloads has a {CONV_CPU} record "
              "measured on this device: every ratio is the default config's")
    untuned = [r.layer.index for r in rows if not r.tuned]
    if tuned and untuned:
        print(f"# untuned (default config in the tuned column): rows {untuned}")


def print_details(rows: list[Row]) -> None:
    print()
    for r in rows:
        la = r.layer
        if r.tuned:
            knobs = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}"
                              for k, v in r.cpu_knobs.items())
            then = la.gflop / r.cpu_record_s if r.cpu_record_s else float("nan")
            print(f"# {la.index} {la.label}: tuned {knobs} (recorded {then:.2f} GFLOP/s)")
        for name, t in (("NCHWc tuned", r.cpu_tuned if r.tuned else Timing()),
                        ("NCHWc default", r.cpu_default), ("nchw.cuda", r.gpu),
                        ("NCHWc_1x1", r.gemm), ("onnxruntime", r.ort)):
            if t.error:
                print(f"# {la.index} {la.label}: {name}: {t.error}")
        print(f"# {la.index} {la.label}: layers {', '.join(la.nodes)}; "
              f"max |ort - numpy| {r.ort_max_err:.2e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default=None,
                   help="comma-separated row indices (see --list) or substrings of a row's "
                        "label such as 3x3 or 64x56x56, or node names; default: every row")
    p.add_argument("--list", action="store_true", help="print the rows and exit")
    p.add_argument("--database-url", default=f"sqlite:///{BENCH_DB}",
                   help="tuning database to read records from (default: bench/data/models.db, "
                        "the one bench/models.py tunes into)")
    p.add_argument("--device", default=None, help="device spec, e.g. opencl:0 (first OpenCL)")
    p.add_argument("--number", type=int, default=1, help="runs per repeat, at least (1)")
    p.add_argument("--repeat", type=int, default=3, help="repeats; middle ones averaged (3)")
    p.add_argument("--min-repeat-ms", type=float, default=100.0,
                   help="raise number until a repeat lasts this long (100)")
    p.add_argument("--seed", type=int, default=0, help="input arrays (0)")
    p.add_argument("--ort-threads", type=int, default=os.cpu_count() or 1,
                   help="onnxruntime intra-op threads (default: CPU count)")
    args = p.parse_args(argv)

    device = open_device(args.device)
    info, target = device.info, device.target
    layers = conv_layers(target)
    try:
        chosen = select(layers, args.layers)
    except ValueError as err:
        p.error(str(err))
    if args.list:
        for la in chosen:
            print(f"{la.index:3d}  {la.label:24s} {len(la.nodes):2d} layer(s)  "
                  f"{la.gflop:6.3f} GFLOP  {', '.join(la.nodes)}")
        return 0

    import onnxruntime as ort

    source = tuner.records.database(args.database_url)
    options = MeasureOptions(number=args.number, repeat=args.repeat,
                             min_repeat_ms=args.min_repeat_ms)
    print(f"# bench/layers.py  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"# command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device: {info.spec} {info.name} | platform: {info.platform} | target: {target} "
          f"({target.device_class})")
    print(f"# host: {platform.processor() or platform.machine()} {cpu_model()}, "
          f"{os.cpu_count()} CPUs | python {platform.python_version()} | numpy {np.__version__}")
    print(f"# code: {git_revision()}")
    print(f"# model: {MODEL} (onnx light model), {len(layers)} distinct conv workloads in "
          f"{sum(len(la.nodes) for la in layers)} conv layers; {len(chosen)} rows shown")
    workloads = [w for la in chosen for w in (la.cpu, la.gpu, la.gemm) if w is not None]
    found = (f"{len(source.candidates(workloads, target))} records of these workloads"
             if source is not None else "absent: nothing tuned")
    print(f"# records: {args.database_url} ({found})")
    print(f"# onnxruntime {ort.__version__} CPUExecutionProvider, "
          f"intra_op_num_threads={args.ort_threads}")
    print(f"# timing: number>={args.number}, repeat={args.repeat}, "
          f"min_repeat_ms={args.min_repeat_ms:g}; seed {args.seed}")
    sys.stdout.flush()

    started = time.time()
    rows = [run_layer(la, device, source, options, args) for la in chosen]
    print()
    print_table(rows)
    print_summary(rows)
    print_details(rows)
    print(f"# total {time.time() - started:.0f} s")
    failed = [r for r in rows
              if any(t.error for t in (r.cpu_tuned, r.cpu_default, r.gpu, r.gemm, r.ort))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

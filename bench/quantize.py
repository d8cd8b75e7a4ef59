"""Quantized (int8) vs float32 ResNet-50 on the local OpenCL device, one run.

The onnx package's light ResNet-50 with random weights (``with_random_weights``, seed 0)
is built twice by ``compiler.build``: as is (float32; per layer the fastest template
measured here, CPU templates' defaults otherwise) and after ``compiler.quantize`` with
a qconfig (default: TVM v0.5's). On ``--inputs`` random inputs (standard normal, like
normalised images) both run on the device; we report top-1 agreement (same argmax)
and the relative output error ||q - f|| / ||f|| (mean and max over inputs), then the
latency of both in alternating rounds (device events, medians) and their ratio.

The int8 layers need configs: ``--trials N`` first runs ``tuner tune MODEL --quantize``
into the benchmark database (tasks that already have N records are skipped by rerunning
on the same database: the tuner starts from what it holds).

    .venv/bin/python bench/quantize.py --trials 8               # tune int8 tasks, then measure
    .venv/bin/python bench/quantize.py --no-tune --global-scales 8,4,2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

import tuner
from compiler.build_module import Module, build
from compiler.frontend import import_onnx
from compiler.frontend.samples import light_path, with_random_weights
from compiler.passes import optimize
from compiler.passes.quantize import QConfig, quantize
from compiler.runtime import open_device

BENCH_DB = Path(__file__).resolve().parent / "data" / "models.db"
TUNER = Path(sys.executable).with_name("tuner")


def tune_int8(model_path: str, target: str, device: str, trials: int, database_url: str,
              qconfig: list[str]) -> None:
    cmd = [str(TUNER), "tune", model_path, "--target", target, "--device", device,
           "--trials", str(trials), "--database-url", database_url, "--quantize",
           *[a for kv in qconfig for a in ("--qconfig", kv)],
           "--number", "1", "--repeat", "3", "--min-repeat-ms", "20", "--timeout", "60"]
    print("$", " ".join(f"'{c}'" if " " in c else c for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def accuracy(reference: Module, quantized: Module, inputs: list[np.ndarray]
             ) -> tuple[float, float, float]:
    """Top-1 agreement, mean and max relative output error over ``inputs``."""
    agree, errors = 0, []
    for x in inputs:
        (f,) = reference.run([x])
        (q,) = quantized.run([x])
        agree += int(np.argmax(f) == np.argmax(q))
        errors.append(float(np.linalg.norm(q - f) / max(np.linalg.norm(f), 1e-30)))
    return agree / len(inputs), statistics.fmean(errors), max(errors)


def latency(modules: dict[str, Module], rounds: int, number: int) -> dict[str, float]:
    """Median seconds per run of each module, timed in alternating rounds."""
    costs: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(rounds):
        for name, module in modules.items():
            costs[name].append(module.benchmark(number=number, repeat=1).mean)
    return {name: statistics.median(c) for name, c in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--inputs", type=int, default=100)
    parser.add_argument("--trials", type=int, default=8, help="per int8 task")
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--global-scales", default="8",
                        help="comma-separated global_scale values for the accuracy table")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=2)
    parser.add_argument("--database-url", default=f"sqlite:///{BENCH_DB}")
    args = parser.parse_args()

    dev = open_device(args.device)
    target = str(dev.target)
    model = with_random_weights(onnx.load(light_path("resnet50")), seed=0)
    graph = import_onnx(model)
    scales = [float(s) for s in args.global_scales.split(",")]
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        f.write(model.SerializeToString())
        f.flush()
        if not args.no_tune:  # the int8 workloads do not depend on global_scale
            tune_int8(f.name, target, args.device, args.trials, args.database_url, [])

    configs = {scale: QConfig(global_scale=scale) for scale in scales}
    float_graph = optimize(graph)
    source = tuner.records.database(args.database_url)
    reference = build(float_graph, records=source,
                      device=dev, optimized=True)
    rng = np.random.default_rng(0)
    shape = graph.inputs[0].ty.shape
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.inputs)]

    print(f"\nResNet-50 (light, random weights seed 0), {args.inputs} inputs N(0, 1), {target}")
    print("| qconfig | int8 convs | top-1 agreement | rel. error mean | rel. error max |")
    print("|---|---|---|---|---|")
    default_module = None
    for scale, cfg in configs.items():
        q_graph = optimize(quantize(graph, cfg))
        module = build(q_graph, records=source,
                       device=dev, optimized=True)
        int8 = sum(1 for n in q_graph.nodes if n.op == "fused.conv2d"
                   and n.attr("out_dtype") == "int32" and id(n) in q_graph.live())
        top1, mean_err, max_err = accuracy(reference, module, inputs)
        print(f"| global_scale={scale:g} | {int8} | {top1 * 100:.0f}% | {mean_err:.4f} | "
              f"{max_err:.4f} |", flush=True)
        if default_module is None:
            default_module = module
    assert default_module is not None
    times = latency({"float32": reference, "int8": default_module}, args.rounds, args.number)
    print(f"\nlatency (median of {args.rounds} alternating rounds x {args.number} runs): "
          f"float32 {times['float32'] * 1e3:.1f} ms, int8 (global_scale={scales[0]:g}) "
          f"{times['int8'] * 1e3:.1f} ms, int8 / float32 = {times['int8'] / times['float32']:.2f}x")
    for name, module in (("float32", reference), ("int8", default_module)):
        slowest = sorted(module.profile(), key=lambda s: -s.seconds)[:3]
        print(f"{name} slowest steps: " + "; ".join(
            f"{s.name} {s.seconds * 1e3:.1f} ms ({s.share * 100:.0f}%)" for s in slowest))


if __name__ == "__main__":
    main()

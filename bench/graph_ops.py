"""The ops no one tunes, on whole models (issue 17, point 4): default builds (template
defaults, no records) with concatenations as kernels ("concat kernel") and written in
place ("slices"), against onnxruntime, side by side in one run.

Both builds' outputs are checked against onnxruntime's before anything is timed; then
onnxruntime and the builds are timed in alternating rounds (device events for ours,
``perf_counter`` around ``session.run`` for onnxruntime; median and minimum of the
rounds: on a loaded machine the minimum is the steadier figure), and each build's
device time is broken down by op (each step's minimum over interleaved
``GraphExecutor.profile`` rounds): conv/dense against the rest (concatenations,
element-wise chains, copies, pools).

    .venv/bin/python bench/graph_ops.py --models densenet121,resnet50 --rounds 5

The vectorised and blocked element-wise kernels are not switchable: compare them with
an earlier tree by running this there (``PYTHONPATH`` set to it) with
``--variants '{"default": {}}'``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from typing import Any

import numpy as np
import onnx
from common import step_minima
from models import onnxruntime_timer

from compiler.build_module import Module, build
from compiler.frontend.samples import LIGHT_MODELS, light_path, with_random_weights
from compiler.runtime import open_device

# build options of each variant
VARIANTS: dict[str, dict[str, Any]] = {
    "concat kernel": {"slice_concat": False},
    "slices": {},
}
TEMPLATE_OPS = ("nn.conv2d", "fused.conv2d", "nn.dense", "fused.dense")


def breakdown(modules: dict[str, Module], rounds: int) -> dict[str, dict[str, tuple[int, float]]]:
    """Per build, the steps and device seconds of each op: each step's minimum over
    ``rounds`` profiles, the builds profiled in turn."""
    best = step_minima(modules, rounds)
    out: dict[str, dict[str, tuple[int, float]]] = {}
    for label, module in modules.items():
        kinds: dict[str, list[float]] = defaultdict(list)
        for step, seconds in zip(module.program.steps, best[label]):
            kinds[step.name.split()[0]].append(seconds)
        out[label] = {k: (len(v), sum(v)) for k, v in kinds.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="densenet121")
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    parser.add_argument("--number", type=int, default=2, help="runs per timing")
    parser.add_argument("--variants", type=json.loads, default=VARIANTS,
                        help='builds as JSON, label -> build options (default: %(default)s); '
                             '\'{"default": {}}\' times a tree whose build takes no options')
    args = parser.parse_args()
    variants: dict[str, dict[str, Any]] = args.variants

    dev = open_device(args.device)
    print(f"device: {dev.info.name}; variants: {variants}")
    rows = []
    for name in args.models.split(","):
        model = with_random_weights(onnx.load(light_path(name)), seed=LIGHT_MODELS.index(name))
        x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
        ort_run, ort_seconds = onnxruntime_timer(model, x)
        want = ort_run()
        modules = {label: build(model, device=dev, **opts) for label, opts in variants.items()}
        for label, module in modules.items():
            (got,) = module.run([x])
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5,
                                       err_msg=f"{name} {label} differs from onnxruntime")
        times: dict[str, list[float]] = {"onnxruntime": [], **{k: [] for k in modules}}
        for _ in range(args.rounds):
            times["onnxruntime"].append(ort_seconds(args.number))
            for label, module in modules.items():
                times[label].append(module.benchmark(number=args.number, repeat=1).mean)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        print(f"\n{name}: median (min) of {args.rounds} rounds")
        for k in med:
            ratio = "" if k == "onnxruntime" else (
                f"  {med[k] / med['onnxruntime']:.2f}x ({low[k] / low['onnxruntime']:.2f}x)"
                " onnxruntime")
            print(f"  {k:14s} {med[k] * 1e3:9.1f} ({low[k] * 1e3:.1f}) ms{ratio}")
        for label, kinds in breakdown(modules, args.rounds).items():
            module = modules[label]
            total = sum(s for _, s in kinds.values()) or 1.0
            other = {k: v for k, v in kinds.items() if k not in TEMPLATE_OPS}
            rest = sum(s for _, s in other.values())
            print(f"  {label}: {len(module.program.steps)} steps, {total * 1e3:.1f} ms of "
                  f"device time, not conv/dense {rest / total * 100:.1f}%:")
            for k, (n, s) in sorted(other.items(), key=lambda kv: -kv[1][1]):
                print(f"    {k:22s} {n:4d} steps {s * 1e3:8.2f} ms {s / total * 100:5.1f}%")
        rows.append((name, med, low))
        for module in modules.values():
            module.close()
    print("\n| model | onnxruntime ms | " + " | ".join(f"{k} ms" for k in variants)
          + " | " + " | ".join(f"{k} / onnxruntime (min)" for k in variants) + " |")
    print("|---|---|" + "---|" * (2 * len(variants)))
    for name, med, low in rows:
        print(f"| {name} | {med['onnxruntime'] * 1e3:.1f} | "
              + " | ".join(f"{med[k] * 1e3:.1f}" for k in variants) + " | "
              + " | ".join(f"{med[k] / med['onnxruntime']:.2f}x "
                           f"({low[k] / low['onnxruntime']:.2f}x)" for k in variants) + " |")


if __name__ == "__main__":
    main()

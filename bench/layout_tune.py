"""Graph-level layout tuning on ResNet-50 (random weights): greedy vs DP, side by side.

1. records: ``--records FILE`` (a tuned AutoTVM log of this device), else a layout sweep
   measured here once and kept in ``bench/data/layout_records.log``: per
   ``conv2d_NCHWc.x86`` task its default config and the same config with each channel
   block pair (ic_bn, oc_bn) of {8, 16, 32} that fits (equal, and the default ic_bn with
   each oc_bn), each checked against numpy and timed (min_repeat_ms 20, 3 repeats);
2. build twice from the same records: each layer's fastest record ("greedy", today's
   build) and ``build(..., graph_tune=True)`` ("dp"); the read costs the DP needs are
   measured and cached (``TUNER_LAYOUT_CACHE``, default ~/.cache/tuner/layout_costs.json);
3. check both outputs against each other (and onnxruntime's), then time them in
   alternating rounds and print medians, the ratio and the DP's predicted totals.

    .venv/bin/python bench/layout_tune.py
    .venv/bin/python bench/layout_tune.py --records my_tuned.log --top-k 3 --rounds 9
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from models import onnxruntime_timer

from compiler.build_module import build, load_graph
from compiler.frontend.samples import light_path, with_random_weights
from compiler.layout_tune import DEFAULT_TOP_K, default_cache
from compiler.passes import optimize
from compiler.records import LogSource
from compiler.runtime import open_device
from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, measure
from compiler.tasks import CONV_CPU, extract_tasks
from compiler.templates import get_template
from schemas import MeasureInput, MeasureOptions, Record

SWEEP = Path(__file__).resolve().parent / "data" / "layout_records.log"
BLOCKS = (8, 16, 32)
OPTIONS = MeasureOptions(number=1, repeat=3, min_repeat_ms=20, timeout_s=60)


def sweep_configs(workload: Any) -> list[Any]:
    """The default config and its variants with each channel block pair that fits."""
    template = get_template(workload.template)
    op = template.parse(workload)
    base = template.default_config(workload)
    values = template.decode(workload, base)
    default_ic = values["tile_ic"][1]
    configs = {base.index: base}
    for oc_bn in BLOCKS:
        if op.co % oc_bn:
            continue
        for ic_bn in {oc_bn, default_ic}:
            if op.c % ic_bn:
                continue
            v = dict(values)
            v["tile_ic"], v["tile_oc"] = (op.c // ic_bn, ic_bn), (op.co // oc_bn, oc_bn)
            v["vec"] = min(16, oc_bn)
            v["unroll_ci"] = v["unroll_ci"] if ic_bn % v["unroll_ci"] == 0 else 1
            config = template.space(workload).to_config(v)
            configs.setdefault(config.index, config)
    return list(configs.values())


def measure_sweep(graph: Any, device: Device, path: Path) -> None:
    """Measure ``sweep_configs`` of every direct CPU conv task into ``path``."""
    tasks = [t for t in extract_tasks(graph, device.target) if t.template == CONV_CPU]
    start, lines = time.time(), []
    for i, task in enumerate(tasks):
        for config in sweep_configs(task.workload):
            request = MeasureRequest(CONV_CPU, task.workload, config, OPTIONS)
            result = measure(device, request)
            record = Record.from_measure(
                MeasureInput(target=device.target, workload=task.workload, config=config),
                result)
            lines.append(record.to_line())
        print(f"  swept task {i + 1}/{len(tasks)} ({time.time() - start:.0f} s)", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=None)
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K)
    parser.add_argument("--rounds", type=int, default=7, help="alternating timing rounds")
    parser.add_argument("--number", type=int, default=3, help="runs per timing")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import onnx

    dev = open_device(args.device)
    print(f"device: {dev.info.name}, target {dev.target}; load {os.getloadavg()}")
    model = with_random_weights(onnx.load(light_path("resnet50")), seed=0)
    graph = optimize(load_graph(model))
    path = args.records or SWEEP
    if not path.is_file():
        print(f"measuring the layout sweep into {path}")
        measure_sweep(graph, dev, path)
    source = LogSource(path)
    print(f"records: {path} ({len(source)} records)")

    greedy = build(graph, records=source, device=dev, optimized=True)
    start = time.time()
    dp = build(graph, records=source, device=dev, optimized=True, graph_tune=True,
               graph_tune_top_k=args.top_k)
    tuned = dp.layout_tuning
    assert tuned is not None
    print(f"DP build: {time.time() - start:.0f} s, {tuned.measured} read costs measured "
          f"(cache {default_cache()}); {tuned.changed} of {tuned.layers} tuned "
          f"layers changed; predicted {tuned.greedy_total * 1e3:.2f} ms greedy -> "
          f"{tuned.tuned_total * 1e3:.2f} ms")
    modules = {"greedy": greedy, "dp": dp}
    x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
    outs = {k: m.run([x])[0] for k, m in modules.items()}
    np.testing.assert_allclose(outs["dp"], outs["greedy"], rtol=1e-4, atol=1e-6)
    ort_run, _seconds = onnxruntime_timer(model, x)
    np.testing.assert_allclose(outs["dp"], ort_run(), rtol=1e-3, atol=1e-5)
    times: dict[str, list[float]] = {k: [] for k in modules}
    for _ in range(args.rounds):
        for k, m in modules.items():
            times[k].append(m.benchmark(number=args.number, repeat=1).mean)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    for k in modules:
        print(f"  {k:7s} median {med[k] * 1e3:8.2f} ms   best {best[k] * 1e3:8.2f} ms")
    print(f"greedy / dp time: median {med['greedy'] / med['dp']:.3f}x, best "
          f"{best['greedy'] / best['dp']:.3f}x; load {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""Winograd's V streamed (non-temporal stores) against plain stores, side by side.

``conv2d_NCHWc_winograd.x86`` writes V with ``VSTREAM`` where it is
``STREAM_V_BYTES`` or more (``_Source.streams_v``). This builds each kernel both ways in
one process (the threshold set out of reach, then back), checks both against numpy, and
times them in alternating rounds:

1. layers: VGG-19's and ResNet-50's 3x3 shapes at the template's default config for this
   device, median of ``--rounds`` timings of 10 launches each (the streamed column of a
   layer whose V is below the threshold is the same kernel: its ratio is the noise);
2. models (``--models``): the untuned build twice, each step's minimum over
   ``--profiles`` device-event profiles (``step_minima``): the streamed steps and the sum
   of all steps, then whole-model medians of ``--rounds`` alternating runs.

    .venv/bin/python bench/winograd_stream.py --models vgg19
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
from common import settle, step_minima

import compiler.templates.conv2d_nchwc_winograd as winograd
from compiler.build_module import build
from compiler.frontend.samples import LIGHT_MODELS, light_path, with_random_weights
from compiler.runtime import open_device
from compiler.runtime.measure import (
    MeasureRequest,
    build_kernel,
    max_abs_error_ok,
    operand_buffers,
    plain_output,
    request_kernel,
    task_operands,
)
from compiler.templates import get_template
from compiler.templates.base import AVX512_LANES, simd_lanes
from schemas import MeasureOptions, Workload

NAME = "conv2d_NCHWc_winograd.x86"
LAYERS = [(64, 224, 64), (128, 112, 128), (64, 112, 128), (256, 56, 256), (128, 56, 256),
          (512, 28, 512), (256, 14, 256)]  # C, H = W, K
OFF = 1 << 62  # a threshold no V reaches: plain stores
STREAMED = "VSTREAM(16, "


def workload(c: int, hw: int, k: int) -> Workload:
    return Workload(template=NAME, args=[
        ["TENSOR", [1, c, hw, hw], "float32"], ["TENSOR", [k, c, 3, 3], "float32"], [1, 1],
        [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])


def both_ways(make: Any) -> dict[str, Any]:
    """``make()`` with plain stores, then with streaming as the template has it."""
    threshold = winograd.STREAM_V_BYTES
    try:
        winograd.STREAM_V_BYTES = OFF
        plain = make()
    finally:
        winograd.STREAM_V_BYTES = threshold
    return {"plain": plain, "streamed": make()}


def layers(device: Any, rounds: int) -> None:
    template = get_template(NAME)
    print("| layer (C x H -> K) | V MiB | streamed | plain ms | streamed ms | streamed / plain |")
    print("|---|---:|---|---:|---:|---:|")
    for c, hw, k in LAYERS:
        wl = workload(c, hw, k)
        request = MeasureRequest(NAME, wl, template.default_config(wl, device.limits),
                                 MeasureOptions())
        kernels = both_ways(lambda: request_kernel(device, request)[1])  # noqa: B023
        programs = {label: build_kernel(device, kernel) for label, kernel in kernels.items()}
        buffers = operand_buffers(device, template, kernels["plain"], request)
        _arrays, reference = task_operands(NAME, wl, request.epilogue, request.seed)
        out = kernels["plain"].buffers[-1]
        for label, program in programs.items():
            device.run(program, kernels[label], buffers)
            got = plain_output(template, request, device.download(buffers[-1], out.shape,
                                                                  out.dtype))
            ok, why = max_abs_error_ok(got, reference(), request.options)
            assert ok, f"{wl.args[0]} {label}: {why}"
        times: dict[str, list[float]] = {label: [] for label in programs}
        for r in range(rounds):
            for label in (list(programs) if r % 2 == 0 else list(programs)[::-1]):
                times[label].append(device.time(programs[label], kernels[label], buffers, 10))
        ms = {label: statistics.median(t) * 1e3 for label, t in times.items()}
        v_bytes = kernels["plain"].scratch[0].nbytes
        print(f"| {c} x {hw} -> {k} | {v_bytes / 2**20:.1f} | "
              f"{'yes' if STREAMED in kernels['streamed'].source else 'no (same kernel)'} | "
              f"{ms['plain']:.3f} | {ms['streamed']:.3f} | {ms['streamed'] / ms['plain']:.3f} |",
              flush=True)


def models(device: Any, names: list[str], rounds: int, profiles: int) -> None:
    import onnx

    for name in names:
        model = with_random_weights(onnx.load(light_path(name)), seed=LIGHT_MODELS.index(name))
        x = np.random.default_rng(0).uniform(0, 1, size=(1, 3, 224, 224)).astype(np.float32)
        modules = both_ways(lambda: build(model, records=None, device=device))  # noqa: B023
        (a,), (b,) = modules["plain"].run([x]), modules["streamed"].run([x])
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
        minima = step_minima(modules, profiles)
        steps = modules["streamed"].program.steps
        print(f"\n{name}, untuned, step minima over {profiles} profiles:")
        for i, step in enumerate(steps):
            if STREAMED in step.kernel.source:
                plain, streamed = minima["plain"][i], minima["streamed"][i]
                print(f"  {step.name}: {plain * 1e3:.3f} -> {streamed * 1e3:.3f} ms "
                      f"({streamed / plain:.3f})")
        moved = [(step.name, minima["plain"][i], minima["streamed"][i])
                 for i, step in enumerate(steps) if STREAMED not in step.kernel.source
                 and abs(minima["streamed"][i] - minima["plain"][i]) > 0.05e-3]
        for step_name, plain, streamed in moved:  # the same kernel: the noise
            print(f"  ({step_name}, not streamed: {plain * 1e3:.3f} -> {streamed * 1e3:.3f} ms)")
        total = {label: sum(m) for label, m in minima.items()}
        print(f"  all {len(steps)} steps: {total['plain'] * 1e3:.2f} -> "
              f"{total['streamed'] * 1e3:.2f} ms ({total['streamed'] / total['plain']:.3f})")
        times: dict[str, list[float]] = {label: [] for label in modules}
        for r in range(rounds):
            for label in (list(modules) if r % 2 == 0 else list(modules)[::-1]):
                settle()
                times[label].append(modules[label].benchmark(number=2, repeat=1).mean)
        ms = {label: statistics.median(t) * 1e3 for label, t in times.items()}
        print(f"  whole model, median of {rounds}: {ms['plain']:.2f} -> {ms['streamed']:.2f} ms "
              f"({ms['streamed'] / ms['plain']:.3f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vgg19", help="comma-separated; '' for none")
    parser.add_argument("--rounds", type=int, default=11, help="alternating timing rounds")
    parser.add_argument("--profiles", type=int, default=15, help="profiles per model build")
    parser.add_argument("--device", default="opencl:0")
    args = parser.parse_args()
    device = open_device(args.device)
    print(f"device: {device.info.name}; V streamed from "
          f"{winograd.STREAM_V_BYTES / 2**20:g} MiB\n")
    if simd_lanes(device.limits) < AVX512_LANES:
        print(f"note: this device's defaults use fewer than {AVX512_LANES} lanes, so no "
              "default kernel streams: every row compares a kernel with itself (the noise)\n")
    layers(device, args.rounds)
    models(device, [m for m in args.models.split(",") if m], args.rounds, args.profiles)


if __name__ == "__main__":
    main()

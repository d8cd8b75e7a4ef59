"""A fused residual in another block than the kernel's oc_bn: lane by lane against a
vector at a time (``IOLayout.residual_vectors``).

A tuned record's oc_bn need not be the block its residual's producer writes (a ResNet-50
tuning's 1x1 layers: records at oc_bn 32 adding a residual the 1x1 template's default
wrote in NCHW64c). Before, the CPU templates then ran the epilogue lane by lane; now they
read the residual's vectors from its own block. Per ResNet-50 shape and template, the
template's 16-lane default with oc_bn 32, data and residual in NCHW64c (data NCHW32c where
a layer's input has a 32-channel block in such a build), bias + residual + ReLU: both
forms checked against numpy, then timed in ``--rounds`` alternating rounds of
``device.time`` (``--number`` launches); medians.

    .venv/bin/python bench/residual_block.py --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import AbstractContextManager, nullcontext
from typing import Any
from unittest import mock

from common import checked_kernel, print_header

from compiler.runtime import open_device
from compiler.tasks import CONV1X1_CPU, CONV_CPU, WINOGRAD_CPU
from compiler.templates import Epilogue, IOLayout, get_template
from schemas import Workload

FULL = Epilogue(("bias", "add", "relu"))
# (template, C, image side, K, kernel side, data block)
CASES = ((CONV_CPU, 128, 28, 512, 1, 64), (CONV_CPU, 256, 14, 1024, 1, 32),
         (CONV_CPU, 64, 56, 64, 3, 64), (CONV1X1_CPU, 128, 28, 512, 1, 64),
         (CONV1X1_CPU, 256, 14, 1024, 1, 64), (WINOGRAD_CPU, 256, 14, 256, 3, 64))


def lane_wise() -> AbstractContextManager[Any]:
    """Code generation as before: no residual read a vector at a time."""
    return mock.patch.object(IOLayout, "residual_vectors", lambda self, vec: False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=10)
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header("bench/residual_block.py", device.info.name)
    print("| template | layer | layout (data, out, residual) | lane by lane ms | vectors ms "
          "| speed-up |")
    print("|---|---|---|---:|---:|---:|")
    for name, c, side, k, kernel, data_block in CASES:
        template = get_template(name)
        pad = kernel // 2
        workload = Workload(template=name, args=[
            ["TENSOR", [1, c, side, side], "float32"],
            ["TENSOR", [k, c, kernel, kernel], "float32"], [1, 1], [pad] * 4, [1, 1],
            "NCHW", "NCHW", "float32"])
        knobs = template.decode(workload, template.default_config(workload, device.limits))
        knobs["tile_oc"] = (k // 32, 32)
        config = template.space(workload).to_config(knobs)
        io = IOLayout(data_block, 32, 64)
        built = {}
        for form, context in (("lanes", lane_wise()), ("vectors", nullcontext())):
            with context:
                built[form] = checked_kernel(device, workload, config, io, epilogue=FULL)
        if built["lanes"][1].source == built["vectors"][1].source:
            raise SystemExit(f"{name}: both forms are the same kernel")
        runs: dict[str, list[float]] = {form: [] for form in built}
        for r in range(opts.rounds):
            for form in (("lanes", "vectors") if r % 2 == 0 else ("vectors", "lanes")):
                runs[form].append(device.time(*built[form], opts.number))
        lanes, vectors = (statistics.median(runs[f]) * 1e3 for f in ("lanes", "vectors"))
        layout = f"{io.data_block}, {io.out_block}, {io.residual_block}"
        print(f"| {name} | {c}->{k} {kernel}x{kernel} {side}x{side} | {layout} | "
              f"{lanes:.3f} | {vectors:.3f} | {lanes / vectors:.3f}x |", flush=True)


if __name__ == "__main__":
    main()

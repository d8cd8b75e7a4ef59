"""Automatic placement across the OpenCL device and the host (numpy), one run.

A VGG-style small net: two 3x3 conv+relu blocks with max-pooling on a 1x3x64x64 image,
then a classifier of three dense layers (16384 -> 2048 -> 2048 -> 1000) and softmax.
Convolutions favour the OpenCL templates; large dense layers at batch 1 are
memory-bound GEMVs that numpy's BLAS also runs well, so a split can win. ``auto_place``
times every op on each device and the copies, picks the placement with the lowest
estimate, measures it end to end against each single-device placement, interleaved
in this run, and keeps the fastest; the report prints every candidate, then the chosen
module's output is checked against the all-OpenCL build.

    .venv/bin/python bench/hetero.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from common import print_header

from compiler.build_module import build
from compiler.hetero import build_hetero
from compiler.ir import Graph, GraphBuilder
from compiler.passes import optimize
from compiler.runtime import open_device


def vgg_small(seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("image", (1, 3, 64, 64))

    def const(*shape: int) -> object:
        fan_in = int(np.prod(shape[1:]))
        return b.const(rng.normal(0, np.sqrt(2 / fan_in), shape).astype(np.float32))

    for i, (ci, co) in enumerate(((3, 32), (32, 64))):
        x = b.call("nn.conv2d", [x, const(co, ci, 3, 3)], f"conv{i}", padding=(1, 1, 1, 1))
        x = b.call("nn.relu", [b.call("nn.bias_add", [x, b.const(np.zeros(co, np.float32))])])
        x = b.call("nn.max_pool2d", [x], f"pool{i}", pool_size=(2, 2), strides=(2, 2))
    x = b.call("nn.batch_flatten", [x])
    for i, (k, n) in enumerate(((16384, 2048), (2048, 2048), (2048, 1000))):
        x = b.call("nn.dense", [x, const(n, k)], f"fc{i}")
        if i < 2:
            x = b.call("nn.relu", [x])
    return optimize(b.finish([b.call("nn.softmax", [x], "prob")]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="opencl:0")
    p.add_argument("--number", type=int, default=3)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    device = open_device(args.device)
    print_header("bench/hetero.py", device.info.name)
    graph = vgg_small()
    module = build_hetero(graph, "auto", devices={args.device: device}, optimized=True,
                          number=args.number, repeat=args.repeat)
    assert module.auto_report is not None
    print(module.auto_report.format())
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)
    (want,) = build(graph, device=device, optimized=True).run([x])
    (got,) = module.run([x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    measured = module.auto_report.measured
    best_single = min(v for k, v in measured.items() if k.startswith("all:"))
    chosen = measured[module.auto_report.chosen]
    print(f"chosen {module.auto_report.chosen}: {chosen * 1e3:.3f} ms; best single device "
          f"{best_single * 1e3:.3f} ms; chosen / best single = {chosen / best_single:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

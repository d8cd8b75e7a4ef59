"""Grouped (not depthwise) convolutions on PoCL, measured side by side in one run:
the plain grouped kernel, the per-group split that ``fuse_ops`` makes (one template
conv per group over its channel slice, then a concatenation; default configs, no
tuning), and onnxruntime's Conv on the same arrays.

    .venv/bin/python bench/grouped.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from common import print_header
from onnx import TensorProto, helper, numpy_helper

from compiler.build_module import build
from compiler.ir import Graph, GraphBuilder
from compiler.passes import optimize
from compiler.runtime import open_device

# name: (input NCHW, output channels, kernel, padding, groups)
LAYERS = {
    "shufflenet 1x1 g3": ((1, 240, 28, 28), 240, 1, 0, 3),
    "resnext 3x3 g32": ((1, 128, 56, 56), 128, 3, 1, 32),
    "alexnet 5x5 g2": ((1, 96, 27, 27), 256, 5, 2, 2),
}


def layer(shape: tuple[int, ...], co: int, k: int, pad: int, groups: int,
          weight: np.ndarray) -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape)
    y = b.call("nn.conv2d", [x, b.const(weight)], "conv", padding=(pad,) * 4, groups=groups)
    return b.finish([b.call("nn.relu", [y], "relu")])


def onnxruntime_layer(shape: tuple[int, ...], k: int, pad: int, groups: int,
                      weight: np.ndarray) -> ort.InferenceSession:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k, k],
                              pads=[pad] * 4, group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="opencl:0")
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)  # every layer runs default configs: no need to say so
    device = open_device(args.device)
    print_header("bench/grouped.py", device.info.name)
    print("| layer | plain grouped kernel (ms) | per-group split (ms) | onnxruntime (ms) "
          "| split / plain | split / onnxruntime |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name, (shape, co, k, pad, groups) in LAYERS.items():
        weight = rng.normal(0, 0.1, (co, shape[1] // groups, k, k)).astype(np.float32)
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        graph = layer(shape, co, k, pad, groups, weight)
        plain = build(graph, device=device, optimized=True)  # no passes: no split
        split = build(optimize(graph), device=device, optimized=True)
        session = onnxruntime_layer(shape, k, pad, groups, weight)
        (want,) = session.run(None, {"x": x})
        for module in (plain, split):
            np.testing.assert_allclose(module.run([x])[0], want, rtol=1e-4, atol=1e-4)
        times = {"plain": [], "split": [], "ort": []}
        for _ in range(args.repeat):  # interleaved, so load shifts hit all three
            times["plain"].append(plain.benchmark(number=args.number, repeat=1).mean)
            times["split"].append(split.benchmark(number=args.number, repeat=1).mean)
            start = time.perf_counter()
            for _ in range(args.number):
                session.run(None, {"x": x})
            times["ort"].append((time.perf_counter() - start) / args.number)
        best = {key: min(values) for key, values in times.items()}
        print(f"| {name} | {best['plain'] * 1e3:.2f} | {best['split'] * 1e3:.2f} | "
              f"{best['ort'] * 1e3:.2f} | {best['split'] / best['plain']:.3f} | "
              f"{best['split'] / best['ort']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

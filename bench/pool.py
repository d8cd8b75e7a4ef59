"""Pooling kernels on the local OpenCL device against onnxruntime, side by side in one
run: ResNet-50's stem max-pool (3x3 stride 2 on 64x112x112), DenseNet-121's (same shape)
and transition average pools (2x2 stride 2), and VGG's 2x2 max-pools. Each is built by
`tuner.build` from a one-node ONNX model, checked against onnxruntime, and timed by
device events (ours) and `perf_counter` around `session.run` (onnxruntime), the median
of interleaved rounds.

    .venv/bin/python bench/pool.py [--rounds 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import tuner

CASES: list[tuple[str, str, list[int], dict[str, Any]]] = [
    ("resnet50 stem max 3x3/2", "MaxPool", [1, 64, 112, 112],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("densenet transition avg 2x2/2", "AveragePool", [1, 128, 56, 56],
     {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("vgg max 2x2/2", "MaxPool", [1, 128, 112, 112],
     {"kernel_shape": [2, 2], "strides": [2, 2]}),
]


def model_of(op: str, shape: list[int], attrs: dict[str, Any]) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    opts = parser.parse_args()
    print(f"{'pool':32} {'ours ms':>8} {'onnxruntime ms':>15} {'ours / ort':>11}")
    for name, op, shape, attrs in CASES:
        model = model_of(op, shape, attrs)
        so = ort.SessionOptions()
        so.intra_op_num_threads = opts.threads
        session = ort.InferenceSession(model.SerializeToString(), so,
                                       providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
        with tuner.build(model, "opencl -model=pocl-cpu") as module:
            (ours,) = module.run([x])
            (theirs,) = session.run(None, {"x": x})
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
            mine, ort_times = [], []
            for _ in range(opts.rounds):
                mine.append(module.benchmark(number=20, repeat=1).mean)
                start = time.perf_counter()
                for _ in range(20):
                    session.run(None, {"x": x})
                ort_times.append((time.perf_counter() - start) / 20)
        a, b = statistics.median(mine), statistics.median(ort_times)
        print(f"{name:32} {a * 1e3:8.3f} {b * 1e3:15.3f} {a / b:10.2f}x")


if __name__ == "__main__":
    main()

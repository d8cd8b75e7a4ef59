"""The onnx package's "light" models (ResNet-50, VGG-19, DenseNet-121, ...) as test and
benchmark workloads: where they are, the input onnx's test runner feeds them, and a copy
with random weights.

Their shipped weights are all 0.02 (ConstantOfShape), which makes every softmax output
uniform: a wrong fold or kernel could hide behind that, and 100 layers of identical
weights drift towards denormals. Random weights scaled like a trained net's do neither.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

LIGHT_MODELS = ("resnet50", "vgg19", "densenet121")


def light_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light_path(name: str) -> str:
    """Path of ``light_<name>.onnx``; FileNotFoundError if this onnx does not ship it."""
    path = os.path.join(light_dir(), f"light_{name}.onnx")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is not shipped with this onnx version")
    return path


def shipped_output(name: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    return numpy_helper.to_array(onnx.load_tensor(
        os.path.join(light_dir(), f"light_{name}_output_0.pb")))


def input_shape(model: Any) -> tuple[int, ...]:
    inits = {i.name for i in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    return tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)


def runner_input(model: Any) -> np.ndarray:
    """The input onnx's backend test runner feeds the light models: arange / size."""
    shape = input_shape(model)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def with_random_weights(model: Any, seed: int) -> Any:
    """Every ConstantOfShape weight replaced by a random initializer of its shape: He
    normal for conv/gemm weights, positive for scales and variances, small otherwise."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    readers: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, (node.op_type, k))
    for node in graph.node:  # DenseNet's Mul/Add constants pass through an Unsqueeze
        if node.op_type == "Unsqueeze" and node.output[0] in readers:
            readers[node.input[0]] = readers[node.output[0]]
    nodes, new_inits = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        shape = tuple(int(d) for d in inits[node.input[0]])
        op, k = readers.get(node.output[0], ("", 0))
        if op in ("Conv", "Gemm") and k == 1:
            fan_in = int(np.prod(shape[1:])) if op == "Conv" else shape[-1]
            value = rng.normal(0, np.sqrt(2.0 / fan_in), size=shape)
        elif (op == "BatchNormalization" and k in (1, 4)) or (op == "Mul" and k == 1):
            value = rng.uniform(0.5, 1.5, size=shape)
        else:
            value = rng.uniform(-0.1, 0.1, size=shape)
        new_inits.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    new_graph = helper.make_graph(nodes, graph.name, graph.input, graph.output,
                                  list(graph.initializer) + new_inits)
    out = helper.make_model(new_graph, opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out

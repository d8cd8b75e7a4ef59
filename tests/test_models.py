"""End to end on real models (the onnx package's light ResNet-50, VGG-19, DenseNet-121):
import, optimize, build with template default configs, run on the OpenCL device, and
compare with the shipped reference output and with onnxruntime; then again with random
weights, where a wrong fold, fusion or kernel cannot hide behind constant 0.02 weights."""

from __future__ import annotations

import os
from functools import cache

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

from compiler.build import Module, build  # noqa: E402
from compiler.runtime import open_device  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ("resnet50", "vgg19", "densenet121")
RTOL, ATOL = 1e-3, 1e-5


def model_path(name: str) -> str:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.isfile(path):
        pytest.skip(f"{path} is not shipped with this onnx version")
    return path


def runner_input(model: onnx.ModelProto) -> np.ndarray:
    """The input onnx's backend test runner feeds the light models."""
    inits = {i.name for i in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def with_random_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Every ConstantOfShape weight replaced by a random initializer of its shape, scaled
    as a trained network's would be, so activations stay in range through 100+ layers."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    readers: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, (node.op_type, k))
    # DenseNet's Mul/Add constants pass through an Unsqueeze first
    for node in graph.node:
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
            value = rng.uniform(0.5, 1.5, size=shape)  # scales and variances: positive
        else:
            value = rng.uniform(-0.1, 0.1, size=shape)  # biases, shifts, means
        new_inits.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    new_graph = helper.make_graph(nodes, graph.name, graph.input, graph.output,
                                  list(graph.initializer) + new_inits)
    out = helper.make_model(new_graph, opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out


def onnxruntime_output(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@cache
def device():  # type: ignore[no-untyped-def]
    try:
        return open_device("opencl:0")
    except RuntimeError as err:
        pytest.skip(f"no OpenCL device: {err}")


def built(model: onnx.ModelProto) -> Module:
    return build(model, device=device())


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_matches_shipped_output_and_onnxruntime(name: str) -> None:
    model = onnx.load(model_path(name))
    x = runner_input(model)
    module = built(model)
    (got,) = module.run([x])
    shipped = numpy_helper.to_array(onnx.load_tensor(
        os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    np.testing.assert_allclose(got, shipped, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, onnxruntime_output(model, x), rtol=RTOL, atol=ATOL)
    # the passes did their work: batch-norm folded away, convs carry their epilogues
    ops = [n.op for n in module.graph.ops()]
    assert "nn.batch_norm" not in ops and "fused.conv2d" in ops
    assert all(c.source == "default" for c in module.choices)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_with_random_weights_matches_onnxruntime(name: str) -> None:
    model = with_random_weights(onnx.load(model_path(name)), seed=MODELS.index(name))
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, size=runner_input(model).shape).astype(np.float32)
    want = onnxruntime_output(model, x)
    assert want.std() > 1e-4, "random weights should give a non-uniform softmax"
    (got,) = built(model).run([x])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


TOPHUB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                      "shared", "data", "tophub")


@pytest.mark.slow
def test_resnet50_with_tophub_records_uses_the_valid_ones_and_stays_correct() -> None:
    """TVM's pretuned opencl (1080ti) and cuda logs as records for a PoCL build: the
    configs valid here are used (as "other device"), the rest fall back, and the
    output still equals onnxruntime's."""
    from compiler.records import OTHER_DEVICE, open_source

    logs = [os.path.join(TOPHUB, name) for name in ("opencl_v0.04.log", "cuda_v0.10.log")]
    if not all(os.path.isfile(p) for p in logs):
        pytest.skip(f"TopHub logs not found under {TOPHUB}")
    model = with_random_weights(onnx.load(model_path("resnet50")), seed=11)
    x = np.random.default_rng(2).uniform(0, 1, size=runner_input(model).shape).astype(
        np.float32)
    module = build(model, records=open_source(logs), device=device())
    served = {c.source for c in module.choices}
    other = [c for c in module.choices if c.source == OTHER_DEVICE]
    assert other, "no TopHub record applied"
    assert {c.key for c in other} <= {"opencl", "gpu"}
    assert served <= {OTHER_DEVICE, "default"}
    for choice in other:  # every applied record is a config of the space that fits here
        template = module.tasks[module.choices.index(choice)].template
        assert choice.record is not None and choice.record.workload == choice.workload
        assert choice.template == template
    report = module.report()
    n_other = len(other)
    n_default = len(module.choices) - n_other
    assert (f"{len(module.choices)} tasks: this device 0, other device {n_other}, "
            f"default {n_default}") in report
    (got,) = module.run([x])
    np.testing.assert_allclose(got, onnxruntime_output(model, x), rtol=RTOL, atol=ATOL)

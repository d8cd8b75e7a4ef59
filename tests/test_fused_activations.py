"""The float activations are written once (compiler.templates.activations): a conv's fused
epilogue, the plain element-wise kernels and the IR's numpy semantics agree, NaN included;
the fusion pass takes one activation other than relu per chain; zero-size tensors make
kernels without index arithmetic; C float literals read back as the same float32."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from onnx import helper
from onnx_cases import model, node, rand

from compiler.build_module import build, lower, select_layers
from compiler.frontend import import_onnx
from compiler.ir import GraphBuilder, evaluate
from compiler.kernels import KERNELS
from compiler.passes import optimize
from compiler.runtime import Device
from compiler.runtime.executor import GraphExecutor
from compiler.tasks import CONV_CPU, CONV_GPU
from compiler.templates.base import activation
from compiler.templates.emit import c_float
from schemas import Target

# activation nodes reading the conv's output "c" and writing "y{i}", their fused epilogue op
NAN_CASES = {
    "hard_sigmoid": ([node("HardSigmoid", ["c"], alpha=0.3, beta=0.4)],
                     activation("hard_sigmoid", 0.3, 0.4)),
    "clip": ([node("Clip", ["c", "lo", "hi"])], "clip:-0.5:0.5"),
    "relu": ([node("Relu", ["c"])], "relu"),
    "leaky_relu": ([node("LeakyRelu", ["c"], alpha=0.1)], activation("leaky_relu", 0.1)),
    "hard_swish": ([node("HardSwish", ["c"])], "hard_swish"),
}
BOUNDS = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}


def _nan_input() -> np.ndarray:
    """Mostly numbers, a few NaN pixels: each makes a 3x3 patch of the conv's output NaN
    in every channel, the rest stays finite."""
    x = rand(1, 4, 8, 8, seed=7)
    x[0, 1, 2, 3] = x[0, 3, 6, 6] = np.nan
    return x


def _conv_activations() -> tuple[object, list[str]]:
    """One graph: every ``NAN_CASES`` activation after its own conv + bias."""
    parts = []
    for i, (nodes, _) in enumerate(NAN_CASES.values()):
        rename = {"c": f"c{i}", "y": f"y{i}"}
        parts.append(helper.make_node("Conv", ["x", "w", "b"], [f"c{i}"], name=f"conv_{i}",
                                      pads=[1, 1, 1, 1]))
        parts += [helper.make_node(n.op_type, [rename.get(a, a) for a in n.input],
                                   [rename.get(a, a) for a in n.output], name=f"{n.name}_{i}",
                                   **{a.name: helper.get_attribute_value(a)
                                      for a in n.attribute})
                  for n in nodes]
    weights = {"w": rand(6, 4, 3, 3, seed=1) * 2, "b": rand(6, seed=2), **BOUNDS}
    return model(parts, {"x": (1, 4, 8, 8)}, 14, weights,
                 [f"y{i}" for i in range(len(NAN_CASES))]), list(NAN_CASES)


@pytest.mark.parametrize("template", [CONV_CPU, CONV_GPU])
def test_fused_activations_keep_nan_as_numpy(device: Device, template: str) -> None:
    proto, kinds = _conv_activations()
    graph = import_onnx(proto)
    fused = optimize(graph)
    epilogues = [n.attr("epilogue") for n in fused.nodes if n.op == "fused.conv2d"]
    assert epilogues == [("bias", op) for _, op in NAN_CASES.values()]
    target = device.target if template == CONV_CPU else Target.parse("opencl -device=gpu")
    plan, _, _ = select_layers(fused, target, None, device.limits)
    assert {c.workload.template for c in plan.values()} == {template}
    feeds = {"x": _nan_input()}
    want = evaluate(graph, feeds)  # the unfused graph's numpy semantics
    have = GraphExecutor(lower(fused, plan, device.dialect), device).run(feeds)
    for kind, h, w in zip(kinds, have, want):
        assert 0 < np.isnan(w).sum() < w.size, kind
        np.testing.assert_array_equal(np.isnan(h), np.isnan(w), err_msg=kind)
        np.testing.assert_allclose(h, w, rtol=1e-4, atol=1e-4, err_msg=kind)


@pytest.mark.parametrize("kind", list(NAN_CASES))
def test_plain_activation_kernels_keep_nan(device: Device, kind: str) -> None:
    nodes, _ = NAN_CASES[kind]
    rename = {"c": "x"}
    onnx_nodes = [helper.make_node(n.op_type, [rename.get(a, a) for a in n.input],
                                   list(n.output), name=n.name,
                                   **{a.name: helper.get_attribute_value(a) for a in n.attribute})
                  for n in nodes]
    proto = model(onnx_nodes, {"x": (2, 3, 5)}, 14, BOUNDS)
    x = rand(2, 3, 5, seed=3) * 4
    x[0, 1, :2] = np.nan
    graph = import_onnx(proto)
    (have,) = build(graph, device=device).run({"x": x})
    (want,) = evaluate(graph, {"x": x})
    np.testing.assert_array_equal(np.isnan(have), np.isnan(x))
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)


def test_one_activation_other_than_relu_per_chain() -> None:
    """conv, bias, hard_sigmoid, relu, relu, leaky_relu, clip: the second non-relu
    activation ends the chain, the repeated relu adds nothing; the rest runs unfused."""
    proto = model([node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                   node("HardSigmoid", ["c"], ["h"]), node("Relu", ["h"], ["r"]),
                   helper.make_node("Relu", ["r"], ["r2"], name="relu_1"),
                   node("LeakyRelu", ["r2"], ["l"], alpha=0.1),
                   node("Clip", ["l", "lo", "hi"])],
                  {"x": (1, 4, 8, 8)}, 14,
                  {"w": rand(6, 4, 3, 3, seed=1), "b": rand(6, seed=2), **BOUNDS})
    graph = optimize(import_onnx(proto))
    (conv,) = [n for n in graph.nodes if n.op == "fused.conv2d"]
    assert conv.attr("epilogue") == ("bias", activation("hard_sigmoid", 0.2, 0.5), "relu")
    rest = {n.op for n in graph.nodes} - {"input", "const", "fused.conv2d"}
    assert rest and rest <= {"fused.elementwise", "nn.leaky_relu", "clip"}, rest
    feeds = {"x": rand(1, 4, 8, 8, seed=7)}
    np.testing.assert_allclose(evaluate(graph, feeds)[0],
                               evaluate(import_onnx(proto), feeds)[0], rtol=1e-5, atol=1e-6)


def test_zero_size_kernels_have_no_index_arithmetic(device: Device) -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 0, 3))
    y = b.call("add", [x, b.const(np.ones((1, 1, 3), np.float32))])
    kernel = KERNELS["add"](y)
    body = kernel.source.split("{", 1)[1]
    assert body.strip() == "}", kernel.source
    assert not re.search(r"[/%] 0\b", kernel.source)


@pytest.mark.parametrize("value", [0.1, -3.5, 1e-30, 6.0, math.inf, -math.inf, math.nan])
def test_c_float_literals(value: float) -> None:
    text = c_float(value)
    if math.isnan(value):
        assert text == "(0.0f / 0.0f)"
    elif math.isinf(value):
        assert text == ("(1.0f / 0.0f)" if value > 0 else "(-1.0f / 0.0f)")
    else:
        assert text.endswith("f") and np.float32(float(text[:-1])) == np.float32(value)

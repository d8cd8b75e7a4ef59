"""ONNX's convolution, pooling, matrix-product and dropout operators in their 1-D, 2-D and
3-D forms: imported graphs agree with onnxruntime in the numpy interpreter and on the
device; activations after a conv / dense fuse into its template kernel's epilogue, for
the CPU template and a GPU one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import needs_nvcc, nvcc_ptx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx_cases import model as _model
from onnx_cases import node, rand, run_ort

from compiler.build_module import build, lower, select_layers
from compiler.frontend import FrontendError, import_onnx
from compiler.ir import Graph, evaluate
from compiler.passes import optimize
from compiler.runtime import Device
from compiler.runtime.executor import GraphExecutor
from compiler.tasks import CONV1X1_CPU, CONV_CPU, CONV_GPU
from schemas import DeviceLimits, Target


def model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], opset: int,
          weights: dict[str, np.ndarray] | None = None,
          outputs: Sequence[str] = ("y",)) -> onnx.ModelProto:
    """A case's model; an output named "mask" (Dropout's) is BOOL."""
    return _model(nodes, inputs, opset, weights, outputs, bool_outputs=("mask",))





def feeds_for(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    initialized = {init.name for init in proto.graph.initializer}
    return {i.name: rand(*(d.dim_value for d in i.type.tensor_type.shape.dim), seed=7)
            for i in proto.graph.input if i.name not in initialized}


W2 = rand(4, 3, 3, 3, seed=1)  # ConvTranspose weight [c_in, c_out / group, kh, kw]
CASES: dict[str, onnx.ModelProto] = {
    "conv1d_pads_stride_dilation": model(
        [node("Conv", ["x", "w", "b"], pads=[2, 1], strides=[2], dilations=[2])],
        {"x": (2, 4, 17)}, 11, {"w": rand(6, 4, 3, seed=1), "b": rand(6, seed=2)}),
    "conv1d_grouped_same_lower": model(
        [node("Conv", ["x", "w"], group=2, auto_pad="SAME_LOWER", strides=[2])],
        {"x": (1, 4, 10)}, 22, {"w": rand(6, 2, 4, seed=1)}),
    "conv2d_grouped_dilated_asymmetric": model(
        [node("Conv", ["x", "w"], group=2, dilations=[2, 1], pads=[0, 2, 1, 0])],
        {"x": (1, 4, 9, 8)}, 13, {"w": rand(6, 2, 3, 3, seed=1)}),
    "convtranspose_bias": model([node("ConvTranspose", ["x", "w", "b"])],
                                {"x": (2, 4, 5, 5)}, 11, {"w": W2, "b": rand(3, seed=2)}),
    "convtranspose_strides_pads_output_padding": model(
        [node("ConvTranspose", ["x", "w"], strides=[3, 2], pads=[1, 0, 2, 1],
              output_padding=[2, 1])], {"x": (1, 4, 4, 5)}, 13, {"w": W2}),
    "convtranspose_output_shape": model(
        [node("ConvTranspose", ["x", "w"], strides=[2, 2], output_shape=[12, 10])],
        {"x": (1, 4, 5, 4)}, 13, {"w": W2}),
    "convtranspose_same_lower": model(
        [node("ConvTranspose", ["x", "w"], strides=[2, 3], auto_pad="SAME_LOWER")],
        {"x": (1, 4, 3, 4)}, 13, {"w": W2}),
    "convtranspose_group_dilation": model(
        [node("ConvTranspose", ["x", "w"], group=2, dilations=[2, 3], strides=[2, 1])],
        {"x": (1, 4, 4, 3)}, 13, {"w": rand(4, 3, 2, 2, seed=1)}),
    "convtranspose_1d": model([node("ConvTranspose", ["x", "w"], strides=[2], pads=[1, 0])],
                              {"x": (1, 4, 6)}, 13, {"w": rand(4, 2, 3, seed=1)}),
    "convtranspose_3d": model(
        [node("ConvTranspose", ["x", "w"], strides=[1, 2, 2], pads=[0, 1, 0, 1, 0, 1])],
        {"x": (1, 2, 3, 4, 3)}, 13, {"w": rand(2, 3, 2, 3, 3, seed=1)}),
    "maxpool_1d": model([node("MaxPool", ["x"], kernel_shape=[3], strides=[2], pads=[1, 1])],
                        {"x": (1, 3, 11)}, 12),
    "maxpool_3d_ceil_dilation": model(
        [node("MaxPool", ["x"], kernel_shape=[2, 2, 2], strides=[2, 1, 2], dilations=[1, 2, 1],
              ceil_mode=1)], {"x": (1, 2, 7, 6, 5)}, 12),
    "avgpool_1d_include_pad": model(
        [node("AveragePool", ["x"], kernel_shape=[4], strides=[3], pads=[2, 1],
              count_include_pad=1)], {"x": (2, 2, 10)}, 11),
    "avgpool_3d_same_upper": model(
        [node("AveragePool", ["x"], kernel_shape=[3, 2, 3], strides=[2, 2, 2],
              auto_pad="SAME_UPPER")], {"x": (1, 2, 5, 6, 7)}, 11),
    "global_avgpool_1d": model([node("GlobalAveragePool", ["x"])], {"x": (2, 3, 7)}, 13),
    "global_avgpool_3d": model([node("GlobalAveragePool", ["x"])], {"x": (1, 3, 4, 3, 5)}, 13),
    "matmul_1d_1d": model([node("MatMul", ["a", "b"])], {"a": (5,), "b": (5,)}, 13),
    "matmul_1d_3d": model([node("MatMul", ["a", "b"])], {"a": (4,), "b": (2, 4, 3)}, 13),
    "matmul_3d_1d": model([node("MatMul", ["a", "b"])], {"a": (2, 3, 4), "b": (4,)}, 13),
    "matmul_broadcast": model([node("MatMul", ["a", "b"])], {"a": (3, 1, 2, 5), "b": (4, 5, 3)},
                              13),
    "matmul_2d_3d_weight": model([node("MatMul", ["a", "b"])], {"a": (2, 5)}, 9,
                                 {"b": rand(3, 5, 4, seed=1)}),
    "gemm_scalar_c_trans": model([node("Gemm", ["a", "b", "c"], transA=1, transB=1, beta=2.0)],
                                 {"a": (5, 3)}, 7, {"b": rand(4, 5, seed=1),
                                                    "c": np.array(0.5, np.float32)}),
    "gemm_column_c": model([node("Gemm", ["a", "b", "c"], alpha=0.5)], {"a": (3, 5)}, 13,
                           {"b": rand(5, 4, seed=1), "c": rand(3, 1, seed=2)}),
    "dropout_mask_opset12": model([node("Dropout", ["x", "r"], ["y", "mask"])], {"x": (2, 3)},
                                  12, {"r": np.array(0.4, np.float32)}, ("y", "mask")),
    "dropout_mask_opset10": model([node("Dropout", ["x"], ["y", "mask"], ratio=0.2)],
                                  {"x": (2, 3)}, 10, outputs=("y", "mask")),
    "dropout_training_ratio_0": model(
        [node("Dropout", ["x", "r", "t"], ["y", "mask"])], {"x": (2, 3)}, 13,
        {"r": np.array(0.0, np.float32), "t": np.array(True)}, ("y", "mask")),
}
# run on the device too (one kernel each, plus aliasing reshapes)
ON_DEVICE = ("conv1d_grouped_same_lower", "convtranspose_strides_pads_output_padding",
             "convtranspose_3d", "maxpool_3d_ceil_dilation", "avgpool_1d_include_pad",
             "matmul_broadcast")


# onnxruntime's Dropout-10 gives an all-false mask at inference; ONNX's reference an
# all-true one, as its later versions (and onnxruntime's) do
REFERENCE_ONLY = {"dropout_mask_opset10"}


@pytest.mark.parametrize("name", list(CASES))
def test_import_matches_onnxruntime(name: str) -> None:
    proto = CASES[name]
    feeds = feeds_for(proto)
    expected = (ReferenceEvaluator(proto).run(None, feeds) if name in REFERENCE_ONLY
                else run_ort(proto, feeds))
    got = evaluate(import_onnx(proto), feeds)
    for want, have in zip(expected, got):
        assert have.shape == want.shape and have.dtype == want.dtype, name
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", ON_DEVICE)
def test_runs_on_the_device(device: Device, name: str) -> None:
    proto = CASES[name]
    feeds = feeds_for(proto)
    (want,) = run_ort(proto, feeds)
    (have,) = build(import_onnx(proto), device=device).run(feeds)
    np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("nodes, inputs, opset, weights, words", [
    ([node("Conv", ["x", "w"])], {"x": (1, 2, 4, 4, 4)}, 13, {"w": rand(2, 2, 2, 2, 2)},
     ["Conv", "3-D", "1-D, 2-D"]),
    ([node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2])], {"x": (1, 2, 6)}, 12, {},
     ["MaxPool", "output 1"]),
    ([node("Dropout", ["x", "r", "t"])], {"x": (2, 3)}, 13,
     {"r": np.array(0.5, np.float32), "t": np.array(True)}, ["training_mode", "ratio 0.5"]),
    ([node("MatMul", ["a", "b"])], {"a": (2, 3, 4), "b": (3, 4, 5)}, 13, {},
     ["MatMul", "do not broadcast"]),
    ([node("ConvTranspose", ["x", "w"], pads=[1, 1])], {"x": (1, 4, 3, 3)}, 13, {"w": W2},
     ["ConvTranspose", "4 values"]),
], ids=["conv3d", "maxpool_indices", "dropout_training", "matmul_batch", "convtranspose_pads"])
def test_unsupported_forms_are_refused(nodes: list[onnx.NodeProto], inputs: dict,
                                       opset: int, weights: dict, words: list[str]) -> None:
    outputs = ("y", "i") if "i" in nodes[0].output else ("y",)
    with pytest.raises(FrontendError) as info:
        import_onnx(model(nodes, inputs, opset, weights, outputs))
    for word in words:
        assert word in str(info.value)


# ---------------------------------------------------------------- activation fusion

def _activation(kind: str) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], str]:
    """Nodes computing ``y`` from ``c`` (the conv's output), their weights, and the
    epilogue op they fuse into."""
    if kind == "relu6":
        return ([node("Clip", ["c", "lo", "hi"])],
                {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)},
                "clip:0.0:6.0")
    if kind == "hard_swish":
        return [node("HardSwish", ["c"])], {}, "hard_swish"
    if kind == "hard_sigmoid":
        return [node("HardSigmoid", ["c"], alpha=0.3, beta=0.4)], {}, "hard_sigmoid"
    if kind == "silu":
        return ([node("Sigmoid", ["c"], ["s"]), node("Mul", ["s", "c"])], {}, "silu")
    if kind == "hard_swish_as_mul":  # as exporters wrote it before HardSwish-14
        return ([node("HardSigmoid", ["c"], ["s"], alpha=1 / 6, beta=0.5),
                 node("Mul", ["c", "s"])], {}, "hard_swish")
    if kind == "leaky_relu":
        return [node("LeakyRelu", ["c"], alpha=0.1)], {}, "leaky_relu:0.1"
    assert kind == "prelu_one_slope"
    return ([node("PRelu", ["c", "slope"])],
            {"slope": np.full((6, 1, 1), 0.25, np.float32)}, "leaky_relu:0.25")


ACTIVATIONS = ("relu6", "hard_swish", "hard_sigmoid", "silu", "hard_swish_as_mul", "leaky_relu",
               "prelu_one_slope")


def _conv_act(kind: str) -> tuple[onnx.ModelProto, str]:
    nodes, weights, op = _activation(kind)
    conv = node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    # a wide spread of pre-activation values: every branch of each activation is taken
    w, b = rand(6, 4, 3, 3, seed=1) * 2, rand(6, seed=2)
    return model([conv, *nodes], {"x": (1, 4, 8, 8)}, 14, {"w": w, "b": b, **weights}), op


def _fused_only(graph: Graph, op: str) -> str:
    """The epilogue of the graph's one compute node, asserting there is just that."""
    compute = [n for n in graph.nodes if n.op not in ("input", "const")]
    assert [n.op for n in compute] == [op], [n.op for n in compute]
    return "+".join(compute[0].attr("epilogue"))


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_activation_fuses_into_the_conv_epilogue(kind: str) -> None:
    proto, op = _conv_act(kind)
    graph = optimize(import_onnx(proto))
    epilogue = _fused_only(graph, "fused.conv2d")
    assert epilogue.startswith("bias+") and epilogue.split("+")[1].startswith(op), epilogue
    feeds = feeds_for(proto)
    np.testing.assert_allclose(evaluate(graph, feeds)[0], run_ort(proto, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_per_channel_prelu_is_left_unfused() -> None:
    conv = node("Conv", ["x", "w"], ["c"])
    proto = model([conv, node("PRelu", ["c", "slope"])], {"x": (1, 4, 5, 5)}, 13,
                  {"w": rand(6, 4, 3, 3, seed=1), "slope": rand(6, 1, 1, seed=3)})
    graph = optimize(import_onnx(proto))
    assert "nn.conv2d" in {n.op for n in graph.nodes}
    feeds = feeds_for(proto)
    np.testing.assert_allclose(evaluate(graph, feeds)[0], run_ort(proto, feeds)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("template", [CONV_CPU, CONV_GPU])
def test_fused_activations_run_on_the_device(device: Device, template: str) -> None:
    """Every activation after its own conv, in one graph, on the CPU template (the
    device's default) and the GPU one (chosen as a GPU target would)."""
    parts, weights = [], {}
    conv_w, conv_b = rand(6, 4, 3, 3, seed=1) * 2, rand(6, seed=2)
    for i, kind in enumerate(ACTIVATIONS):
        nodes, extra, _ = _activation(kind)
        rename = {"c": f"c{i}", "y": f"y{i}", "s": f"s{i}"}
        parts.append(helper.make_node("Conv", ["x", "w", "b"], [f"c{i}"], name=f"conv_{i}",
                                      pads=[1, 1, 1, 1]))
        for n in nodes:
            parts.append(helper.make_node(n.op_type, [rename.get(a, a) for a in n.input],
                                          [rename.get(a, a) for a in n.output],
                                          name=f"{n.name}_{i}", **{
                                              a.name: helper.get_attribute_value(a)
                                              for a in n.attribute}))
        weights.update(extra)
    proto = model(parts, {"x": (1, 4, 8, 8)}, 14, {"w": conv_w, "b": conv_b, **weights},
                  [f"y{i}" for i in range(len(ACTIVATIONS))])
    graph = optimize(import_onnx(proto))
    target = device.target if template == CONV_CPU else Target.parse("opencl -device=gpu")
    plan, _, _ = select_layers(graph, target, None, device.limits)
    assert {c.workload.template for c in plan.values()} == {template}
    assert len(plan) == len(ACTIVATIONS) == len(graph.outputs)
    feeds = feeds_for(proto)
    executor = GraphExecutor(lower(graph, plan, device.dialect), device)
    for kind, have, want in zip(ACTIVATIONS, executor.run(feeds), run_ort(proto, feeds)):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4, err_msg=kind)


def test_activation_fuses_into_the_dense_epilogue(device: Device) -> None:
    proto = model([node("Gemm", ["x", "w", "b"], ["c"], transB=1), node("HardSwish", ["c"])],
                  {"x": (4, 16)}, 14, {"w": rand(8, 16, seed=1) * 2, "b": rand(8, seed=2)})
    graph = optimize(import_onnx(proto))
    assert _fused_only(graph, "fused.dense") == "bias+hard_swish"
    feeds = feeds_for(proto)
    (have,) = build(graph, device=device, optimized=True).run(feeds)
    np.testing.assert_allclose(have, run_ort(proto, feeds)[0], rtol=1e-4, atol=1e-4)


def test_fused_activation_in_a_blocked_store(device: Device) -> None:
    """A conv whose output feeds another CPU-template conv stores NCHW[x]c vectors; a
    non-relu activation is applied lane by lane there."""
    proto = model([node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                   node("HardSwish", ["c"], ["h"]),
                   helper.make_node("Conv", ["h", "w2"], ["y"], name="conv_1")],
                  {"x": (1, 8, 6, 6)}, 14,
                  {"w": rand(16, 8, 3, 3, seed=1) * 2, "w2": rand(8, 16, 1, 1, seed=2)})
    module = build(import_onnx(proto), device=device)
    assert module.program.blocks, "the first conv should store a blocked layout"
    feeds = feeds_for(proto)
    np.testing.assert_allclose(module.run(feeds)[0], run_ort(proto, feeds)[0],
                               rtol=1e-4, atol=1e-4)


def test_grouped_conv_runs_per_group_template_convs(device: Device) -> None:
    """A grouped conv with bias, relu and a residual add: one template conv per group
    (one tuning task), epilogue included, then a concatenation."""
    proto = model([node("Conv", ["x", "w", "b"], ["c"], group=3, pads=[1, 1, 1, 1]),
                   node("Relu", ["c"], ["r"]), node("Add", ["r", "z"])],
                  {"x": (1, 6, 7, 7), "z": (1, 9, 7, 7)}, 13,
                  {"w": rand(9, 2, 3, 3, seed=1), "b": rand(9, seed=2)})
    graph = optimize(import_onnx(proto))
    ops = [n.op for n in graph.nodes if n.op not in ("input", "const")]
    assert ops.count("fused.conv2d") == 3 and ops[-1] == "concatenate", ops
    assert {n.attr("epilogue") for n in graph.nodes if n.op == "fused.conv2d"} == {
        ("bias", "relu", "add")}
    module = build(graph, device=device, optimized=True)
    (task,) = module.tasks
    assert task.template == CONV_CPU and len(task.layers) == 3
    feeds = feeds_for(proto)
    np.testing.assert_allclose(module.run(feeds)[0], run_ort(proto, feeds)[0],
                               rtol=1e-4, atol=1e-4)


def test_resnext_grouped_block_keeps_the_cpu_template(device: Device) -> None:
    """A ResNeXt-style block on PoCL (opencl -model=pocl-cpu): a 3x3 conv in 8 groups,
    relu, then a plain 1x1 conv. The group split puts strided slices before the per-group
    convs and a concatenation after them; every conv still runs a CPU template (the 1x1
    one on the 1x1 conv where the device has 16 lanes, tasks._cpu_preferred)."""
    proto = model([node("Conv", ["x", "w"], ["c"], group=8, pads=[1, 1, 1, 1]),
                   node("Relu", ["c"], ["r"]),
                   helper.make_node("Conv", ["r", "w2"], ["y"], name="conv_1")],
                  {"x": (1, 64, 14, 14)}, 13,
                  {"w": rand(64, 8, 3, 3, seed=1), "w2": rand(32, 64, 1, 1, seed=2)})
    graph = import_onnx(proto)
    module = build(graph, device=device)
    assert str(device.target) == "opencl -model=pocl-cpu"
    ops = [n.op for n in module.graph.nodes if n.op not in ("input", "const")]
    assert ops.count("strided_slice") == 8 and "concatenate" in ops, ops
    groups, plain = module.tasks
    assert groups.layers == [f"conv_0.g{k}" for k in range(8)] and plain.layers == ["conv_1"]
    one_by_one = CONV1X1_CPU if device.limits.simd_lanes >= 16 else CONV_CPU
    assert [c.template for c in module.choices] == [CONV_CPU, one_by_one]
    feeds = feeds_for(proto)
    np.testing.assert_allclose(module.run(feeds)[0], evaluate(graph, feeds)[0],
                               rtol=1e-4, atol=1e-3)


@needs_nvcc
def test_kernels_compile_as_cuda(tmp_path: Path) -> None:
    """Every kernel of the device cases, the grouped conv and the fused activations (on
    the GPU templates a CUDA target picks), as CUDA C that nvcc compiles."""
    protos = [CASES[name] for name in ON_DEVICE] + [_conv_act(kind)[0] for kind in ACTIVATIONS]
    target = Target.parse("cuda -model=h200 -arch=sm_90")
    sources: dict[str, str] = {}
    for proto in protos:
        graph = optimize(import_onnx(proto))
        plan, _, _ = select_layers(graph, target, None, DeviceLimits())
        for step in lower(graph, plan, "cuda").steps:
            entry = f"{step.kernel.entry}_{len(sources)}"
            sources.setdefault(step.kernel.source,
                               re.sub(rf"\b{step.kernel.entry}\b", entry, step.kernel.source))
    path = tmp_path / "nn.cu"
    path.write_text("\n".join(sources.values()))
    proc = nvcc_ptx(path)
    assert proc.returncode == 0, proc.stderr[:4000]
    entries = set(re.findall(r"\.entry\s+(\w+)", path.with_suffix(".ptx").read_text()))
    assert len(entries) == len(sources)

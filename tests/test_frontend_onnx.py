"""The ONNX frontend: every supported op, in each of its opset forms, imported and run by
the numpy interpreter agrees with onnxruntime; what the IR cannot express is refused by
name; the light model zoo models that ship with onnx import fast and compute the shipped
outputs."""

from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_cases import (
    Case,
    assert_imports_like_onnxruntime,
    error,
    ints,
    node,
    rand,
    run_ort,
)

from compiler.frontend import FrontendError, import_onnx
from compiler.ir import evaluate

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def unary(op: str, opset: int = 13, **attrs: object) -> Case:
    return Case([node(op, ["x"], **attrs)], {"x": (2, 3, 4, 5)}, opset)


NCHW = {"x": (2, 4, 9, 9)}
W = {"w": rand(6, 4, 3, 3, seed=1), "b": rand(6, seed=2)}

CASES: dict[str, Case] = {
    "relu": unary("Relu"),
    "sigmoid": unary("Sigmoid"),
    "leaky_relu": unary("LeakyRelu", alpha=0.2),
    "leaky_relu_default": unary("LeakyRelu", opset=9),
    "identity": unary("Identity"),
    "add_broadcast": Case([node("Add", ["x", "z"])], {"x": (2, 3, 4), "z": (3, 1)}, 13),
    "mul_weight": Case([node("Mul", ["x", "s"])], {"x": (2, 3, 4)}, 9, weights={"s": rand(4)}),
    "sub": Case([node("Sub", ["x", "z"])], {"x": (2, 3), "z": (2, 3)}, 13),
    "div": Case([node("Div", ["x", "d"])], {"x": (2, 3)}, 13,
                weights={"d": np.full(3, 4.0, np.float32)}),
    "sum_3": Case([node("Sum", ["x", "z", "x"])], {"x": (2, 3), "z": (3,)}, 9),
    "sum_1_opset13": Case([node("Sum", ["x"])], {"x": (2, 3)}, 13),
    "concat": Case([node("Concat", ["x", "z", "x"], axis=1)], {"x": (2, 3, 4), "z": (2, 1, 4)},
                   9),
    "concat_negative_axis": Case([node("Concat", ["x", "z"], axis=-1)],
                                 {"x": (2, 3), "z": (2, 5)}, 13),
    "conv_pads_strides": Case([node("Conv", ["x", "w"], pads=[1, 2, 0, 1], strides=[2, 1])],
                              NCHW, 9, weights={"w": W["w"]}),
    "conv_bias_dilation": Case([node("Conv", ["x", "w", "b"], dilations=[2, 2], pads=[2, 2, 2, 2],
                                     kernel_shape=[3, 3])], NCHW, 11, weights=W),
    "conv_grouped_bias": Case([node("Conv", ["x", "w", "b"], group=2)], NCHW, 13,
                              weights={"w": rand(6, 2, 3, 3, seed=3), "b": W["b"]}),
    "conv_depthwise_bias": Case([node("Conv", ["x", "w", "b"], group=4, pads=[1, 1, 1, 1])],
                                NCHW, 11, weights={"w": rand(4, 1, 3, 3, seed=4), "b": rand(4)}),
    "conv_same_upper": Case([node("Conv", ["x", "w"], auto_pad="SAME_UPPER", strides=[2, 2],
                                  kernel_shape=[4, 4])], {"x": (1, 4, 8, 8)}, 11,
                            weights={"w": rand(6, 4, 4, 4, seed=5)}),
    "conv_same_lower": Case([node("Conv", ["x", "w"], auto_pad="SAME_LOWER",
                                  kernel_shape=[4, 4])], {"x": (1, 4, 7, 7)}, 13,
                            weights={"w": rand(6, 4, 4, 4, seed=5)}),
    "conv_valid": Case([node("Conv", ["x", "w"], auto_pad="VALID", strides=[2, 2])], NCHW, 13,
                       weights={"w": W["w"]}),
    "conv_weight_input": Case([node("Conv", ["x", "w"])], {"x": (1, 4, 6, 6), "w": (3, 4, 3, 3)},
                              13),
    "maxpool": Case([node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                          pads=[1, 1, 1, 1])], NCHW, 9),
    "maxpool_ceil_mode": Case([node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                                    ceil_mode=1)], {"x": (1, 2, 10, 10)}, 10),
    "maxpool_same_upper": Case([node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2],
                                     auto_pad="SAME_UPPER")], NCHW, 11),
    "maxpool_dilation_unused_indices": Case(
        [node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 2], dilations=[2, 2])],
        NCHW, 12),
    "avgpool_count_include_pad": Case([node("AveragePool", ["x"], kernel_shape=[3, 3],
                                            pads=[1, 1, 1, 1], count_include_pad=1)], NCHW, 9),
    "avgpool_exclude_pad": Case([node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 0, 1, 2])], NCHW, 11),
    "avgpool_ceil_mode": Case([node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2],
                                    ceil_mode=1)], NCHW, 13),
    "avgpool_same_lower": Case([node("AveragePool", ["x"], kernel_shape=[3, 3],
                                     auto_pad="SAME_LOWER")], NCHW, 17),
    "global_avgpool": Case([node("GlobalAveragePool", ["x"])], NCHW, 9),
    "batchnorm_opset9": Case([node("BatchNormalization", ["x", "g", "b", "m", "v"],
                                   epsilon=1e-3)], NCHW, 9, weights={
        "g": rand(4, seed=1), "b": rand(4, seed=2), "m": rand(4, seed=3),
        "v": np.abs(rand(4, seed=4)) + 0.5}),
    "batchnorm_opset15": Case([node("BatchNormalization", ["x", "g", "b", "m", "v"])], NCHW, 15,
                              weights={"g": rand(4, seed=1), "b": rand(4, seed=2),
                                       "m": rand(4, seed=3), "v": np.abs(rand(4, seed=4))}),
    "gemm_transb_bias": Case([node("Gemm", ["x", "w", "b"], transB=1)], {"x": (3, 5)}, 9,
                             weights={"w": rand(4, 5, seed=1), "b": rand(4, seed=2)}),
    "gemm_alpha_beta_transa": Case([node("Gemm", ["x", "w", "c"], transA=1, alpha=0.5, beta=2.0)],
                                   {"x": (5, 3)}, 11,
                                   weights={"w": rand(5, 4, seed=1), "c": rand(3, 4, seed=2)}),
    "gemm_no_c": Case([node("Gemm", ["x", "w"], alpha=3.0)], {"x": (3, 5)}, 11,
                      weights={"w": rand(5, 4, seed=1)}),
    "gemm_row_c_beta": Case([node("Gemm", ["x", "w", "c"], beta=0.25)], {"x": (3, 5)}, 13,
                            weights={"w": rand(5, 4, seed=1), "c": rand(1, 4, seed=2)}),
    "gemm_inputs": Case([node("Gemm", ["x", "w", "c"], transB=1, beta=0.5)],
                        {"x": (3, 5), "w": (4, 5), "c": (3, 1)}, 13),
    "matmul_weight": Case([node("MatMul", ["x", "w"])], {"x": (3, 5)}, 9,
                          weights={"w": rand(5, 4, seed=1)}),
    "matmul_inputs": Case([node("MatMul", ["x", "w"])], {"x": (3, 5), "w": (5, 2)}, 13),
    "matmul_4d": Case([node("MatMul", ["x", "w"])], {"x": (2, 3, 2, 5)}, 13,
                      weights={"w": rand(5, 4, seed=1)}),
    "flatten_axis1": Case([node("Flatten", ["x"])], NCHW, 9),
    "flatten_axis2": Case([node("Flatten", ["x"], axis=2)], NCHW, 13),
    "flatten_axis0": Case([node("Flatten", ["x"], axis=0)], {"x": (2, 3)}, 11),
    "reshape_0_and_minus1": Case([node("Reshape", ["x", "s"])], {"x": (2, 3, 4, 5)}, 13,
                                 weights={"s": ints(0, -1, 5)}),
    "reshape_constant_node": Case([node("Constant", [], ["s"], value=numpy_helper.from_array(
        ints(-1, 4))), node("Reshape", ["x", "s"])], {"x": (2, 3, 4)}, 9),
    "transpose_perm": Case([node("Transpose", ["x"], perm=[0, 2, 3, 1])], NCHW, 13),
    "transpose_default": Case([node("Transpose", ["x"])], {"x": (2, 3, 4)}, 9),
    "pad_opset9": Case([node("Pad", ["x"], pads=[0, 1, 2, 0, 0, 3, 1, 1], value=1.5)], NCHW, 9),
    "pad_opset13_value": Case([node("Pad", ["x", "p", "v"])], {"x": (2, 3)}, 13,
                              weights={"p": ints(1, 0, 2, 3),
                                       "v": np.array(-2.0, dtype=np.float32)}),
    "pad_opset11_no_value": Case([node("Pad", ["x", "p"], mode="constant")], {"x": (2, 3)}, 11,
                                 weights={"p": ints(0, 1, 1, 0)}),
    "softmax_opset11_axis1_3d": Case([node("Softmax", ["x"], axis=1)], {"x": (2, 3, 4)}, 11),
    "softmax_opset11_default": Case([node("Softmax", ["x"])], {"x": (2, 3, 4)}, 11),
    "softmax_opset9_last": Case([node("Softmax", ["x"], axis=-1)], {"x": (2, 3, 4)}, 9),
    "softmax_opset13_axis1": Case([node("Softmax", ["x"], axis=1)], {"x": (2, 3, 4)}, 13),
    "softmax_opset13_default": Case([node("Softmax", ["x"])], {"x": (2, 3, 4)}, 13),
    "dropout_opset9_ratio_attr": Case([node("Dropout", ["x"], ["y", "mask"], ratio=0.3)],
                                      {"x": (2, 3)}, 9),
    "dropout_opset13_ratio_input": Case([node("Dropout", ["x", "r"], ["y", "mask"])],
                                        {"x": (2, 3)}, 13,
                                        weights={"r": np.array(0.2, dtype=np.float32)}),
    "dropout_opset13_training_false": Case(
        [node("Dropout", ["x", "r", "t"])], {"x": (2, 3)}, 13,
        weights={"r": np.array(0.2, dtype=np.float32), "t": np.array(False)}),
    "lrn_odd": Case([node("LRN", ["x"], size=3, alpha=0.01, beta=0.6, bias=2.0)], NCHW, 9),
    "lrn_defaults": Case([node("LRN", ["x"], size=5)], {"x": (2, 7, 3, 3)}, 13),
    "constant_value": Case([node("Constant", [], ["c"], value=numpy_helper.from_array(rand(3))),
                            node("Add", ["x", "c"])], {"x": (2, 3)}, 9),
    "constant_value_float": Case([node("Constant", [], ["c"], value_float=2.5),
                                  node("Mul", ["x", "c"])], {"x": (2, 3)}, 13),
    "constant_value_floats": Case([node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
                                   node("Sub", ["x", "c"])], {"x": (2, 3)}, 13),
    "constant_value_ints": Case([node("Constant", [], ["s"], value_ints=[3, 2]),
                                 node("Reshape", ["x", "s"])], {"x": (2, 3)}, 13),
    "constant_value_int": Case([node("Constant", [], ["a"], value_int=0),
                                node("Unsqueeze", ["x", "a"])], {"x": (2, 3)}, 13),
    "constant_of_shape": Case([node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(
        np.array([0.5], dtype=np.float32))), node("Add", ["x", "c"])], {"x": (2, 3)}, 9,
        weights={"s": ints(2, 3)}),
    "constant_of_shape_default": Case([node("ConstantOfShape", ["s"], ["c"]),
                                       node("Add", ["x", "c"])], {"x": (2, 3)}, 13,
                                      weights={"s": ints(3)}),
    "unsqueeze_opset11": Case([node("Unsqueeze", ["x"], axes=[0, -1])], {"x": (2, 3)}, 11),
    "unsqueeze_opset13": Case([node("Unsqueeze", ["x", "a"])], {"x": (2, 3)}, 13,
                              weights={"a": ints(1, 3)}),
    "unsqueeze_weight_opset9": Case([node("Unsqueeze", ["g"], ["g4"], axes=[1, 2]),
                                     node("Mul", ["x", "g4"])], NCHW, 9, weights={"g": rand(4)}),
    "squeeze_opset11": Case([node("Squeeze", ["x"], axes=[1])], {"x": (2, 1, 3, 1)}, 11),
    "squeeze_opset13_all": Case([node("Squeeze", ["x"])], {"x": (2, 1, 3, 1)}, 13),
    "squeeze_opset13_axes": Case([node("Squeeze", ["x", "a"])], {"x": (2, 1, 3, 1)}, 13,
                                 weights={"a": ints(-1)}),
    # the flatten PyTorch exports: shape arithmetic evaluated at import
    "shape_gather_concat_reshape": Case([
        node("Shape", ["x"], ["shape"]),
        node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        node("Gather", ["shape", "zero"], ["batch"], axis=0),
        node("Unsqueeze", ["batch"], ["batch1"], axes=[0]),
        node("Constant", [], ["rest"], value_ints=[-1]),
        node("Concat", ["batch1", "rest"], ["target"], axis=0),
        node("Cast", ["target"], ["target64"], to=TensorProto.INT64),
        node("Reshape", ["x", "target64"]),
    ], NCHW, 11),
    # and with arithmetic on the dimensions: [N, C * H * W] from Shape, Gather and Mul
    "shape_arithmetic_reshape": Case([
        node("Shape", ["x"], ["shape"]),
        *(helper.make_node("Gather", ["shape", f"i{k}"], [dim], f"gather_{dim}", axis=0)
          for k, dim in enumerate("nchw")),
        helper.make_node("Mul", ["c", "h"], ["ch"], "mul_ch"),
        helper.make_node("Mul", ["ch", "w"], ["chw"], "mul_chw"),
        node("Concat", ["n", "chw"], ["target"], axis=0),
        node("Reshape", ["x", "target"]),
    ], NCHW, 13, weights={"i0": ints(0), "i1": ints(1), "i2": ints(2), "i3": ints(3)}),
    "two_outputs": Case([node("Relu", ["x"], ["r"]), node("Sigmoid", ["r"], ["s"])],
                        {"x": (2, 3)}, 13, outputs=("s", "r")),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_op_matches_onnxruntime(case: Case) -> None:
    assert_imports_like_onnxruntime(case)


def test_node_names_are_kept() -> None:
    graph = import_onnx(CASES["conv_bias_dilation"].model())
    assert {n.name for n in graph.ops()} == {"conv_0"}
    assert graph.inputs[0].name == "x"


def test_constant_weight_transpose_is_folded_at_import() -> None:
    graph = import_onnx(CASES["gemm_alpha_beta_transa"].model())
    w = CASES["gemm_alpha_beta_transa"].weights["w"]
    assert "transpose" in [n.op for n in graph.ops()]  # A is an input: transposed at run time
    (weight,) = [n.inputs[1] for n in graph.ops() if n.op == "nn.dense"]
    assert weight.is_const and np.array_equal(weight.value, w.T)


def test_shape_inputs_do_not_become_constants() -> None:
    graph = import_onnx(CASES["shape_gather_concat_reshape"].model())
    assert [n.op for n in graph.ops()] == ["reshape"]
    assert graph.constants() == []


def opset13(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_dynamic_batch_dimension_is_one() -> None:
    graph = helper.make_graph([node("Relu", ["x"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert import_onnx(opset13(graph)).inputs[0].ty.shape == (1, 3)




@pytest.mark.parametrize("op", ["Hardmax", "Einsum"])
def test_unsupported_op_names_the_op_and_node(op: str) -> None:
    attrs = {"equation": "ij->ji"} if op == "Einsum" else {}
    message = error(Case([node("Relu", ["x"], ["r"]), node(op, ["r"], **attrs)],
                         {"x": (2, 3)}, 13))
    assert op in message and f"{op.lower()}_0" in message


def test_unnamed_node_is_named_by_its_output() -> None:
    unnamed = helper.make_node("Hardmax", ["x"], ["hardmax_out"])
    message = error(Case([unnamed], {"x": (2, 3)}, 13, outputs=("hardmax_out",)))
    assert "Hardmax" in message and "hardmax_out" in message


@pytest.mark.parametrize("case, words", [
    (Case([node("Pad", ["x", "p"], mode="edge")], {"x": (2, 3), "p": (4,)}, 19),
     ["Pad", "pad_0", "pads", "import time"]),
    (Case([node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2])], NCHW, 13,
          outputs=("y", "idx")), ["MaxPool", "maxpool_0", "output 1"]),
    (Case([node("MaxPool", ["x"], kernel_shape=[2, 2], storage_order=1)], NCHW, 11),
     ["MaxPool", "storage_order"]),
    (Case([node("MatMul", ["x", "z"])], {"x": (2, 3, 4), "z": (3, 5, 6)}, 13),
     ["MatMul", "matmul_0"]),
    (Case([node("Add", ["x", "z"])], {"x": (2, 3), "z": (4,)}, 13), ["Add", "add_0", "broadcast"]),
    (Case([node("Reshape", ["x", "s"])], {"x": (2, 3)}, 13, weights={"s": ints(4, -1)}),
     ["Reshape", "reshape_0", "cannot reshape"]),
    (Case([node("Hardmax", ["x"])], {"x": (2, 3)}, 13), ["Hardmax", "hardmax_0", "supported"]),
    (Case([node("Relu", ["x"])], {"x": (2, 3)}, 99), ["opset 99", "7 to"]),
    (Case([node("Conv", ["x", "w"])], {"x": (1, 2, 5, 5, 5)}, 13,
          weights={"w": rand(2, 2, 3, 3, 3)}), ["Conv", "conv_0", "3-D"]),
    (Case([node("Concat", ["x", "x"])], {"x": (2, 3)}, 13), ["Concat", "concat_0", "axis"]),
    (Case([node("Concat", ["x", "x"], axis=5)], {"x": (2, 3)}, 13),
     ["Concat", "axis 5 out of range"]),
], ids=["pad_runtime_pads", "maxpool_indices_used", "storage_order", "matmul_bad_batch",
        "bad_broadcast", "bad_reshape", "hardmax", "opset_99", "conv3d", "concat_no_axis",
        "concat_bad_axis"])
def test_unsupported_forms_are_refused_by_name(case: Case, words: list[str]) -> None:
    message = error(case)
    for word in words:
        assert word in message


@pytest.mark.parametrize("elem, dims, words", [
    (TensorProto.INT64, [2, 3], ["INT64", "float32"]),
    (TensorProto.FLOAT, [2, "H"], ["dimension 1", "dynamic"]),
])
def test_graph_inputs_must_be_static_float32(elem: int, dims: list[object],
                                            words: list[str]) -> None:
    graph = helper.make_graph([node("Identity", ["x"])], "g",
                              [helper.make_tensor_value_info("x", elem, dims)],
                              [helper.make_tensor_value_info("y", elem, None)])
    with pytest.raises(FrontendError) as info:
        import_onnx(opset13(graph))
    for word in words:
        assert word in str(info.value)


@pytest.mark.serial
@pytest.mark.parametrize("name", ["light_resnet50", "light_vgg19", "light_densenet121"])
def test_light_model_imports_and_matches_shipped_output(name: str) -> None:
    path = os.path.join(LIGHT, f"{name}.onnx")
    expected = os.path.join(LIGHT, f"{name}_output_0.pb")
    if not (os.path.exists(path) and os.path.exists(expected)):
        pytest.skip(f"{name} is not shipped with this onnx package ({LIGHT})")
    start = time.perf_counter()
    graph = import_onnx(path)
    assert time.perf_counter() - start < 2.0
    (data,) = graph.inputs
    size = int(np.prod(data.ty.shape))
    x = (np.arange(size).reshape(data.ty.shape) / size).astype(np.float32)
    (want,) = run_ort(path, {data.name: x})
    assert graph.outputs[0].ty.shape == want.shape
    (got,) = evaluate(graph, [x])
    shipped = numpy_helper.to_array(onnx.load_tensor(expected))
    np.testing.assert_allclose(got, shipped, rtol=1e-3, atol=1e-5)

"""Element-wise ONNX operators: each operator version (attributes that became inputs,
optional bounds, integer exponents, variadic broadcasting) imported and interpreted
agrees with onnxruntime, forms the IR cannot express are refused by name, and the plain
and fused element-wise kernels compute the same on the device (NaN, bool and integer
tensors included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import needs_nvcc, nvcc_ptx
from onnx import TensorProto
from onnx_cases import Case, error, rand, run_ort
from onnx_cases import named_node as node

from compiler.build_module import build
from compiler.frontend import import_onnx
from compiler.ir import evaluate
from compiler.kernels import lower
from compiler.passes import optimize
from compiler.runtime import Device

X = {"x": (2, 3, 4)}
XZ = {"x": (2, 3, 4), "z": (3, 1)}



def unary(op: str, opset: int, **attrs: object) -> Case:
    return Case([node(op, ["x"], **attrs)], X, opset)


def to_float(op: str, inputs: list[str], opset: int = 13, **attrs: object) -> list[onnx.NodeProto]:
    """``op`` (whose output is not float32) followed by a Cast back to float32."""
    return [node(op, inputs, ["t"], **attrs), node("Cast", ["t"], to=TensorProto.FLOAT)]


CASES: dict[str, Case] = {
    "relu_v6": unary("Relu", 7),
    "relu_v14": unary("Relu", 14),
    "leaky_relu_v6_default": unary("LeakyRelu", 7),
    "leaky_relu_v16": unary("LeakyRelu", 16, alpha=0.3),
    "elu_v6": unary("Elu", 7, alpha=0.5),
    "elu_v22_default": unary("Elu", 22),
    "selu_v6": unary("Selu", 7, alpha=2.0, gamma=1.5),
    "selu_v22_default": unary("Selu", 22),
    "sigmoid_v6": unary("Sigmoid", 7),
    "hard_sigmoid_v6_default": unary("HardSigmoid", 7),
    "hard_sigmoid_v22": unary("HardSigmoid", 22, alpha=0.4, beta=0.3),
    "hard_swish_v14": unary("HardSwish", 14),
    "hard_swish_v22": unary("HardSwish", 22),
    "tanh_v6": unary("Tanh", 7),
    "tanh_v13": unary("Tanh", 13),
    "softplus_v1": unary("Softplus", 7),
    "softplus_v22": unary("Softplus", 22),
    "gelu_none": unary("Gelu", 20),
    "gelu_tanh": unary("Gelu", 20, approximate="tanh"),
    "mish_v18": unary("Mish", 18),
    "mish_v22": unary("Mish", 22),
    "erf_v9": unary("Erf", 9),
    "erf_v13": unary("Erf", 13),
    "sqrt_nan": unary("Sqrt", 13),
    "exp_v6": unary("Exp", 7),
    "log_nan": unary("Log", 13),
    "abs_v6": unary("Abs", 7),
    "neg_v13": unary("Neg", 13),
    "prelu_v7_channel": Case([node("PRelu", ["x", "s"])], X, 7, weights={"s": rand(4, seed=1)}),
    "prelu_v9_3x1": Case([node("PRelu", ["x", "s"])], X, 9, weights={"s": rand(3, 1, seed=1)}),
    "prelu_v16_full": Case([node("PRelu", ["x", "s"])], X, 16,
                           weights={"s": rand(2, 3, 4, seed=1)}),
    "clip_v6_attrs": unary("Clip", 7, min=-0.5, max=0.7),
    "clip_v6_min_only": unary("Clip", 7, min=0.1),
    "clip_v11_no_bounds": Case([node("Clip", ["x"])], X, 11),
    "clip_v11_min_input": Case([node("Clip", ["x", "lo"])], X, 11,
                               weights={"lo": np.array(-0.2, np.float32)}),
    "clip_v12_max_only": Case([node("Clip", ["x", "", "hi"])], X, 12,
                              weights={"hi": np.array(0.3, np.float32)}),
    "clip_v13_min_above_max": Case([node("Clip", ["x", "lo", "hi"])], X, 13,
                                   weights={"lo": np.array(1.0, np.float32),
                                            "hi": np.array(0.5, np.float32)}),
    "clip_v13_computed_bounds": Case([node("ReduceMean", ["x"], ["lo"], keepdims=0),
                                      node("Clip", ["x", "lo", "hi"])], X, 13,
                                     weights={"hi": np.array(0.5, np.float32)}),
    "clip_v13_int32_min_only": Case([
        node("Mul", ["x", "k"], ["m"]), node("Cast", ["m"], ["i"], to=TensorProto.INT32),
        node("Clip", ["i", "lo"], ["c"]), node("Cast", ["c"], to=TensorProto.FLOAT)], X, 13,
        weights={"k": np.array(5.0, np.float32), "lo": np.array(-2, np.int32)}),
    "add_v7_bcast": Case([node("Add", ["x", "z"])], XZ, 7),
    "sub_v13": Case([node("Sub", ["z", "x"])], XZ, 13),
    "mul_v14": Case([node("Mul", ["x", "z"])], XZ, 14),
    "div_v7": Case([node("Div", ["x", "z"])], XZ, 7),
    "pow_v7": Case([node("Pow", ["x", "z"])], XZ, 7),
    "pow_v15_int64_exponent": Case([node("Pow", ["x", "e"])], X, 15,
                                   weights={"e": np.array([2, 3, -1, 0], np.int64)}),
    "pow_v15_float64_exponent": Case([node("Pow", ["x", "e"])], X, 15,
                                     weights={"e": np.array([2.0, 0.5, 3.0, 1.0])}),
    "pow_v13_int32_exponent": Case([node("Pow", ["x", "e"])], X, 13,
                                   weights={"e": np.array(3, np.int32)}),
    "sum_v6_equal_shapes": Case([node("Sum", ["x", "x", "x"])], X, 7),
    "sum_v13_bcast": Case([node("Sum", ["x", "z", "w"])], XZ, 13, weights={"w": rand(4)}),
    "mean_v8_bcast": Case([node("Mean", ["x", "z", "w"])], XZ, 8, weights={"w": rand(4)}),
    "mean_one": Case([node("Mean", ["x"])], X, 13),
    "max_v12": Case([node("Max", ["x", "z", "w"])], XZ, 12, weights={"w": rand(4)}),
    "max_v6_one": Case([node("Max", ["x"])], X, 7),
    "min_v13": Case([node("Min", ["z", "x"])], XZ, 13),
    "min_v8_weights": Case([node("Min", ["x", "w", "w"])], X, 8, weights={"w": rand(3, 1)}),
    "where_v9_greater": Case([node("Greater", ["x", "z"], ["c"]), node("Where", ["c", "x", "z"])],
                             XZ, 9),
    "where_v16_less": Case([node("Less", ["x", "z"], ["c"]), node("Where", ["c", "z", "x"])],
                           XZ, 16),
    "equal_v13": Case([node("Relu", ["x"], ["r"]), *to_float("Equal", ["r", "x"])], X, 13),
    "greater_v7": Case(to_float("Greater", ["x", "z"], 7), XZ, 7),
    "less_v13": Case(to_float("Less", ["z", "x"]), XZ, 13),
    "cast_int32_truncates": Case([node("Mul", ["x", "k"], ["m"]),
                                  *to_float("Cast", ["m"], to=TensorProto.INT32)], X, 13,
                                 weights={"k": np.array(7.0, np.float32)}),
    "cast_int8_v19": Case([node("Mul", ["x", "k"], ["m"]),
                           *to_float("Cast", ["m"], to=TensorProto.INT8)], X, 19,
                          weights={"k": np.array(20.0, np.float32)}),
    "cast_bool_v9": Case([node("Relu", ["x"], ["r"]),
                          *to_float("Cast", ["r"], to=TensorProto.BOOL)], X, 9),
    "int32_abs_neg_max_pow": Case([
        node("Mul", ["x", "k"], ["m"]), node("Cast", ["m"], ["i"], to=TensorProto.INT32),
        node("Abs", ["i"], ["a"]), node("Neg", ["i"], ["n"]), node("Max", ["a", "n"], ["mx"]),
        node("Pow", ["mx", "e"], ["p"]), node("Cast", ["p"], to=TensorProto.FLOAT)], X, 15,
        weights={"k": np.array(5.0, np.float32), "e": np.array(1.5, np.float32)}),
    "chain": Case([node("Tanh", ["x"], ["t"]), node("Pow", ["t", "e"], ["p"]),
                   node("Max", ["p", "z"], ["m"]), node("PRelu", ["m", "s"], ["q"]),
                   node("HardSwish", ["q"], ["h"]), node("Gelu", ["h"], ["g"]),
                   node("Clip", ["g", "lo", "hi"], ["c"]), node("Softplus", ["c"], ["sp"]),
                   node("Selu", ["sp"])], XZ, 20,
                  weights={"e": np.array(3, np.int64), "s": rand(4, seed=3),
                           "lo": np.array(-0.1, np.float32), "hi": np.array(0.8, np.float32)}),
}


def feeds_for(case: Case) -> dict[str, np.ndarray]:
    return {name: rand(*shape, seed=k + 10) for k, (name, shape) in enumerate(case.inputs.items())}


def check(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)  # NaNs must match too


@pytest.mark.parametrize("name", CASES)
def test_op_matches_onnxruntime(name: str) -> None:
    case = CASES[name]
    model = case.model()
    feeds = feeds_for(case)
    with np.errstate(all="ignore"):
        check(evaluate(import_onnx(model), feeds), run_ort(model, feeds))


def test_clip_bounds_known_at_import_stay_one_clip() -> None:
    """Conv epilogue fusion looks for ``clip``: constant bounds must give one."""
    graph = import_onnx(CASES["clip_v13_min_above_max"].model())
    ((op, attrs),) = [(n.op, n.attrs) for n in graph.ops()]
    assert op == "clip" and attrs["a_min"] == attrs["a_max"] == 0.5
    graph = import_onnx(CASES["clip_v13_computed_bounds"].model())
    assert [n.op for n in graph.ops()][-2:] == ["maximum", "minimum"]


def test_all_constant_inputs_compute_at_import() -> None:
    case = Case([node("Pow", ["a", "b"], ["p"]), node("Max", ["p", "a"], ["m"]),
                 node("Cast", ["m"], ["f"], to=TensorProto.FLOAT), node("Add", ["x", "f"])], X, 15,
                weights={"a": np.array([2, 3, 1, 4], np.int64), "b": np.array(2, np.int64)})
    graph = import_onnx(case.model())
    ((const,),) = [n.inputs[1:] for n in graph.ops() if n.op == "add"]
    assert const.is_const and const.value.tolist() == [4, 9, 1, 16]


@pytest.mark.parametrize("case, words", [
    (Case([node("PRelu", ["x", "s"])], {"x": (3, 1)}, 16, weights={"s": rand(4)}),
     ["PRelu", "prelu_y", "does not broadcast"]),
    (Case([node("Gelu", ["x"], approximate="erf")], X, 20), ["Gelu", "approximate", "'tanh'"]),
    (Case([node("Cast", ["x"], to=TensorProto.INT64)], X, 13), ["Cast", "int64", "bool"]),
    (Case([node("Clip", ["x", "lo"])], X, 13, weights={"lo": rand(2)}), ["Clip", "scalar"]),
    (Case([node("Where", ["x", "x", "x"])], X, 16), ["Where", "condition must be bool"]),
    (Case([node("Pow", ["x", "e"])], X, 15, weights={"e": np.array([2**40], np.int64)}),
     ["Pow", "int32"]),
], ids=["prelu_bidirectional", "gelu_erf", "cast_to_int64", "clip_vector_bound",
        "where_float_condition", "pow_int64_overflow"])
def test_unsupported_forms_are_refused_by_name(case: Case, words: list[str]) -> None:
    message = error(case)
    for word in words:
        assert word in message


DEVICE_CASES = ["selu_v6", "hard_sigmoid_v22", "gelu_tanh", "mish_v22", "erf_v13", "sqrt_nan",
                "prelu_v9_3x1", "clip_v11_min_input", "clip_v13_computed_bounds", "pow_v7",
                "pow_v15_int64_exponent", "mean_v8_bcast", "max_v12", "where_v9_greater",
                "equal_v13", "cast_int32_truncates", "clip_v13_int32_min_only", "cast_int8_v19",
                "cast_bool_v9", "int32_abs_neg_max_pow"]


def side_by_side() -> onnx.ModelProto:
    """One model with every device case side by side: one build, many kernels."""
    nodes, weights, outputs = [], {}, []
    for k, name in enumerate(DEVICE_CASES):
        case = CASES[name]
        rename = {n: f"{n}{k}" for proto in case.nodes for n in (*proto.input, *proto.output)
                  if n and n not in case.inputs}
        for proto in case.nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(proto)
            copy.name = f"{proto.name}{k}"
            copy.input[:] = [rename.get(n, n) for n in proto.input]
            copy.output[:] = [rename.get(n, n) for n in proto.output]
            nodes.append(copy)
        weights.update({rename[n]: v for n, v in case.weights.items()})
        outputs.append(rename["y"])
    return Case(nodes, dict(XZ), 20, outputs=outputs, weights=weights).model()


def test_kernels_match_on_device(device: Device) -> None:
    model = side_by_side()
    feeds = {"x": rand(2, 3, 4, seed=10), "z": rand(3, 1, seed=11)}
    module = build(import_onnx(model), device=device)
    with np.errstate(all="ignore"):
        check(module.run(feeds), run_ort(model, feeds))


@needs_nvcc
def test_kernels_compile_as_cuda(tmp_path: Path) -> None:
    """The same kernels (and the fused chain) through the CUDA prelude, in one nvcc call."""
    sources = []
    for model in (side_by_side(), CASES["chain"].model()):
        for node_ in optimize(import_onnx(model)).ops():
            kernel = lower(node_, "cuda")
            entry = f"{kernel.entry}_{len(sources)}"
            sources.append(kernel.source.replace(f"{kernel.entry}(", f"{entry}("))
    assert any("fused_elementwise" in source for source in sources)
    path = tmp_path / "elementwise.cu"
    path.write_text("\n".join(sources))
    result = nvcc_ptx(path)
    assert result.returncode == 0, result.stderr


def test_chain_fuses_into_one_kernel(device: Device) -> None:
    case = CASES["chain"]
    model = case.model()
    feeds = feeds_for(case)
    module = build(import_onnx(model), device=device)
    assert [n.op for n in module.graph.ops()] == ["fused.elementwise"]
    check(module.run(feeds), run_ort(model, feeds))


def test_nan_and_inf_follow_numpy_on_device(device: Device) -> None:
    """max / min propagate NaN (C's fmax would drop it); softplus does not overflow."""
    case = Case([node("Max", ["x", "z"], ["m"]), node("Min", ["x", "z"], ["n"]),
                 node("Softplus", ["x"], ["s"]), node("HardSigmoid", ["x"], ["h"])],
                {"x": (6,), "z": (6,)}, 13, outputs=("m", "n", "s", "h"))
    x = np.array([np.nan, 1.0, 200.0, -200.0, np.inf, -np.inf], np.float32)
    z = np.array([0.0, np.nan, 0.0, 0.0, 0.0, 0.0], np.float32)
    got = build(import_onnx(case.model()), device=device).run({"x": x, "z": z})
    check(got, run_ort(case.model(), {"x": x, "z": z}))
    assert np.isnan(got[0][:2]).all() and np.isnan(got[1][:2]).all()
    assert got[2][2] == np.float32(200.0) and got[2][3] == 0.0

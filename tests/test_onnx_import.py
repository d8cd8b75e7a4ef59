"""The ONNX import as a whole: which opsets and domains it takes, how a refusal reads
(every bad node in one message, each with its operator version and the model's opset),
and graph inputs bound as constants."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend import FrontendError, import_onnx
from compiler.frontend.onnx import MAX_OPSET, MIN_OPSET, SUPPORTED_OPS
from compiler.ir import evaluate


def model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], opset: int,
          outputs: tuple[str, ...] = ("y",), extra_opsets: tuple[tuple[str, int], ...] = (),
          initializers: dict[str, np.ndarray] | None = None,
          input_types: dict[str, int] | None = None) -> onnx.ModelProto:
    types = input_types or {}
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(k, types.get(k, TensorProto.FLOAT), s)
         for k, s in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v)
                                                  for d, v in extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, ir_version=onnx.IR_VERSION)


def test_opsets_from_7_to_the_newest_onnx_defines() -> None:
    assert MIN_OPSET == 7 and MAX_OPSET == onnx.defs.onnx_opset_version()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    for opset in range(MIN_OPSET, MAX_OPSET + 1):
        graph = import_onnx(model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)},
                                  opset))
        (got,) = evaluate(graph, [x])
        np.testing.assert_array_equal(got, np.maximum(x, 0))


@pytest.mark.parametrize("opset", [6, MAX_OPSET + 1])
def test_an_opset_out_of_range_is_one_line_naming_it(opset: int) -> None:
    with pytest.raises(FrontendError) as info:
        import_onnx(model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, opset))
    message = str(info.value)
    assert "\n" not in message
    assert f"opset {opset}" in message and f"{MIN_OPSET} to {MAX_OPSET}" in message


def test_a_custom_domain_node_is_one_line_naming_the_domain() -> None:
    nodes = [helper.make_node("FusedConv", ["x"], ["y"], "fc", domain="com.microsoft")]
    with pytest.raises(FrontendError) as info:
        import_onnx(model(nodes, {"x": (2, 3)}, 13, extra_opsets=(("com.microsoft", 1),)))
    message = str(info.value)
    assert "\n" not in message
    assert "com.microsoft" in message and "FusedConv" in message and "'fc'" in message


def test_every_unsupported_node_is_listed_in_one_error() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], "ok"),
        helper.make_node("Hardmax", ["a"], ["b"], "first_bad"),
        helper.make_node("Relu", ["b"], ["c"], "after_first_bad"),  # reads a failed value
        helper.make_node("Einsum", ["a"], ["d"], "second_bad", equation="ij->ji"),
        helper.make_node("MaxPool", ["x4"], ["e"], "third_bad", kernel_shape=[2, 2],
                         storage_order=1),
        helper.make_node("Add", ["c", "a"], ["y"], "ok_too"),
    ]
    with pytest.raises(FrontendError) as info:
        import_onnx(model(nodes, {"x": (2, 3), "x4": (1, 1, 4, 4)}, 17))
    lines = str(info.value).splitlines()
    assert lines[0] == "3 nodes cannot be imported (default domain opset 17):"
    assert len(lines) == 5
    assert lines[1] == "  Hardmax-13 node 'first_bad' (opset 17): not supported"
    assert lines[4].startswith("supported operators: ")
    assert all(op in lines[4].split(": ")[1].split(", ") for op in ("Conv", "Resize", "Slice"))
    assert "Einsum-12 node 'second_bad' (opset 17)" in lines[2]
    assert "MaxPool-12 node 'third_bad' (opset 17)" in lines[3] and "storage_order" in lines[3]
    assert "after_first_bad" not in str(info.value)  # it only repeats the first error


def test_supported_ops_cover_the_cnn_set() -> None:
    for op in ("Conv", "Gemm", "MatMul", "Relu", "Add", "Concat", "Reshape", "MaxPool",
               "BatchNormalization", "Softmax", "Gather", "Shape"):
        assert op in SUPPORTED_OPS


def test_a_shape_fed_as_an_input_can_be_bound() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], "r")]
    onnx_model = model(nodes, {"x": (2, 3), "shape": (2,)}, 13,
                       input_types={"shape": TensorProto.INT64})
    with pytest.raises(FrontendError) as info:
        import_onnx(onnx_model)  # an INT64 graph input cannot be a runtime input
    assert "INT64" in str(info.value)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph = import_onnx(onnx_model, constants={"shape": np.array([3, 2])})
    assert [i.name for i in graph.inputs] == ["x"]
    (got,) = evaluate(graph, [x])
    np.testing.assert_array_equal(got, x.reshape(3, 2))


def test_the_error_names_graph_inputs_needed_at_import_time() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], "r")]
    onnx_model = model(nodes, {"x": (2, 3), "shape": (2,)}, 13)  # a float32 "shape"
    with pytest.raises(FrontendError) as info:
        import_onnx(onnx_model)
    assert info.value.needs_constant == {"shape"}
    assert "constants=" in str(info.value) and "'shape'" in str(info.value)

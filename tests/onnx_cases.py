"""Hand-made one-graph ONNX models for the frontend's tests, and onnxruntime to compare
with: the shared vocabulary of tests/test_frontend_onnx.py and tests/test_onnx_*.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend import FrontendError, import_onnx
from compiler.ir import evaluate


@dataclass
class Case:
    """A one-graph model: its nodes, float inputs (name -> shape), opset, outputs, weights."""

    nodes: list[onnx.NodeProto]
    inputs: dict[str, tuple[int, ...]]
    opset: int
    outputs: Sequence[str] = ("y",)
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def model(self) -> onnx.ModelProto:
        return model(self.nodes, self.inputs, self.opset, self.weights, self.outputs)

    def feeds(self, seed: int = 10) -> dict[str, np.ndarray]:
        """Standard-normal float32 inputs, one seed per input."""
        return {name: rand(*shape, seed=seed + k)
                for k, (name, shape) in enumerate(self.inputs.items())}


def model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], opset: int,
          weights: dict[str, np.ndarray] | None = None, outputs: Sequence[str] = ("y",),
          bool_outputs: Sequence[str] = ()) -> onnx.ModelProto:
    """Float inputs and outputs (``bool_outputs`` BOOL), weights as initializers."""
    def info(name: str, shape: tuple[int, ...] | None) -> onnx.ValueInfoProto:
        elem = TensorProto.BOOL if name in bool_outputs else TensorProto.FLOAT
        return helper.make_tensor_value_info(name, elem, shape)

    graph = helper.make_graph(
        list(nodes), "case", [info(k, s) for k, s in inputs.items()],
        [info(k, None) for k in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (weights or {}).items()])
    opsets = [helper.make_opsetid("", opset)]
    try:
        ir_version = helper.find_min_ir_version_for(opsets)
    except ValueError:  # an opset this onnx does not know: the newest IR version
        ir_version = onnx.IR_VERSION
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def node(op: str, inputs: Sequence[str], outputs: Sequence[str] = ("y",), **attrs: object
         ) -> onnx.NodeProto:
    """A node named ``<op>_0`` (one node per op in a case)."""
    return helper.make_node(op, list(inputs), list(outputs), name=f"{op.lower()}_0", **attrs)


def named_node(op: str, inputs: Sequence[str], outputs: Sequence[str] = ("y",),
               **attrs: object) -> onnx.NodeProto:
    """A node named after its op and first output (for cases with several of one op)."""
    return helper.make_node(op, list(inputs), list(outputs),
                            name=f"{op.lower()}_{outputs[0]}", **attrs)


def run_ort(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_imports_like_onnxruntime(case: Case) -> None:
    """The imported graph, run by the numpy interpreter, computes onnxruntime's outputs."""
    model, feeds = case.model(), case.feeds()
    graph = import_onnx(model)
    got = evaluate(graph, feeds)
    want = run_ort(model, feeds)
    assert len(got) == len(want)
    for out, g, w in zip(graph.outputs, got, want):
        assert out.ty.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def error(case: Case) -> str:
    """The FrontendError's message for a case the import must refuse."""
    with pytest.raises(FrontendError) as info:
        import_onnx(case.model())
    return str(info.value)

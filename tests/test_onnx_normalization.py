"""Reductions, softmax / log-softmax and the normalizations: each ONNX operator version
(axes as attribute or input, empty axes, old and new softmax semantics, optional
outputs) imported and interpreted agrees with onnxruntime, forms the IR cannot express
are refused by name, and the kernels compute the same on the device."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_nvcc, nvcc_ptx
from onnx_cases import (
    Case,
    assert_imports_like_onnxruntime,
    error,
    ints,
    node,
    rand,
    run_ort,
)

from compiler.build_module import build
from compiler.frontend import import_onnx
from compiler.ir import GraphBuilder, IRError, evaluate
from compiler.kernels import lower
from compiler.runtime import Device

X4 = {"x": (2, 3, 4, 5)}
PARAMS = {name: rand(3, seed=k) for k, name in enumerate(("g", "b", "m"))}
PARAMS["v"] = np.abs(rand(3, seed=3)) + 0.5
# batch norm version 7's spatial=0: statistics per activation, shaped like one sample
PER_ACTIVATION = {name: rand(3, 4, seed=k) for k, name in enumerate(("g", "b", "m"))}
PER_ACTIVATION["v"] = np.abs(rand(3, 4, seed=3)) + 0.5

CASES: dict[str, Case] = {
    "sum_v1_axes_attr": Case([node("ReduceSum", ["x"], axes=[1, 3], keepdims=0)], X4, 11),
    "sum_v1_all_axes": Case([node("ReduceSum", ["x"])], X4, 9),
    "sum_v13_axes_input_negative": Case([node("ReduceSum", ["x", "a"])], X4, 13,
                                        weights={"a": ints(-1, 0)}),
    "sum_v13_no_axes_all": Case([node("ReduceSum", ["x"], keepdims=0)], X4, 13),
    "sum_v13_noop_empty_axes": Case([node("ReduceSum", ["x"], noop_with_empty_axes=1)], X4, 13),
    "mean_v11_negative": Case([node("ReduceMean", ["x"], axes=[-2])], X4, 11),
    "mean_v18_axes_input": Case([node("ReduceMean", ["x", "a"], keepdims=0)], X4, 18,
                                weights={"a": ints(2, 1)}),
    "max_v12_axes_attr": Case([node("ReduceMax", ["x"], axes=[0, 2])], X4, 12),
    "max_v20_axes_input": Case([node("ReduceMax", ["x", "a"])], X4, 20,
                               weights={"a": ints(3)}),
    "global_max_pool_4d": Case([node("GlobalMaxPool", ["x"])], X4, 13),
    "global_max_pool_3d": Case([node("GlobalMaxPool", ["x"])], {"x": (2, 3, 7)}, 22),
    "softmax_v11_axis0_coerced": Case([node("Softmax", ["x"], axis=0)], {"x": (2, 3, 4)}, 11),
    "log_softmax_v11_default": Case([node("LogSoftmax", ["x"])], X4, 11),
    "log_softmax_v11_last": Case([node("LogSoftmax", ["x"], axis=-1)], {"x": (2, 3, 4)}, 9),
    "log_softmax_v13_axis1": Case([node("LogSoftmax", ["x"], axis=1)], X4, 13),
    "batch_norm_v7_spatial": Case([node("BatchNormalization", ["x", "g", "b", "m", "v"],
                                        spatial=1, epsilon=1e-3)], X4, 7, weights=PARAMS),
    "batch_norm_v7_per_activation": Case(
        [node("BatchNormalization", ["x", "g", "b", "m", "v"], spatial=0)], {"x": (2, 3, 4)}, 7,
        weights=PER_ACTIVATION),
    "batch_norm_v9_2d": Case([node("BatchNormalization", ["x", "g", "b", "m", "v"])],
                             {"x": (4, 3)}, 9, weights=PARAMS),
    "batch_norm_v15_inference": Case([node("BatchNormalization", ["x", "g", "b", "m", "v"],
                                           training_mode=0)], X4, 15, weights=PARAMS),
    "instance_norm_v6": Case([node("InstanceNormalization", ["x", "g", "b"], epsilon=1e-2)],
                             X4, 9, weights=PARAMS),
    "instance_norm_v22_3d": Case([node("InstanceNormalization", ["x", "g", "b"])],
                                 {"x": (2, 3, 6)}, 22, weights=PARAMS),
    "layer_norm_axis1_stats": Case(
        [node("LayerNormalization", ["x", "s", "c"], ["y", "mean", "inv"], axis=1)], X4, 17,
        outputs=("y", "mean", "inv"),
        weights={"s": rand(3, 4, 5, seed=4), "c": rand(3, 4, 5, seed=5)}),
    "layer_norm_default_no_bias": Case([node("LayerNormalization", ["x", "s"], epsilon=1e-2)],
                                       X4, 17, weights={"s": rand(5, seed=6)}),
}


def feeds_for(case: Case) -> dict[str, np.ndarray]:
    return {name: rand(*shape, seed=k + 10) for k, (name, shape) in enumerate(case.inputs.items())}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_op_matches_onnxruntime(case: Case) -> None:
    assert_imports_like_onnxruntime(case)


def test_constant_reduction_is_computed_at_import() -> None:
    case = Case([node("ReduceSum", ["w", "a"], ["s"]), node("Add", ["x", "s"])],
                {"x": (4,)}, 13, weights={"w": rand(3, 4), "a": ints(0)})
    graph = import_onnx(case.model())
    assert [n.op for n in graph.ops()] == ["add"]


def test_empty_set_reductions_give_the_identity() -> None:
    """Over a zero-length axis: sum 0, max -inf, mean NaN (0 / 0), as ONNX's reference."""
    empty = np.zeros((2, 0, 4), np.float32)
    for op, want in (("ReduceSum", 0.0), ("ReduceMax", -np.inf), ("ReduceMean", np.nan)):
        case = Case([node(op, ["w", "a"], ["r"]), node("Identity", ["r"])], {}, 18,
                    weights={"w": empty, "a": ints(1)})
        (got,) = evaluate(import_onnx(case.model()), {})
        assert got.shape == (2, 1, 4)
        np.testing.assert_array_equal(got, np.full((2, 1, 4), want, np.float32))


@pytest.mark.parametrize("case, words", [
    (Case([node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y", "rm", "rv"],
                training_mode=1)], X4, 15, outputs=("y", "rm", "rv"), weights=PARAMS),
     ["BatchNormalization", "training_mode=1", "inference"]),
    (Case([node("LayerNormalization", ["x", "s"], stash_type=11)], X4, 17,
          weights={"s": rand(5)}), ["LayerNormalization", "stash_type=11"]),
    (Case([node("GlobalMaxPool", ["x"])], {"x": (2, 3)}, 13), ["GlobalMaxPool", "spatial"]),
    (Case([node("ReduceSum", ["x"], axes=[4])], X4, 11), ["ReduceSum", "axis 4"]),
], ids=["batch_norm_training", "layer_norm_stash_type", "global_max_pool_2d", "bad_axis"])
def test_unsupported_forms_are_refused_by_name(case: Case, words: list[str]) -> None:
    message = error(case)
    for word in words:
        assert word in message


def test_reduce_takes_float32_only() -> None:
    """The kernel accumulates in C float: integer data would lose what numpy keeps."""
    b = GraphBuilder()
    x = b.input("x", (3, 4), "int32")
    with pytest.raises(IRError, match="expects float32 data, got int32"):
        b.call("reduce", [x], kind="sum", axes=(1,))


@pytest.mark.parametrize("name", ["sum_v1_axes_attr", "max_v12_axes_attr", "mean_v11_negative",
                                  "sum_v13_no_axes_all", "global_max_pool_3d",
                                  "log_softmax_v13_axis1", "softmax_v11_axis0_coerced",
                                  "layer_norm_axis1_stats", "instance_norm_v6",
                                  "batch_norm_v7_per_activation"])
def test_kernels_match_on_device(name: str, device: Device) -> None:
    case = CASES[name]
    model = case.model()
    feeds = feeds_for(case)
    got = build(import_onnx(model), device=device).run(feeds)
    for g, w in zip(got, run_ort(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_max_kernel_propagates_nan(device: Device) -> None:
    case = CASES["max_v12_axes_attr"]
    x = feeds_for(case)["x"]
    x[1, 2, 3, 4] = np.nan
    (got,) = build(import_onnx(case.model()), device=device).run({"x": x})
    want = np.max(x, axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert np.isnan(got[0, 2, 0, 4])


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "prod"])
def test_every_reduce_kind_on_device(kind: str, device: Device) -> None:
    """The IR's kinds beyond ONNX's three in scope (min, prod) included."""
    b = GraphBuilder()
    x = b.input("x", (3, 4, 5, 2))
    graph = b.finish([b.call("reduce", [x], kind=kind, axes=(0, 2), keepdims=False)])
    feeds = {"x": rand(3, 4, 5, 2)}
    (want,) = evaluate(graph, feeds)
    (got,) = build(graph, device=device).run(feeds)
    assert got.shape == (4, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@needs_nvcc
def test_cuda_sources_compile_with_nvcc(tmp_path: Path) -> None:
    """Every reduction kind and both softmaxes, in one .cu file (entries renamed apart)."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4, 5))
    nodes = [b.call("reduce", [x], kind=kind, axes=(1, 3), keepdims=False)
             for kind in ("sum", "mean", "max", "min", "prod")]
    nodes += [b.call(op, [x], axis=1) for op in ("nn.softmax", "nn.log_softmax")]
    sources = []
    for i, n in enumerate(nodes):
        kernel = lower(n, "cuda")
        sources.append(re.sub(rf"\b{kernel.entry}\b", f"{kernel.entry}_{i}", kernel.source))
    path = tmp_path / "kernels.cu"
    path.write_text("\n".join(sources))
    proc = nvcc_ptx(path, timeout=300)
    assert proc.returncode == 0, proc.stderr[:4000]
    assert len(re.findall(r"\.entry\s+\w+", path.with_suffix(".ptx").read_text())) == len(nodes)

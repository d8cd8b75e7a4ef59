"""ONNX tensor and data-movement operators (Slice, Split, Pad, Expand, Tile, Gather, Shape,
Constant...) in each of their opset forms: imported and run by the numpy interpreter they
agree with onnxruntime, a sample of them runs on the device, shape arithmetic on
constants folds at import, and what the IR cannot express is refused by name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_cases import Case, assert_imports_like_onnxruntime, error, ints, run_ort
from onnx_cases import named_node as node

from compiler.build_module import build
from compiler.frontend import FrontendError, import_onnx
from compiler.ir import GraphBuilder, evaluate
from compiler.runtime import Device

X = {"x": (3, 4, 5)}
BIG = 2**62


def slice10(opset: int, starts: Sequence[int], ends: Sequence[int],
            axes: Sequence[int] | None = None, steps: Sequence[int] | None = None) -> Case:
    weights = {"s": ints(*starts), "e": ints(*ends)}
    names = ["x", "s", "e"]
    if axes is not None:
        weights["a"] = ints(*axes)
    names.append("a" if axes is not None else "")
    if steps is not None:
        weights["t"] = ints(*steps)
        names.append("t")
    return Case([node("Slice", names)], X, opset, weights=weights)


def pad(opset: int, mode: str, pads: Sequence[int], axes: Sequence[int] | None = None,
        value: float | None = None) -> Case:
    weights = {"p": ints(*pads)}
    names = ["x", "p"]
    if value is not None:
        weights["v"] = np.array(value, dtype=np.float32)
    if axes is not None:
        weights["a"] = ints(*axes)
        names += ["v" if value is not None else "", "a"]
    elif value is not None:
        names.append("v")
    return Case([node("Pad", names, mode=mode)], {"x": (2, 3, 4)}, opset, weights=weights)


def split(opset: int, outputs: int, sizes: Sequence[int] | None = None, **attrs: object
          ) -> Case:
    names = [f"y{k}" for k in range(outputs)]
    weights = {} if sizes is None or opset < 13 else {"s": ints(*sizes)}
    if sizes is not None and opset < 13:
        attrs["split"] = list(sizes)
    inputs = ["x", "s"] if weights else ["x"]
    return Case([node("Split", inputs, names, **attrs)], {"x": (3, 7, 2)}, opset, weights=weights, outputs=names)


def gather(indices: np.ndarray, axis: int, opset: int = 13) -> Case:
    return Case([node("Gather", ["x", "i"], axis=axis)], X, opset, weights={"i": indices})


CASES: dict[str, Case] = {
    "slice_opset9_attrs": Case([node("Slice", ["x"], starts=[1, -3], ends=[BIG, -1],
                                     axes=[0, 2])], X, 9),
    "slice_opset9_default_axes": Case([node("Slice", ["x"], starts=[0, 1], ends=[2, 3])], X, 9),
    "slice_opset10": slice10(10, [1], [3], [1]),
    "slice_negative_steps": slice10(13, [-1, 3], [-BIG, 0], [2, 1], [-2, -1]),
    "slice_out_of_range": slice10(13, [-100, 2], [100, 1000], [0, -1], [1, 1]),
    "slice_back_from_past_end": slice10(11, [100], [-100], [1], [-3]),
    # stepping back, a start before the front is clamped to 0 (onnx's numpy reference
    # slices nothing here; the spec and onnxruntime take element 0)
    "slice_back_from_before_front": slice10(13, [-10], [-BIG], [1], [-1]),
    "slice_default_axes_steps": slice10(13, [0, 1, 1], [2, 4, 5]),
    "slice_empty": Case([node("Slice", ["x", "s", "e"], ["z"]), node("Concat", ["x", "z"],
                                                                     axis=0)],
                        X, 13, weights={"s": ints(2), "e": ints(1)}),
    "split_opset7_attr": split(7, 3, [1, 4, 2], axis=1),
    "split_opset11_negative_axis": split(11, 2, [1, 1], axis=-1),
    "split_opset13_input": split(13, 3, [2, 0, 5], axis=1),
    "split_opset13_equal": split(13, 3, axis=0),
    "split_opset18_uneven": split(18, 3, axis=1, num_outputs=3),
    "split_opset18_sizes": split(18, 2, [3, 4], axis=1),
    "pad_opset7_reflect": Case([node("Pad", ["x"], mode="reflect", pads=[0, 2, 1, 0, 1, 3])],
                               {"x": (2, 3, 4)}, 7),
    "pad_opset2_edge_value": Case([node("Pad", ["x"], mode="edge", pads=[1, 0, 2, 1, 2, 0])],
                                  {"x": (2, 3, 4)}, 10),
    "pad_opset11_constant": pad(11, "constant", [0, 1, 2, 1, 0, 3], value=2.5),
    "pad_opset11_reflect": pad(11, "reflect", [1, 2, 3, 1, 2, 3]),
    "pad_opset13_edge": pad(13, "edge", [1, 4, 0, 0, 2, 5]),
    "pad_negative_crops": pad(13, "constant", [-1, 1, -2, 0, -1, 1], value=-1.0),
    "pad_reflect_crop": pad(13, "reflect", [0, -1, 2, 1, 0, -1]),
    "pad_opset18_axes": pad(18, "edge", [2, -1, 1, 3], axes=[-1, 1]),
    "pad_opset19_constant_axes": pad(19, "constant", [1, 2], axes=[0], value=4.0),
    "pad_opset19_wrap": pad(19, "wrap", [1, 2, 3, 1, 0, 2]),
    "pad_opset21_wrap_axes_crop": pad(21, "wrap", [3, -1, 0, 2], axes=[2, 0]),
    "expand_opset8_bidirectional": Case([node("Expand", ["x", "s"])], {"x": (3, 1)}, 8,
                                        weights={"s": ints(2, 1, 4)}),
    "expand_same_shape": Case([node("Expand", ["x", "s"])], {"x": (3, 4)}, 13,
                              weights={"s": ints(1, 1)}),
    "expand_lower_rank_target": Case([node("Expand", ["x", "s"])], {"x": (2, 1, 1)}, 13,
                                     weights={"s": ints(3, 5)}),
    "tile_opset7": Case([node("Tile", ["x", "r"])], {"x": (2, 3)}, 7, weights={"r": ints(3, 2)}),
    "tile_opset13_ones": Case([node("Tile", ["x", "r"])], X, 13, weights={"r": ints(1, 2, 1)}),
    "gather_axis0_scalar": gather(np.array(-1, dtype=np.int64), 0),
    "gather_axis1_matrix": gather(np.array([[0, 3], [-1, 1], [2, 2]], dtype=np.int64), 1, 11),
    "gather_last_axis": gather(ints(4, 0, -2), -1, 7),
    "gather_int32_indices": gather(np.array([1, 2], dtype=np.int32), 2),
    "shape_start_end": Case([node("Shape", ["x"], ["s"], start=-2, end=10),
                             node("Cast", ["s"], to=TensorProto.FLOAT)], X, 15),
    "constant_of_shape_expand": Case([
        node("Shape", ["x"], ["s"]),
        node("ConstantOfShape", ["s"], ["c"],
             value=numpy_helper.from_array(np.array([1.5], dtype=np.float32))),
        node("Add", ["x", "c"])], X, 13),
    "constant_forms": Case([
        node("Constant", [], ["a"], value_float=2.0),
        node("Constant", [], ["b"], value_floats=[1.0, 2.0, 3.0, 4.0, 5.0]),
        node("Constant", [], ["i"], value_ints=[1]),
        node("Constant", [], ["j"], value_int=0),
        node("Mul", ["x", "a"], ["m"]), node("Add", ["m", "b"], ["n"]),
        node("Unsqueeze", ["n", "i"], ["u"]), node("Squeeze", ["u", "i"], ["w"]),
        node("Gather", ["w", "j"], axis=0)], X, 13),
    "identity_of_slice": Case([node("Slice", ["x", "s", "e"], ["z"]),
                               node("Identity", ["z"])], X, 14, weights={"s": ints(1), "e": ints(3)}),
}

ON_DEVICE = ["slice_negative_steps", "slice_opset9_attrs", "slice_empty", "split_opset13_input",
             "split_opset18_uneven", "pad_opset7_reflect", "pad_opset13_edge", "pad_reflect_crop",
             "pad_opset19_wrap", "expand_opset8_bidirectional", "tile_opset7",
             "gather_axis1_matrix", "gather_last_axis"]


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_onnxruntime(name: str) -> None:
    assert_imports_like_onnxruntime(CASES[name])


@pytest.mark.parametrize("name", ON_DEVICE)
def test_op_runs_on_the_device(device: Device, name: str) -> None:
    case = CASES[name]
    model = case.model()
    feeds = case.feeds()
    module = build(import_onnx(model), device=device)
    for g, w in zip(module.run(feeds), run_ort(model, feeds), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["reflect", "wrap"])
def test_pads_wider_than_the_input_repeat_like_numpy(device: Device, mode: str) -> None:
    case = pad(19, mode, [0, 0, 7, 0, 1, 6])
    feeds = case.feeds()
    (got,) = build(import_onnx(case.model()), device=device).run(feeds)
    np.testing.assert_array_equal(got, np.pad(feeds["x"], ((0, 0), (0, 1), (7, 6)), mode=mode))


def test_shape_arithmetic_folds_at_import() -> None:
    """PyTorch-style shape chains (Shape, Gather, Slice, Split, Tile, Concat) on constants
    are evaluated at import: only the runtime data's reshape and broadcast remain."""
    case = Case([
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n", "axes"], ["n1"]),
        node("Slice", ["s", "one", "big"], ["rest"]),
        node("Concat", ["n1", "minus"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["r"]),
        node("Split", ["rest"], ["h", "w"], axis=0, num_outputs=2),
        node("Mul", ["h", "w"], ["hw"]),
        node("Tile", ["two", "two"], ["lead"]),
        node("Concat", ["lead", "n1", "hw"], ["big_shape"], axis=0),
        node("Expand", ["r", "big_shape"]),
    ], X, 18, weights={"zero": np.array(0, dtype=np.int64), "axes": ints(0), "one": ints(1),
               "big": ints(BIG), "minus": ints(-1), "two": ints(2)})
    graph = import_onnx(case.model())
    ops = [n.op for n in graph.ops()]
    assert set(ops) == {"reshape", "broadcast_to"} and graph.outputs[0].ty.shape == (2, 2, 3, 20)
    feeds = case.feeds()
    np.testing.assert_allclose(evaluate(graph, feeds)[0], run_ort(case.model(), feeds)[0])


def test_gather_of_runtime_data_is_a_take_and_of_constants_an_array() -> None:
    graph = import_onnx(CASES["gather_axis1_matrix"].model())
    (take,) = graph.ops()
    indices = take.inputs[1]
    assert take.op == "take" and indices.ty.dtype == "int32"
    np.testing.assert_array_equal(indices.value, [[0, 3], [3, 1], [2, 2]])
    folded = Case([node("Gather", ["w", "i"], ["g"], axis=1), node("Add", ["x", "g"])],
                  {"x": (2,)}, 13, weights={"w": np.arange(6, dtype=np.float32).reshape(2, 3)
                                    .astype(np.int64), "i": np.array(-1, dtype=np.int64)})
    with pytest.raises(FrontendError, match="int64"):  # the fold happened: Add saw int64
        import_onnx(folded.model())




@pytest.mark.parametrize("case, words", [
    (pad(19, "symmetric", [1, 1, 0, 0, 0, 0]), ["Pad", "pad_y", "symmetric", "wrap"]),
    (Case([node("Constant", [], ["c"], sparse_value=helper.make_sparse_tensor(
        numpy_helper.from_array(np.ones(1, np.float32)), numpy_helper.from_array(ints(0)),
        [3])), node("Add", ["x", "c"])], {"x": (3,)}, 13), ["Constant", "sparse_value"]),
    (slice10(13, [0], [2], [0], [0]), ["Slice", "steps must not be 0"]),
    (slice10(13, [0, 0], [2, 2], [1, -2], [1, 1]), ["Slice", "repeat"]),
    (split(13, 2, [3, 3], axis=1), ["Split", "does not add up"]),
    (Case([node("Expand", ["x", "s"])], {"x": (3, 2)}, 13, weights={"s": ints(4, 3)}),
     ["Expand", "cannot broadcast"]),
    (gather(ints(5), 1), ["Gather", "indices must lie in [-4, 4)"]),
    (Case([node("Tile", ["x", "r"])], X, 13, weights={"r": ints(2, 2)}), ["Tile", "one count"]),
], ids=["pad_unknown_mode", "sparse_constant", "slice_step_0", "slice_repeated_axis",
        "split_bad_sizes", "expand_bad_shape", "gather_out_of_range", "tile_bad_repeats"])
def test_unsupported_forms_are_refused_by_name(case: Case, words: list[str]) -> None:
    message = error(case)
    for word in words:
        assert word in message


@pytest.mark.parametrize("dtype", ["int8", "int32", "bool"])
def test_movement_kernels_move_any_dtype(device: Device, dtype: str) -> None:
    """Quantized values and masks go through transpose, pad (constant and reflect),
    slice, concatenate, tile and take on the device exactly as numpy moves them."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4), dtype)
    t = b.call("transpose", [x], "t", axes=(0, 2, 1))
    p = b.call("nn.pad", [t], "p", pad_width=((0, 0), (1, 1), (0, 2)), pad_mode="reflect")
    q = b.call("nn.pad", [p], "q", pad_width=((0, 0), (0, 0), (1, 0)), pad_value=1.0)
    s = b.call("strided_slice", [q], "s", begin=(0, 0, 0), end=(2, 6, 6), strides=(1, 2, 1))
    c = b.call("concatenate", [s, s], "c", axis=0)
    r = b.call("tile", [c], "r", reps=(1, 2, 1))
    g = b.call("take", [r, b.const(np.array([5, 0, 2], np.int32))], "g", axis=2)
    graph = b.finish([g])
    rng = np.random.default_rng(3)
    high = 2 if dtype == "bool" else 100
    data = rng.integers(-high + (dtype == "bool") * high, high, (2, 3, 4)).astype(dtype)
    (want,) = evaluate(graph, [data])
    (got,) = build(graph, device=device).run([data])
    assert got.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)

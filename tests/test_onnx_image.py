"""Resize / Upsample, DepthToSpace and SpaceToDepth: every operator version and sampling
option, imported and interpreted, agrees with ONNX's reference (onnxruntime where the
reference has no opinion: Resize-10, Upsample); what cannot be imported is refused by
name; the resize kernel computes the same on the device."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import Case, error, ints, node, rand, run_ort

from compiler.build_module import build
from compiler.frontend import FrontendError, import_onnx
from compiler.ir import evaluate
from compiler.runtime import Device

X = {"x": (2, 3, 5, 7)}


def floats(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def resize(opset: int = 19, scales: np.ndarray | None = None, sizes: np.ndarray | None = None,
           roi: np.ndarray | None = None, inputs: dict[str, tuple[int, ...]] = X,
           **attrs: object) -> Case:
    """A Resize reading its roi / scales / sizes from initializers ("" when omitted);
    version 10 takes only the scales."""
    given = {"scales": scales} if opset == 10 else {"roi": roi, "scales": scales, "sizes": sizes}
    names = ["x", *(name if value is not None else "" for name, value in given.items())]
    while not names[-1]:
        names.pop()
    weights = {k: v for k, v in given.items() if v is not None}
    return Case([node("Resize", names, **attrs)], inputs, opset, weights=weights)


UP, DOWN, MIXED = floats(1, 1, 2, 3), floats(1, 1, 0.6, 0.4), floats(1, 1.5, 1.7, 0.6)
ROI = floats(0, 0, 0.1, -0.2, 1, 1, 0.8, 1.3)  # the last axis reaches outside the input

# Resize-11 and later, checked against ONNX's reference
REFERENCE: dict[str, Case] = {
    "nearest_up_default": resize(scales=UP),
    "nearest_down_round_prefer_ceil": resize(scales=DOWN, nearest_mode="round_prefer_ceil"),
    "nearest_floor_align_corners": resize(sizes=ints(2, 3, 9, 4), nearest_mode="floor",
                                          coordinate_transformation_mode="align_corners"),
    "nearest_ceil_asymmetric_batch_axes": resize(scales=MIXED, nearest_mode="ceil",
                                                 coordinate_transformation_mode="asymmetric"),
    "linear_half_pixel_v11": resize(11, roi=floats(), scales=MIXED, mode="linear"),
    "linear_sizes_v11": resize(11, roi=floats(), scales=floats(), sizes=ints(2, 3, 8, 3),
                               mode="linear"),
    "linear_pytorch_half_pixel_one_output": resize(
        13, sizes=ints(2, 3, 1, 9), mode="linear",
        coordinate_transformation_mode="pytorch_half_pixel"),
    "linear_half_pixel_symmetric": resize(
        scales=floats(1, 1, 1.3, 0.7), mode="linear",
        coordinate_transformation_mode="half_pixel_symmetric"),
    "linear_antialias_down": resize(18, scales=DOWN, mode="linear", antialias=1),
    "cubic_up": resize(13, scales=UP, mode="cubic"),
    "cubic_exclude_outside_a_half": resize(scales=MIXED, mode="cubic", exclude_outside=1,
                                           cubic_coeff_a=-0.5),
    "cubic_antialias_sizes": resize(sizes=ints(2, 3, 3, 2), mode="cubic", antialias=1),
    "cubic_align_corners_down": resize(scales=DOWN, mode="cubic",
                                       coordinate_transformation_mode="align_corners"),
    "tf_crop_and_resize_linear": resize(roi=ROI, sizes=ints(2, 3, 4, 6), mode="linear",
                                        coordinate_transformation_mode="tf_crop_and_resize",
                                        extrapolation_value=-7.5),
    "tf_crop_and_resize_nearest_scales": resize(
        roi=ROI, scales=floats(1, 1, 1.7, 0.9), nearest_mode="round_prefer_ceil",
        coordinate_transformation_mode="tf_crop_and_resize"),
    "tf_crop_and_resize_cubic_axes": resize(
        18, roi=floats(0.6, -0.1, 0.9, 1.2), sizes=ints(5, 3), axes=[3, 2], mode="cubic",
        coordinate_transformation_mode="tf_crop_and_resize"),
    "axes_scales": resize(18, scales=floats(2.5, 0.5), axes=[3, 1], mode="linear"),
    "not_larger": resize(18, sizes=ints(9, 9), axes=[2, 3], keep_aspect_ratio_policy="not_larger"),
    "not_smaller": resize(19, sizes=ints(9, 9), axes=[2, 3], mode="linear",
                          keep_aspect_ratio_policy="not_smaller"),
    "three_d": resize(scales=floats(1, 2.5, 0.5), mode="cubic", inputs={"x": (2, 4, 6)}),
}

# what the reference does not define: checked against onnxruntime
ORT: dict[str, Case] = {
    "resize_v10_nearest_up": resize(10, scales=floats(1, 1, 2.5, 1.7)),
    "resize_v10_nearest_down": resize(10, scales=floats(1, 1, 0.6, 0.7)),
    "resize_v10_linear_mixed": resize(10, scales=floats(1, 1, 1.5, 0.6), mode="linear"),
    "resize_v11_tf_half_pixel_for_nn": resize(
        11, roi=floats(), scales=floats(1, 1, 1.6, 2.0),
        coordinate_transformation_mode="tf_half_pixel_for_nn"),
    "resize_v18_negative_axes": resize(18, scales=floats(0.5, 2.5), axes=[-2, -1],
                                       mode="linear"),
    "upsample_v7_nearest": Case([node("Upsample", ["x"], scales=[1.0, 1.0, 2.0, 3.0])], X, 7),
    "upsample_v7_linear": Case([node("Upsample", ["x"], mode="linear",
                                     scales=[1.0, 1.0, 1.5, 2.0])], X, 7),
    "upsample_v9_nearest": Case([node("Upsample", ["x", "s"])], X, 9,
                                weights={"s": floats(1, 1, 2.5, 1.5)}),
    "upsample_v9_linear": Case([node("Upsample", ["x", "s"], mode="linear")], X, 9,
                               weights={"s": floats(1, 1, 2, 1.5)}),
    "depth_to_space_v1": Case([node("DepthToSpace", ["x"], blocksize=2)], {"x": (2, 8, 3, 4)}, 9),
    "depth_to_space_v11_crd": Case([node("DepthToSpace", ["x"], blocksize=2, mode="CRD")],
                                   {"x": (2, 8, 3, 4)}, 11),
    "depth_to_space_v13_dcr": Case([node("DepthToSpace", ["x"], blocksize=3, mode="DCR")],
                                   {"x": (1, 18, 2, 3)}, 13),
    "space_to_depth_v1": Case([node("SpaceToDepth", ["x"], blocksize=2)], {"x": (2, 3, 4, 6)}, 9),
    "space_to_depth_v13": Case([node("SpaceToDepth", ["x"], blocksize=3)], {"x": (1, 2, 6, 3)},
                               13),
}


def feeds_for(case: Case) -> dict[str, np.ndarray]:
    return {name: rand(*shape, seed=k + 10) for k, (name, shape) in enumerate(case.inputs.items())}


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def check(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("case", REFERENCE.values(), ids=REFERENCE.keys())
def test_resize_matches_the_reference(case: Case) -> None:
    model, feeds = case.model(), feeds_for(case)
    check(evaluate(import_onnx(model), feeds), reference(model, feeds))


@pytest.mark.parametrize("case", ORT.values(), ids=ORT.keys())
def test_op_matches_onnxruntime(case: Case) -> None:
    model, feeds = case.model(), feeds_for(case)
    check(evaluate(import_onnx(model), feeds), run_ort(model, feeds))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_v28_modes_match_the_reference(mode: str) -> None:
    case = Case([node("SpaceToDepth", ["x"], blocksize=2, mode=mode)], {"x": (2, 3, 4, 6)}, 28)
    model, feeds = case.model(), feeds_for(case)
    check(evaluate(import_onnx(model), feeds), reference(model, feeds))


def test_depth_and_space_are_reshapes_around_one_transpose() -> None:
    graph = import_onnx(ORT["depth_to_space_v11_crd"].model())
    assert [n.op for n in graph.ops()] == ["reshape", "transpose", "reshape"]


def test_nearest_reads_one_tap_and_unit_scales_resize_nothing() -> None:
    graph = import_onnx(resize(scales=floats(1, 1, 1, 2.5)).model())
    (op,) = graph.ops()
    assert op.op == "image.resize" and op.attrs["axes"] == (3,)
    assert op.inputs[1].ty.shape == (17, 1)  # [outputs, taps] indices of the last axis
    identity = import_onnx(resize(scales=floats(1, 1, 1, 1), mode="cubic").model())
    assert not identity.ops()


def test_constant_data_is_resized_at_import() -> None:
    case = Case([node("Resize", ["w", "", "s"], ["r"], mode="linear"), node("Add", ["x", "r"])],
                {"x": (1, 4)}, 13, weights={"w": rand(1, 2), "s": floats(1, 2)})
    assert [n.op for n in import_onnx(case.model()).ops()] == ["add"]


def test_scales_fed_as_a_graph_input_must_be_bound() -> None:
    case = Case([node("Resize", ["x", "", "s"], mode="linear")], X, 13)
    model = case.model()
    model.graph.input.append(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [4]))
    with pytest.raises(FrontendError) as info:
        import_onnx(model)
    assert info.value.needs_constant == {"s"}
    feeds = feeds_for(case)
    got = evaluate(import_onnx(model, constants={"s": MIXED}), feeds)
    check(got, reference(model, {**feeds, "s": MIXED}))


@pytest.mark.parametrize("case, words", [
    (resize(scales=UP, sizes=ints(2, 3, 5, 7)), ["Resize-19", "exactly one of scales and sizes"]),
    (resize(13), ["exactly one of scales and sizes"]),
    (resize(scales=UP, coordinate_transformation_mode="tf_crop_and_resize"),
     ["tf_crop_and_resize needs a roi of 8"]),
    (resize(10, scales=UP, mode="cubic"), ["Resize-10", "mode 'cubic'", "nearest, linear"]),
    (resize(13, scales=UP, coordinate_transformation_mode="tf_half_pixel_for_nn"),
     ["tf_half_pixel_for_nn"]),
    (resize(scales=floats(1, 1, 0.1, 1)), ["leaves axis 2", "empty"]),
    (resize(18, scales=floats(2, 2), axes=[3, -1]), ["repeat an axis"]),
    (Case([node("Upsample", ["x"], mode="bilinear", scales=[1.0, 1.0, 2.0, 2.0])], X, 7),
     ["Upsample-7", "mode 'bilinear'"]),
    (Case([node("DepthToSpace", ["x"], blocksize=2)], {"x": (1, 6, 2, 2)}, 13),
     ["DepthToSpace-13", "6 channels"]),
    (Case([node("SpaceToDepth", ["x"], blocksize=2)], {"x": (1, 6, 4)}, 13),
     ["SpaceToDepth-13", "4-D"]),
], ids=["scales_and_sizes", "neither", "no_roi", "cubic_v10", "tf_half_pixel_for_nn_v13",
        "empty_output", "repeated_axis", "upsample_bilinear", "channels", "not_4d"])
def test_unsupported_forms_are_refused_by_name(case: Case, words: list[str]) -> None:
    message = error(case)
    for word in words:
        assert word in message


@pytest.mark.parametrize("name", ["cubic_exclude_outside_a_half", "cubic_antialias_sizes",
                                  "tf_crop_and_resize_linear", "tf_crop_and_resize_cubic_axes",
                                  "nearest_ceil_asymmetric_batch_axes", "three_d"])
def test_resize_kernel_matches_on_device(name: str, device: Device) -> None:
    case = REFERENCE[name]
    model, feeds = case.model(), feeds_for(case)
    check(build(import_onnx(model), device=device).run(feeds), reference(model, feeds), 1e-4)


def test_upsample_and_depth_to_space_run_on_device(device: Device) -> None:
    case = Case([node("Upsample", ["x", "s"], ["u"]), node("DepthToSpace", ["u"], blocksize=2)],
                {"x": (1, 8, 3, 4)}, 9, weights={"s": floats(1, 1, 2, 1.5)})
    model, feeds = case.model(), feeds_for(case)
    check(build(import_onnx(model), device=device).run(feeds), run_ort(model, feeds), 1e-5)

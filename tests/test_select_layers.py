"""Which template each layer runs (TVM's select_implementation): the candidate with the
fastest record measured on this device; else one with another device's record (on a
CPU only the preferred template's); else the device class's preferred template with
its default config. On a CPU the preferred template is the one whose default runs
fastest: Winograd on 3x3 stride-1 layers of >= 16 input channels, the direct one
elsewhere, 1x1 layers included (issue 17)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.build_module import build, select_layers
from compiler.ir import GraphBuilder, evaluate
from compiler.passes import optimize
from compiler.records import DEFAULT, OTHER_DEVICE, THIS_DEVICE, MemorySource
from compiler.runtime.device import Device
from compiler.tasks import (
    CONV1X1_CPU,
    CONV_CPU,
    CONV_GPU,
    DENSE_CPU,
    DENSE_SMALL,
    DEPTHWISE,
    GEMM_CPU,
    WINOGRAD,
    WINOGRAD_CPU,
    candidates,
    extract_tasks,
    tuning_candidates,
    winograd_preferred,
)
from compiler.templates import get_template
from schemas import (
    DeviceLimits,
    MeasureErrorNo,
    MeasureResult,
    Record,
    Target,
    Workload,
)

CPU = Target.parse("opencl -model=pocl-cpu")
GPU = Target.parse("cuda -model=h200 -arch=sm_90")
RNG = np.random.default_rng(0)


def small_graph():  # type: ignore[no-untyped-def]
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 8))
    w = b.const(RNG.uniform(-1, 1, (16, 8, 3, 3)).astype(np.float32), "w")
    conv = b.call("nn.relu", [b.call("nn.conv2d", [x, w], "conv", padding=(1, 1, 1, 1))])
    flat = b.call("nn.batch_flatten", [b.call("nn.global_avg_pool2d", [conv])])
    fc = b.call("nn.dense", [flat, b.const(RNG.uniform(-1, 1, (4, 16)).astype(np.float32))],
                "fc")
    return optimize(b.finish([fc]))


def record(workload: Workload, target: Target, seconds: float, index: int = 0) -> Record:
    config = get_template(workload.template).space(workload).get(index)
    return Record(target=target, workload=workload, config=config,
                  result=MeasureResult(costs=(seconds,), error_no=MeasureErrorNo.NO_ERROR))


def conv_node(graph):  # type: ignore[no-untyped-def]
    return next(n for n in graph.ops() if n.op == "fused.conv2d")


def test_device_class_orders_the_candidates() -> None:
    graph = small_graph()
    node = conv_node(graph)
    # a 3x3 stride-1 conv: Winograd after the direct templates, then the implicit GEMM
    assert [w.template for w in candidates(node, CPU)] == [CONV_CPU, CONV_GPU, WINOGRAD,
                                                           WINOGRAD_CPU, GEMM_CPU]
    assert [w.template for w in candidates(node, GPU)] == [CONV_GPU, CONV_CPU, WINOGRAD,
                                                           WINOGRAD_CPU, GEMM_CPU]
    assert [w.template for w in candidates(node, Target.parse(
        "opencl -model=pocl-cpu -device=gpu"))] == [CONV_GPU, CONV_CPU, WINOGRAD, WINOGRAD_CPU,
                                                    GEMM_CPU]
    # tuning covers the preferred template and the device class's others (on a CPU
    # Winograd and the GEMM), so a build can take the faster
    assert [t.template for t in extract_tasks(graph, CPU)] == [CONV_CPU, WINOGRAD_CPU,
                                                               GEMM_CPU, DENSE_CPU]
    assert [t.template for t in extract_tasks(graph, GPU)] == [CONV_GPU, WINOGRAD, DENSE_SMALL]
    assert len(extract_tasks(graph, CPU, every_candidate=True)) == 7


def test_no_records_runs_the_preferred_templates_defaults() -> None:
    plan, tasks, choices = select_layers(small_graph(), CPU, None, DeviceLimits())
    assert [t.template for t in tasks] == [CONV_CPU, DENSE_CPU]
    assert {c.source for c in choices} == {DEFAULT}
    assert len(plan) == 2


def test_fastest_record_measured_here_wins_across_templates() -> None:
    graph = small_graph()
    cpu_wl, gpu_wl, *_ = candidates(conv_node(graph), CPU)
    records = [record(cpu_wl, CPU, 2e-3), record(gpu_wl, CPU, 1e-3)]
    _plan, tasks, choices = select_layers(graph, CPU, MemorySource(records), DeviceLimits())
    assert tasks[0].template == CONV_GPU and choices[0].source == THIS_DEVICE
    records = [record(cpu_wl, CPU, 1e-3), record(gpu_wl, CPU, 2e-3)]
    _plan, tasks, _choices = select_layers(graph, CPU, MemorySource(records), DeviceLimits())
    assert tasks[0].template == CONV_CPU


def test_other_devices_record_of_the_preferred_template_beats_its_default() -> None:
    graph = small_graph()
    cpu_wl = candidates(conv_node(graph), CPU)[0]
    other = Target.parse("opencl -model=skylake-cpu")
    source = MemorySource([record(cpu_wl, other, 1e-4, index=5)])
    _plan, tasks, choices = select_layers(graph, CPU, source, DeviceLimits())
    assert tasks[0].template == CONV_CPU and choices[0].source == OTHER_DEVICE
    assert choices[0].config.index == 5
    assert tasks[1].template == DENSE_CPU and choices[1].source == DEFAULT
    # on a GPU the GPU template is preferred: its record from another GPU is taken
    source = MemorySource([record(candidates(conv_node(graph), GPU)[0], Target.parse(
        "opencl -model=1080ti"), 1e-4, index=7)])
    _plan, tasks, choices = select_layers(graph, GPU, source, DeviceLimits())
    assert tasks[0].template == CONV_GPU and choices[0].source == OTHER_DEVICE
    assert choices[0].config.index == 7


def test_other_devices_record_of_another_template_does_not_displace_the_preferred() -> None:
    """On a CPU: TopHub's 1080ti configs of the GPU templates ran 5-100x slower here than
    the direct template's default, and its x86 CPUs' direct records slower than
    Winograd's default where Winograd is preferred (bench/default_choice.py): the
    preferred template's default is kept. A GPU still takes the first candidate with a
    record (TVM's order)."""
    graph = small_graph()
    _cpu_wl, gpu_wl, wino_wl, *_ = candidates(conv_node(graph), CPU)
    source = MemorySource([record(gpu_wl, Target.parse("opencl -model=1080ti"), 1e-4),
                           record(wino_wl, Target.parse("opencl -model=1080ti"), 1e-5)])
    _plan, tasks, choices = select_layers(graph, CPU, source, DeviceLimits())
    assert tasks[0].template == CONV_CPU and choices[0].source == DEFAULT
    source = MemorySource([record(wino_wl, Target.parse("opencl -model=1080ti"), 1e-5)])
    _plan, tasks, choices = select_layers(graph, GPU, source, DeviceLimits())
    assert tasks[0].template == WINOGRAD and choices[0].source == OTHER_DEVICE
    # a Winograd-preferred layer keeps Winograd's default over a direct foreign record
    graph = cpu_graph()
    node = next(n for n in graph.ops() if n.name == "wino")
    wino_cpu, direct, *_ = candidates(node, CPU)
    assert (wino_cpu.template, direct.template) == (WINOGRAD_CPU, CONV_CPU)
    source = MemorySource([record(direct, Target.parse("opencl -model=skylake-cpu"), 1e-6)])
    plan, _tasks, _choices = select_layers(graph, CPU, source, DeviceLimits())
    assert plan[node].template == WINOGRAD_CPU and plan[node].source == DEFAULT
    # but a measurement here of the direct one, faster, wins
    source = MemorySource([record(direct, CPU, 1e-6)])
    plan, _tasks, _choices = select_layers(graph, CPU, source, DeviceLimits())
    assert plan[node].template == CONV_CPU and plan[node].source == THIS_DEVICE


def test_winograd_or_direct_whichever_measured_faster() -> None:
    graph = small_graph()
    cpu_wl, gpu_wl, wino_wl, *_ = candidates(conv_node(graph), CPU)
    assert wino_wl.args == gpu_wl.args  # the same AutoTVM workload, another template
    records = [record(cpu_wl, CPU, 2e-3), record(gpu_wl, CPU, 3e-3), record(wino_wl, CPU, 1e-3)]
    _plan, tasks, _ = select_layers(graph, CPU, MemorySource(records), DeviceLimits())
    assert tasks[0].template == WINOGRAD
    records[2] = record(wino_wl, CPU, 4e-3)
    _plan, tasks, _ = select_layers(graph, CPU, MemorySource(records), DeviceLimits())
    assert tasks[0].template == CONV_CPU


def test_winograd_only_for_3x3_stride_1_and_depthwise_gets_its_template() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 8))
    strided = b.call("nn.conv2d", [x, b.const(RNG.uniform(-1, 1, (8, 8, 3, 3)).astype(
        np.float32))], strides=(2, 2), padding=(1, 1, 1, 1))
    depthwise = b.call("nn.conv2d", [x, b.const(RNG.uniform(-1, 1, (16, 1, 3, 3)).astype(
        np.float32))], groups=8, padding=(1, 1, 1, 1))
    graph = b.finish([strided, depthwise])
    assert [w.template for w in candidates(strided, CPU)] == [CONV_CPU, CONV_GPU, GEMM_CPU]
    (dw,) = candidates(depthwise, CPU)
    # TVM's depthwise weight layout [C, multiplier, kh, kw]: the same memory as ONNX's
    assert dw.template == DEPTHWISE and dw.args_json()[1] == ["TENSOR", [8, 2, 3, 3], "float32"]
    assert [t.template for t in extract_tasks(graph, CPU)] == [CONV_CPU, GEMM_CPU, DEPTHWISE]


def cpu_graph():  # type: ignore[no-untyped-def]
    """A C=3 stem (3x3 stride 1), a 3x3 stride-1 conv of 16 -> 64 channels at 14x14 (the
    least Winograd is preferred on), a 3x3 stride-2 one, a 1x1 one and a padded 1x1 one,
    each with bias and relu."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    value, c = b.input("x", (1, 3, 14, 14)), 3
    for name, k, kernel, stride, pad in (("stem", 16, 3, 1, 1), ("wino", 64, 3, 1, 1),
                                         ("strided", 32, 3, 2, 1), ("gemm", 16, 1, 1, 0),
                                         ("padded", 16, 1, 1, 1)):
        w = b.const(rng.uniform(-0.3, 0.3, (k, c, kernel, kernel)).astype(np.float32))
        conv = b.call("nn.conv2d", [value, w], name, strides=(stride, stride),
                      padding=(pad,) * 4)
        bias = b.const(rng.uniform(-0.3, 0.3, (k,)).astype(np.float32))
        value, c = b.call("nn.relu", [b.call("nn.bias_add", [conv, bias])]), k
    return optimize(b.finish([value]))


def test_cpu_prefers_the_template_with_the_fastest_default() -> None:
    graph = cpu_graph()
    first = {n.name: candidates(n, CPU)[0].template for n in graph.ops()
             if n.op == "fused.conv2d"}
    assert first == {"stem": CONV_CPU, "wino": WINOGRAD_CPU, "strided": CONV_CPU,
                     "gemm": CONV_CPU, "padded": CONV_CPU}
    # tuning still covers direct, Winograd, 1x1 and GEMM, the preferred one first
    by_name = {n.name: n for n in graph.ops()}
    assert [w.template for w in tuning_candidates(by_name["wino"], CPU)] == [
        WINOGRAD_CPU, CONV_CPU, GEMM_CPU]
    assert [w.template for w in tuning_candidates(by_name["gemm"], CPU)] == [CONV_CPU,
                                                                             CONV1X1_CPU]
    assert [w.template for w in tuning_candidates(by_name["stem"], CPU)] == [
        CONV_CPU, WINOGRAD_CPU, GEMM_CPU]
    assert [w.template for w in candidates(by_name["wino"], CPU)] == [
        WINOGRAD_CPU, CONV_CPU, CONV_GPU, WINOGRAD, GEMM_CPU]
    # a GPU's order is unchanged: its direct template first
    assert [w.template for w in candidates(by_name["wino"], GPU)] == [
        CONV_GPU, CONV_CPU, WINOGRAD, WINOGRAD_CPU, GEMM_CPU]
    assert [w.template for w in candidates(by_name["gemm"], GPU)] == [
        CONV_GPU, CONV_CPU, CONV1X1_CPU]
    assert [t.template for t in extract_tasks(graph, CPU)] == [
        CONV_CPU, WINOGRAD_CPU, GEMM_CPU, WINOGRAD_CPU, CONV_CPU, GEMM_CPU, CONV_CPU,
        GEMM_CPU, CONV_CPU, CONV1X1_CPU, CONV_CPU, GEMM_CPU]
    assert [w.template for w in candidates(by_name["gemm"], CPU)] == [
        CONV_CPU, CONV_GPU, CONV1X1_CPU]


def test_a_16_lane_cpu_prefers_the_1x1_template_on_1x1_layers() -> None:
    """With AVX-512's 16 lanes the 1x1 template's default (4 pixels x 64 channels) ran
    untuned models 1.01-1.05x faster than the direct default on their 1x1 layers (issue
    17): a 16-lane device prefers it on 1x1 layers without padding; 8 lanes, or a device
    that does not say, keep the direct template; a padded 1x1 has no 1x1 template (8
    lanes run its 9x9 output on the implicit GEMM: the next test)."""
    by_name = {n.name: n for n in cpu_graph().ops()}
    for lanes, want in ((0, CONV_CPU), (8, CONV_CPU), (16, CONV1X1_CPU)):
        assert candidates(by_name["gemm"], CPU, lanes)[0].template == want, lanes
        assert tuning_candidates(by_name["gemm"], CPU, lanes)[0].template == want, lanes
        padded = GEMM_CPU if lanes == 8 else CONV_CPU
        assert candidates(by_name["padded"], CPU, lanes)[0].template == padded
        assert candidates(by_name["wino"], CPU, lanes)[0].template == WINOGRAD_CPU
    graph = cpu_graph()
    for lanes, want, padded in ((8, CONV_CPU, GEMM_CPU), (16, CONV1X1_CPU, CONV_CPU)):
        plan, _tasks, _choices = select_layers(graph, CPU, None, DeviceLimits(simd_lanes=lanes))
        chosen = {n.name: (c.template, c.source) for n, c in plan.items()}
        assert chosen["gemm"] == (want, DEFAULT) and chosen["padded"] == (padded, DEFAULT)
    # a GPU's order does not follow the lanes
    assert candidates(by_name["gemm"], GPU, 16)[0].template == CONV_GPU


def test_winograd_untuned_from_16_input_64_output_channels_and_14_pixels_a_side() -> None:
    """Winograd's transforms pay for themselves from 16 input channels, 64 output
    channels and 14x14 images on (issue 17): one short of any of them keeps the direct
    template untuned (DenseNet-121's 128 -> 32 layers, ResNet-50's 7x7 ones)."""
    b = GraphBuilder()
    outputs = []
    for name, c, k, side in (("least", 16, 64, 14), ("c15", 15, 64, 14), ("k63", 16, 63, 14),
                             ("side13", 16, 64, 13)):
        x = b.input(f"x{name}", (1, c, side, side))
        w = b.const(RNG.uniform(-1, 1, (k, c, 3, 3)).astype(np.float32))
        outputs.append(b.call("nn.conv2d", [x, w], name, padding=(1, 1, 1, 1)))
    graph = optimize(b.finish(outputs))
    plan, _tasks, _choices = select_layers(graph, CPU, None, DeviceLimits())
    chosen = {n.name: (c.template, c.source) for n, c in plan.items()}
    assert chosen == {"least": (WINOGRAD_CPU, DEFAULT), "c15": (CONV_CPU, DEFAULT),
                      "k63": (CONV_CPU, DEFAULT), "side13": (CONV_CPU, DEFAULT)}
    # AVX2's 8 lanes take it from 32 output channels (DenseNet-121's 128 -> 32 layers);
    # the 13-pixel image is the implicit GEMM's there (an output at most 14 wide)
    plan, _tasks, _choices = select_layers(graph, CPU, None, DeviceLimits(simd_lanes=8))
    chosen = {n.name: c.template for n, c in plan.items()}
    assert chosen == {"least": WINOGRAD_CPU, "c15": CONV_CPU, "k63": WINOGRAD_CPU,
                      "side13": GEMM_CPU}
    assert winograd_preferred(128, 32, 28, 28, 8) and not winograd_preferred(128, 31, 28, 28, 8)
    assert not winograd_preferred(128, 32, 28, 28, 16) and winograd_preferred(128, 64, 28, 28, 16)


def test_cpu_depthwise_takes_a_foreign_record_of_its_gpu_template() -> None:
    """A depthwise conv has no CPU template: the GPU one is preferred there, so another
    device's record of it counts on a CPU as well."""
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 8))
    w = b.const(RNG.uniform(-1, 1, (8, 1, 3, 3)).astype(np.float32))
    graph = optimize(b.finish([b.call("nn.conv2d", [x, w], "dw", groups=8,
                                      padding=(1, 1, 1, 1))]))
    node = next(n for n in graph.ops() if n.name == "dw")
    (workload,) = candidates(node, CPU)
    assert workload.template == DEPTHWISE
    plan, _tasks, _choices = select_layers(graph, CPU, None, DeviceLimits())
    assert (plan[node].template, plan[node].source) == (DEPTHWISE, DEFAULT)
    source = MemorySource([record(workload, Target.parse("opencl -model=1080ti"), 1e-4,
                                  index=3)])
    plan, _tasks, _choices = select_layers(graph, CPU, source, DeviceLimits())
    assert (plan[node].template, plan[node].source) == (DEPTHWISE, OTHER_DEVICE)
    assert plan[node].config.index == 3


def test_untuned_cpu_build_runs_the_preferred_templates_and_matches_numpy(
        device: Device) -> None:
    if device.target.device_class != "cpu":
        pytest.skip(f"{device.target} is not a CPU")
    graph = cpu_graph()
    module = build(graph, device=device, optimized=True)
    chosen = {layer: t.template for t in module.tasks for layer in t.layers}
    lanes = module.device.limits.simd_lanes
    gemm = CONV1X1_CPU if lanes >= 16 else CONV_CPU
    narrow = GEMM_CPU if 0 < lanes < 16 else CONV_CPU  # 7 and 9 pixels wide
    assert chosen == {"stem": CONV_CPU, "wino": WINOGRAD_CPU, "strided": narrow,
                      "gemm": gemm, "padded": narrow}
    assert {c.source for c in module.choices} == {DEFAULT}
    xs = np.random.default_rng(6).uniform(-1, 1, (1, 3, 14, 14)).astype(np.float32)
    want = evaluate(graph, [xs])[0]
    got = module.run([xs])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))

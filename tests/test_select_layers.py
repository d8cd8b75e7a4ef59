"""Which template each layer runs (TVM's select_implementation): the candidate with the
fastest record measured on this device; else one with another device's record; else
the device class's preferred template with its default config."""

from __future__ import annotations

import numpy as np

from compiler.build_module import select_layers
from compiler.ir import GraphBuilder
from compiler.passes import optimize
from compiler.records import DEFAULT, OTHER_DEVICE, THIS_DEVICE, MemorySource
from compiler.tasks import (
    CONV_CPU,
    CONV_GPU,
    DENSE_CPU,
    DENSE_SMALL,
    DEPTHWISE,
    WINOGRAD,
    WINOGRAD_CPU,
    candidates,
    extract_tasks,
)
from compiler.templates import get_template
from schemas import DeviceLimits, MeasureErrorNo, MeasureResult, Record, Target, Workload

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
    # a 3x3 stride-1 conv: Winograd after the direct templates
    assert [w.template for w in candidates(node, CPU)] == [CONV_CPU, CONV_GPU, WINOGRAD,
                                                           WINOGRAD_CPU]
    assert [w.template for w in candidates(node, GPU)] == [CONV_GPU, CONV_CPU, WINOGRAD,
                                                           WINOGRAD_CPU]
    assert [w.template for w in candidates(node, Target.parse(
        "opencl -model=pocl-cpu -device=gpu"))] == [CONV_GPU, CONV_CPU, WINOGRAD, WINOGRAD_CPU]
    # tuning covers the preferred template and the device class's Winograd, so a build
    # can take the faster
    assert [t.template for t in extract_tasks(graph, CPU)] == [CONV_CPU, WINOGRAD_CPU,
                                                               DENSE_CPU]
    assert [t.template for t in extract_tasks(graph, GPU)] == [CONV_GPU, WINOGRAD, DENSE_SMALL]
    assert len(extract_tasks(graph, CPU, every_candidate=True)) == 6


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


def test_other_devices_record_beats_a_default() -> None:
    graph = small_graph()
    _cpu_wl, gpu_wl, *_ = candidates(conv_node(graph), CPU)
    source = MemorySource([record(gpu_wl, Target.parse("opencl -model=1080ti"), 1e-4)])
    _plan, tasks, choices = select_layers(graph, CPU, source, DeviceLimits())
    assert tasks[0].template == CONV_GPU and choices[0].source == OTHER_DEVICE
    assert tasks[1].template == DENSE_CPU and choices[1].source == DEFAULT


def test_winograd_or_direct_whichever_measured_faster() -> None:
    graph = small_graph()
    cpu_wl, gpu_wl, wino_wl, _ = candidates(conv_node(graph), CPU)
    assert wino_wl.args == gpu_wl.args  # the same AutoTVM workload, another template
    records = [record(cpu_wl, CPU, 2e-3), record(gpu_wl, CPU, 3e-3), record(wino_wl, CPU, 1e-3)]
    plan, tasks, _ = select_layers(graph, CPU, MemorySource(records), DeviceLimits())
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
    assert [w.template for w in candidates(strided, CPU)] == [CONV_CPU, CONV_GPU]
    (dw,) = candidates(depthwise, CPU)
    # TVM's depthwise weight layout [C, multiplier, kh, kw]: the same memory as ONNX's
    assert dw.template == DEPTHWISE and dw.args_json()[1] == ["TENSOR", [8, 2, 3, 3], "float32"]
    assert [t.template for t in extract_tasks(graph, CPU)] == [CONV_CPU, DEPTHWISE]

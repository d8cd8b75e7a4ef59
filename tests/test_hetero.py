"""Heterogeneous execution: placement rules, device_copy insertion, segments run on the
OpenCL device and in numpy with the single-device answer, automatic placement that
keeps the fastest measured candidate, and `tuner compile --place / --auto-place`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from compiler.build_module import build
from compiler.hetero import (
    HeteroModule,
    auto_place,
    build_hetero,
    kernel_op_costs,
    split_segments,
)
from compiler.ir import Graph, GraphBuilder, Node, evaluate, print_graph
from compiler.passes import optimize
from compiler.passes.annotate_device import (
    annotate_devices,
    insert_device_copy,
    parse_device_spec,
    placed_nodes,
    rule_matches,
)
from compiler.runtime.device import Device
from compiler.runtime.host import HostDevice

RNG = np.random.default_rng(11)
TOL = dict(rtol=1e-4, atol=1e-5)


def _w(*shape: int, scale: float = 0.5) -> np.ndarray:
    return RNG.uniform(-scale, scale, size=shape).astype(np.float32)


def _model() -> Graph:
    """conv+bias+relu -> max-pool -> (sigmoid, relu) -> add -> flatten -> dense ->
    softmax, optimized: fused.conv2d, nn.max_pool2d, sigmoid, fused.elementwise,
    nn.batch_flatten, nn.dense, nn.softmax."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 16, 16))
    c = b.call("nn.conv2d", [x, b.const(_w(8, 4, 3, 3))], name="conv", padding=(1, 1, 1, 1))
    c = b.call("nn.bias_add", [c, b.const(_w(8))], name="bias")
    c = b.call("nn.relu", [c], name="relu1")
    p = b.call("nn.max_pool2d", [c], name="pool", pool_size=(2, 2), strides=(2, 2))
    s = b.call("sigmoid", [p], name="sig")
    r = b.call("nn.relu", [p], name="relu2")
    a = b.call("add", [s, r], name="add")
    f = b.call("nn.batch_flatten", [a], name="flat")
    d = b.call("nn.dense", [f, b.const(_w(10, 512, scale=0.1))], name="dense")
    return optimize(b.finish([b.call("nn.softmax", [d], name="softmax")]))


X = RNG.uniform(0, 1, size=(1, 4, 16, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def model() -> Graph:
    return _model()


@pytest.fixture(scope="module")
def devices(device: Device) -> dict[str, Any]:
    return {"opencl:0": device, "host": HostDevice()}


def _copies(graph: Graph) -> list[Node]:
    live = graph.live()
    return [n for n in graph.nodes if n.op == "device_copy" and id(n) in live]


# ---------------------------------------------------------------- placement rules


def test_rules_match_op_last_part_and_node_name(model: Graph) -> None:
    ops = {n.name: n for n in model.ops()}
    assert ops["conv"].op == "fused.conv2d" and rule_matches("conv2d", ops["conv"])
    assert rule_matches("fused.conv2d", ops["conv"]) and rule_matches("conv", ops["conv"])
    assert rule_matches("elementwise", ops["add"]) and not rule_matches("add", ops["pool"])
    placement = annotate_devices(model, {"pool": "host", "max_pool2d": "opencl:0",
                                         "elementwise": "host"}, "opencl")
    where = {n.name: d for n, d in placement.items()}
    assert where == {"conv": "opencl:0", "pool": "host", "sig": "opencl:0", "add": "host",
                     "flat": "opencl:0", "dense": "opencl:0", "softmax": "opencl:0"}
    assert all(n.op not in ("input", "const") for n in placement)


def test_bad_rules_and_unknown_devices_are_clear_errors(model: Graph,
                                                         devices: dict[str, Any]) -> None:
    assert parse_device_spec(" OpenCL ") == "opencl:0" and parse_device_spec("cuda:01") == "cuda:1"
    for bad in ("gpu", "opencl:x", "cuda:-1", ""):
        with pytest.raises(ValueError, match="expected host, opencl:N or cuda:N"):
            parse_device_spec(bad)
    with pytest.raises(ValueError, match="placement rule conv2d=tpu:0"):
        annotate_devices(model, {"conv2d": "tpu:0"}, "host")
    with pytest.raises(ValueError, match="the op or node name is empty"):
        annotate_devices(model, {" ": "host"}, "host")
    with pytest.raises(ValueError, match=r"conv2d=opencl:7: no such device here"):
        annotate_devices(model, {"conv2d": "opencl:7"}, "host", known=["opencl:0"])
    with pytest.raises(ValueError, match="device opencl:99"):
        build_hetero(model, {"conv2d": "opencl:99"}, "host", devices=devices, optimized=True)
    with pytest.raises(ValueError, match="rules \\(a mapping\\) or 'auto'"):
        build_hetero(model, "fastest", "host", devices=devices, optimized=True)


# ---------------------------------------------------------------- device_copy


def test_device_copy_exactly_where_the_device_changes_one_per_destination() -> None:
    """conv (opencl) is read by a sigmoid and a relu on the host and a max-pool on
    opencl: one copy to the host, shared; the host values meet again on opencl: one
    copy each; no copy between ops on one device, none of a constant or an input."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 8, 8))
    conv = b.call("nn.conv2d", [x, b.const(_w(4, 3, 3, 3))], name="conv", padding=(1, 1, 1, 1))
    sig = b.call("sigmoid", [conv], name="sig")
    relu = b.call("nn.relu", [conv], name="relu")
    pool = b.call("nn.max_pool2d", [conv], name="pool", pool_size=(1, 1))
    add = b.call("add", [sig, relu], name="add_host")
    out = b.call("multiply", [add, pool], name="mul")
    graph = b.finish([out, sig])
    placement = annotate_devices(graph, {"sig": "host", "relu": "host", "add_host": "host"},
                                 "opencl:0")
    placed, where = insert_device_copy(graph, placement)
    copies = _copies(placed)
    moves = sorted((c.inputs[0].name, c.attr("src_device"), c.attr("dst_device")) for c in copies)
    assert moves == [("add_host", "host", "opencl:0"), ("conv", "opencl:0", "host")]
    assert all(where[c] == c.attr("dst_device") for c in copies)
    for node in placed.ops():  # every edge: same device, or through a copy
        for arg in node.inputs:
            if arg in where and node.op != "device_copy":
                assert where[arg] == where[node], (node.name, arg.name)
    (to_host,) = [c for c in copies if c.attr("dst_device") == "host"]
    readers = [n.name for n in placed.ops() if to_host in n.inputs]
    assert sorted(readers) == ["relu", "sig"]
    np.testing.assert_allclose(evaluate(placed, [X[:, :3, :8, :8]])[0],
                               evaluate(graph, [X[:, :3, :8, :8]])[0], **TOL)
    text = print_graph(placed, where)
    assert text.count(" = device_copy(") == 2
    assert 'device_copy(%0, src_device="opencl:0", dst_device="host")' in text
    assert "float32] device=host" in text and "float32] device=opencl:0" in text
    assert " device=" not in print_graph(placed)  # the default output is unchanged


def test_segments_keep_a_device_together_and_run_in_dependency_order() -> None:
    """Two independent branches, each on its own device, make one segment each (not an
    alternation of the graph order), then the join."""
    b = GraphBuilder()
    x = b.input("x", (1, 16))
    a1 = b.call("sigmoid", [x], name="a1")
    h1 = b.call("nn.relu", [x], name="h1")
    a2 = b.call("sigmoid", [a1], name="a2")
    h2 = b.call("nn.relu", [h1], name="h2")
    graph = b.finish([b.call("add", [a2, h2], name="join")])
    placement = annotate_devices(graph, {"relu": "host"}, "opencl:0")
    placed, where = insert_device_copy(graph, placement)
    segments = split_segments(placed, where)
    assert [n.name for n in placed.ops() if n.op != "device_copy"] == [
        "a1", "h1", "a2", "h2", "join"]
    assert [(s.device, [n.name for n in s.nodes]) for s in segments] == [
        ("opencl:0", ["a1", "a2"]), ("host", ["h1", "h2"]), ("opencl:0", ["join"])]
    done: set[Node] = set(placed.inputs)
    for seg in segments:
        for value in seg.inputs:
            assert value in done or (value.op == "device_copy" and value.inputs[0] in done)
        done.update(seg.nodes)


# ---------------------------------------------------------------- running


def test_split_across_opencl_and_host_matches_single_device_and_interpreter(
        model: Graph, devices: dict[str, Any], device: Device) -> None:
    want = evaluate(model, [X])[0]
    single = build(model, device=device, optimized=True).run([X])[0]
    module = build_hetero(model, {"conv2d": "opencl:0", "max_pool2d": "host",
                                  "softmax": "host"}, "opencl:0", devices=devices,
                          optimized=True)
    assert isinstance(module, HeteroModule)
    got = module.run({"x": X})[0]
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(got, single, **TOL)
    assert [s.device for s in module.segments] == ["opencl:0", "host", "opencl:0", "host"]
    assert len(module.copies) == 3
    report = module.report()
    assert "4 segment(s), 3 device_copy" in report
    assert "conv: opencl:0 -> host" in report and "tasks on opencl:0:" in report
    assert module.benchmark(number=2, repeat=2).mean > 0
    # one device alone, either one, gives the same answer
    for spec in ("host", "opencl:0"):
        alone = build_hetero(model, {}, spec, devices=devices, optimized=True)
        assert len(alone.segments) == 1 and not alone.copies
        np.testing.assert_allclose(alone.run([X])[0], want, **TOL)


def test_auto_placement_keeps_the_fastest_measured_candidate(
        model: Graph, devices: dict[str, Any]) -> None:
    placement, report = auto_place(model, devices, number=2, repeat=3)
    measured = report.measured
    singles = {"all:opencl:0", "all:host"}
    assert singles <= set(measured) and "auto" in measured
    assert report.chosen == min(measured, key=measured.__getitem__)
    assert measured[report.chosen] <= min(measured[s] for s in singles)
    assert all(len(c.costs) == 3 for c in report.candidates)
    assert set(placement) == set(model.ops()) and set(placement.values()) <= set(devices)
    assert set(report.op_costs) == set(model.ops())
    assert all(set(costs) == set(devices) for costs in report.op_costs.values())
    text = report.format()
    assert "<- chosen" in text and "all:host" in text and "copies opencl:0: upload" in text
    module = build_hetero(model, "auto", "opencl:0", devices=devices, optimized=True,
                          number=1, repeat=2)
    assert module.auto_report is not None
    np.testing.assert_allclose(module.run([X])[0], evaluate(model, [X])[0], **TOL)
    assert "automatic placement over opencl:0, host" in module.report()


# ---------------------------------------------------------------- tuner compile

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from cli.main import app  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conv -> max-pool -> relu (stays a lone nn.relu) -> conv+bias+relu -> global
    average pool -> flatten -> gemm -> softmax."""
    def init(name: str, *shape: int) -> Any:
        return numpy_helper.from_array(_w(*shape), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c1"], ["p1"], "pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Relu", ["p1"], ["r1"], "relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], "gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], "flatten"),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"], "fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], "softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "hetero_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])],
        [init("w1", 8, 3, 3, 3), init("w2", 8, 8, 3, 3), init("b2", 8), init("fw", 10, 8),
         init("fb", 10)])
    path = tmp_path_factory.mktemp("hetero") / "hetero_net.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _target(device: Device) -> str:
    return str(device.target)


def invoke(argv: list[str]) -> Any:
    result = runner.invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def test_compile_place_prints_the_device_copies(model_file: Path, device: Device) -> None:
    result = invoke(["compile", str(model_file), "--target", _target(device), "--records",
                     "none", "--device", "opencl:0", "--place", "conv2d=opencl:0",
                     "--place", "nn.relu=host", "--print-ir", "--benchmark", "--number", "1",
                     "--repeat", "1"])
    assert result.exit_code == 0, result.output
    _, after = result.output.split("// after passes")
    passes, placed = after.split("// after device placement")
    assert "device_copy" not in passes
    lines = [line for line in placed.splitlines() if " = device_copy(" in line]
    assert len(lines) == 2, placed
    assert 'src_device="opencl:0", dst_device="host"' in lines[0]
    assert 'src_device="host", dst_device="opencl:0"' in lines[1]
    assert "nn.relu(" in placed and "device=host" in placed
    assert "3 segment(s), 2 device_copy" in result.output
    assert "latency: mean" in result.output and "2 device_copy)" in result.output


def test_compile_auto_place_reports_every_candidate(model_file: Path, device: Device) -> None:
    result = invoke(["compile", str(model_file), "--target", _target(device), "--records",
                     "none", "--device", "opencl:0", "--auto-place"])
    assert result.exit_code == 0, result.output
    assert "automatic placement over opencl:0, host" in result.output
    for name in ("auto", "all:opencl:0", "all:host"):
        assert f"    {name} " in result.output
    assert result.output.count("<- chosen") == 1


@pytest.mark.parametrize("argv, message", [
    (["--place", "conv2d"], "expected OP=DEVICE"),
    (["--place", "=host"], "expected OP=DEVICE"),
    (["--place", "conv2d=tpu:0"], "expected host, opencl:N or cuda:N"),
    (["--place", "conv2d=opencl:42"], "device opencl:42"),
    (["--place", "conv2d=host", "--place", "conv2d=opencl:0"], "given twice"),
    (["--place", "conv2d=host", "--auto-place"], "one or the other"),
])
def test_compile_rejects_bad_place(model_file: Path, device: Device, argv: list[str],
                                   message: str) -> None:
    result = invoke(["compile", str(model_file), "--target", _target(device), "--records",
                     "none", *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_values_shared_by_two_segments_of_one_device_and_alias_only_segments(
        devices: dict[str, Any]) -> None:
    """conv's output is read by the host and, after it, on opencl again (handed over via
    the host, no device_copy); a lone reshape on opencl is a segment with no kernel;
    a graph output computed on opencl comes back to the host."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 8, 8))
    conv = b.call("nn.conv2d", [x, b.const(_w(4, 3, 3, 3))], name="conv", padding=(1, 1, 1, 1))
    sig = b.call("sigmoid", [conv], name="sig")
    add = b.call("add", [conv, sig], name="add")
    graph = b.finish([b.call("nn.batch_flatten", [add], name="flat"), conv])
    x_in = X[:, :3, :8, :8]
    want = evaluate(graph, [x_in])
    reports = []
    for rules, default, layout in [
            ({"sig": "host"}, "opencl:0", [("opencl:0", 1), ("host", 0), ("opencl:0", 1)]),
            ({"flat": "opencl:0"}, "host", [("host", 0), ("opencl:0", 0)])]:
        module = build_hetero(graph, rules, default, devices=devices, optimized=True)
        assert [(s.device, s.kernels) for s in module.segments] == layout
        for got, expected in zip(module.run([x_in]), want):
            np.testing.assert_allclose(got, expected, **TOL)
        reports.append(module.report())
    assert "handed between segments of one device via the host: conv" in reports[0]
    assert "handed between" not in reports[1]


def test_op_costs_time_a_chain_its_conv_would_run_in_its_load(device: Device) -> None:
    """A build runs the scale/shift/relu chain in the 1x1 conv's data load (no step of
    its own); placement still times every op, the chain included."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8))
    rng = np.random.default_rng(2)
    act = b.call("nn.relu", [b.call("add", [
        b.call("multiply", [x, b.const(rng.uniform(0.5, 1.5, (16, 1, 1)).astype(np.float32))]),
        b.const(rng.uniform(-0.5, 0.5, (16, 1, 1)).astype(np.float32))])])
    conv = b.call("nn.conv2d", [act, b.const(rng.uniform(-1, 1, (8, 16, 1, 1))
                                             .astype(np.float32))], "conv")
    graph = optimize(b.finish([conv]))
    assert len(build(graph, device=device, optimized=True).program.steps) == 1
    costs = kernel_op_costs(graph, device)
    assert set(costs) == set(placed_nodes(graph)) and len(costs) == 2
    assert all(0 < c < float("inf") for c in costs.values())

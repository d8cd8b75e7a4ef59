"""Graph-level layout tuning (issue 17, point 3): the DP over layers' record options.

No device: the solve is exact on data-edge forests (against brute force), a fixed point
of greedy sweeps where residual edges join them, and beats per-layer greedy on a chain
where the read (transform) cost dominates. On the OpenCL device: a conv graph with two
layouts of records per layer, tuned with a constructed read cost and with measured
ones, lowers to a program whose output equals the graph interpreter's, and measured
read costs are cached (a second tuning times nothing). The read-cost cache file: merged
on save, started afresh when unreadable, keyed by the kernels' source, kept where XDG
says (a test run's own file here).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import nchwc_config

from compiler.build_module import _residual_index, build, lower, plan_layouts, select_layers
from compiler.ir import Graph, GraphBuilder, evaluate
from compiler.ir.ops import node_epilogue
from compiler.layout_tune import (
    CACHE_ENV,
    DATA,
    RESIDUAL,
    Edge,
    Option,
    Problem,
    ReadCosts,
    _sweep,
    default_cache,
    layer_options,
    solve,
    tune_layouts,
)
from compiler.passes import optimize
from compiler.records import MemorySource
from compiler.records.choose import Choice
from compiler.runtime.device import Device
from compiler.tasks import CONV_CPU, candidates
from compiler.templates import Epilogue, IOLayout, Kernel, get_template
from compiler.runtime.executor import GraphExecutor
from schemas import MeasureErrorNo, MeasureResult, Record, Workload
from schemas.record import COLD_INFO

WL = Workload(template="conv2d_NCHWc.x86", args=[])  # the pure tests never read it


def option(cost: float, in_block: int, out_block: int) -> Option:
    choice = Choice(WL, WL.template, None, "this device", None, None, None)  # type: ignore[arg-type]
    return Option(choice, cost, in_block, out_block)


def mismatch(seconds: float, options: list[list[Option]]):  # type: ignore[no-untyped-def]
    """A read cost of ``seconds`` whenever a block differs from the option's own."""
    def penalty(v: int, s: int, slot: str, block: int) -> float:
        opt = options[v][s]
        own = opt.in_block if slot == DATA else opt.out_block
        return 0.0 if block == own else seconds
    return penalty


def cheapest(problem: Problem) -> list[int]:
    """Each layer's cheapest option alone (what ``select_layers`` takes)."""
    return [min(range(len(opts)), key=lambda s, o=opts: o[s].cost)  # type: ignore[misc]
            for opts in problem.options]


def brute_force(problem: Problem, penalty) -> float:  # type: ignore[no-untyped-def]
    return min(problem.total(states, penalty)
               for states in itertools.product(*[range(len(o)) for o in problem.options]))


# ---- no device ----

def test_dp_beats_greedy_where_the_transform_cost_dominates() -> None:
    # a chain: each layer's cheapest option writes or reads a block its neighbour does not
    options = [
        [option(1.00e-3, 4, 8), option(1.05e-3, 4, 16)],
        [option(1.00e-3, 16, 8), option(1.10e-3, 16, 16), option(1.02e-3, 8, 8)],
        [option(1.00e-3, 16, 16), option(1.03e-3, 8, 16)],
    ]
    problem = Problem(options, [Edge(0, 1, DATA), Edge(1, 2, DATA)], {(0, DATA): 0})
    penalty = mismatch(0.5e-3, options)
    greedy = cheapest(problem)
    assert greedy == [0, 0, 0]
    states = solve(problem, penalty)
    assert states == [0, 2, 1]  # every read in its own block
    assert problem.total(states, penalty) == pytest.approx(3.05e-3 + 0.5e-3)  # stem reads plain
    assert problem.total(states, penalty) < problem.total(greedy, penalty) - 0.4e-3
    assert problem.total(states, penalty) == pytest.approx(brute_force(problem, penalty))
    # with free reads the DP takes each layer's fastest, as select_layers does
    assert solve(problem, lambda *_a: 0.0) == greedy


def random_problem(rng: random.Random, n: int, residuals: bool) -> Problem:
    options = [[option(rng.uniform(1, 2) * 1e-3, rng.choice((4, 8, 16)), rng.choice((4, 8, 16)))
                for _ in range(rng.randint(1, 3))] for _ in range(n)]
    edges = [Edge(rng.randrange(v), v, DATA) for v in range(1, n) if rng.random() < 0.8]
    if residuals:
        edges += [Edge(rng.randrange(v), v, RESIDUAL) for v in range(2, n) if rng.random() < 0.4]
    return Problem(options, edges, {(0, DATA): 0})


@pytest.mark.parametrize("seed", range(20))
def test_dp_is_exact_on_data_forests(seed: int) -> None:
    rng = random.Random(seed)
    problem = random_problem(rng, rng.randint(2, 7), residuals=False)
    table = {(v, s, slot, b): rng.uniform(0, 1e-3) for v, opts in enumerate(problem.options)
             for s in range(len(opts)) for slot in (DATA, RESIDUAL) for b in (0, 4, 8, 16)}

    def penalty(v: int, s: int, slot: str, block: int) -> float:
        return table[(v, s, slot, block)]

    states = solve(problem, penalty)
    assert problem.total(states, penalty) == pytest.approx(brute_force(problem, penalty))
    assert problem.total(states, penalty) <= problem.total(cheapest(problem), penalty) + 1e-15


@pytest.mark.parametrize("seed", range(20))
def test_residual_edges_end_at_a_fixed_point_of_greedy_sweeps(seed: int) -> None:
    rng = random.Random(100 + seed)
    problem = random_problem(rng, rng.randint(3, 7), residuals=True)
    penalty = mismatch(rng.uniform(0.1, 2) * 1e-3, problem.options)
    states = solve(problem, penalty)
    total = problem.total(states, penalty)
    assert total >= brute_force(problem, penalty) - 1e-15
    # no single layer can change its state and lower the total
    for v, opts in enumerate(problem.options):
        for s in range(len(opts)):
            trial = list(states)
            trial[v] = s
            assert problem.total(trial, penalty) >= total - 1e-15
    assert _sweep(problem, penalty, list(states), 5) == states


def test_a_second_data_producer_is_refused() -> None:
    options = [[option(1e-3, 4, 4)]] * 3
    problem = Problem(options, [Edge(0, 2, DATA), Edge(1, 2, DATA)])
    with pytest.raises(ValueError, match="second data producer"):
        solve(problem, lambda *_a: 0.0)


# ---- on the device ----

def chain_graph() -> Graph:
    """conv1 -> conv2 -> conv3 (1x1, + conv1 as residual) -> conv4 (a graph output): the
    outputs of conv1, conv2 and conv3 are read by convs only, so stored blocked."""
    rng = np.random.default_rng(5)

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    b = GraphBuilder()
    x = b.input("x", (1, 16, 12, 12))
    pad = dict(padding=(1, 1, 1, 1))
    c1 = b.call("nn.relu", [b.call("nn.conv2d", [x, w(32, 16, 3, 3)], "conv1", **pad)])
    c2 = b.call("nn.relu", [b.call("nn.conv2d", [c1, w(32, 32, 3, 3)], "conv2", **pad)])
    c3 = b.call("nn.relu", [b.call("add", [b.call("nn.conv2d", [c2, w(32, 32, 1, 1)], "conv3"),
                                           c1])])
    c4 = b.call("nn.conv2d", [c3, w(16, 32, 3, 3)], "conv4", **pad)
    return optimize(b.finish([c4]))


def layout_records(graph: Graph, device: Device) -> MemorySource:
    """Per layer two records: ic_bn = oc_bn = 16 and ic_bn = oc_bn = 8, the 8-wide one
    made the cheaper on every other layer, so taking each layer's cheapest mixes blocks."""
    return MemorySource(layout_record_list(graph, device))


def layout_record_list(graph: Graph, device: Device) -> list[Record]:
    plan, _tasks, _choices = select_layers(graph, device.target, None, device.limits)
    records = []
    for i, node in enumerate(n for n in graph.nodes if n in plan):
        # the direct template's (an untuned CPU build prefers Winograd / 1x1 / GEMM on some)
        wl = next(w for w in candidates(node, device.target) if w.template == CONV_CPU)
        cin = node.inputs[0].ty.shape[1]
        for block in (8, 16):
            ic = block if cin % block == 0 else cin
            config = nchwc_config(wl, tile_ic=ic, tile_oc=block, tile_ow=4, vec=8)
            cost = 1.0e-3 if (block == 8) == (i % 2 == 0) else 1.01e-3
            records.append(Record(target=device.target, workload=wl, config=config,
                                  result=MeasureResult(costs=(cost,),
                                                       error_no=MeasureErrorNo.NO_ERROR)))
    return records


class MismatchReads(ReadCosts):
    """Reads in a block other than a config's own cost 1 ms, constructed, not timed."""

    def penalty(self, option: Option, epilogue: Epilogue, slot: str, block: int) -> float:
        own = option.in_block if slot == DATA else option.out_block
        return 0.0 if block == own else 1e-3


def run_plan(graph: Graph, plan, device: Device, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    program = lower(graph, plan, device.dialect)
    (got,) = GraphExecutor(program, device).run([x])
    return got


def test_tuned_plan_matches_blocks_and_the_interpreter(device: Device) -> None:
    graph = chain_graph()
    source = layout_records(graph, device)
    plan, _tasks, _choices = select_layers(graph, device.target, source, device.limits)
    layouts = plan_layouts(graph, plan)
    blocks = {n.name: b for n, b in layouts.items()}
    assert blocks == {"conv1": 8, "conv2": 16, "conv3": 8}  # greedy: mixed blocks
    tuned = tune_layouts(graph, plan, layouts, source, device, residual_index=_residual_index,
                         reads=MismatchReads(device))
    assert tuned.changed and tuned.measured == 0
    assert tuned.tuned_total < tuned.greedy_total - 1e-3
    new = plan_layouts(graph, tuned.plan)
    assert len(set(new.values())) == 1  # one block through the chain: no mismatched read
    x = np.random.default_rng(6).uniform(-1, 1, (1, 16, 12, 12)).astype(np.float32)
    (want,) = evaluate(graph, [x])
    for which in (plan, tuned.plan):
        np.testing.assert_allclose(run_plan(graph, which, device, x), want, rtol=1e-4,
                                   atol=1e-4 * float(np.abs(want).max()))


def pool_graph() -> Graph:
    """conv1 -> max-pool 3x3/2 -> conv2 -> conv3 (a graph output): the pool, read by conv2
    only, passes conv1's block on (``BLOCKED_POOLS``)."""
    rng = np.random.default_rng(7)

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    b = GraphBuilder()
    x = b.input("x", (1, 16, 16, 16))
    pad = {"padding": (1, 1, 1, 1)}
    c1 = b.call("nn.relu", [b.call("nn.conv2d", [x, w(32, 16, 3, 3)], "conv1", **pad)])
    pool = b.call("nn.max_pool2d", [c1], pool_size=(3, 3), strides=(2, 2), **pad)
    c2 = b.call("nn.relu", [b.call("nn.conv2d", [pool, w(32, 32, 3, 3)], "conv2", **pad)])
    return optimize(b.finish([b.call("nn.conv2d", [c2, w(16, 32, 3, 3)], "conv3", **pad)]))


def test_a_blocked_pool_is_a_data_edge_from_its_producer(device: Device) -> None:
    """The DP sees conv2 read conv1's block through the pool: greedy gives conv1 (and the
    pool) 8 and conv2 16, a mismatched read; the tuned plan one block through the pool."""
    graph = pool_graph()
    source = layout_records(graph, device)
    plan, _tasks, _choices = select_layers(graph, device.target, source, device.limits)
    layouts = plan_layouts(graph, plan)
    assert sorted(layouts.values()) == [8, 8, 16]  # conv1, the pool, conv2
    tuned = tune_layouts(graph, plan, layouts, source, device, residual_index=_residual_index,
                         reads=MismatchReads(device))
    assert tuned.greedy_total - tuned.tuned_total > 0.5e-3  # a mismatched read saved
    assert len(set(plan_layouts(graph, tuned.plan).values())) == 1
    x = np.random.default_rng(8).uniform(-1, 1, (1, 16, 16, 16)).astype(np.float32)
    (want,) = evaluate(graph, [x])
    np.testing.assert_allclose(run_plan(graph, tuned.plan, device, x), want, rtol=1e-4,
                               atol=1e-4 * float(np.abs(want).max()))


def test_measured_read_costs_are_cached_and_the_build_matches(
        device: Device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = chain_graph()
    source = layout_records(graph, device)
    plan, _tasks, _choices = select_layers(graph, device.target, source, device.limits)
    layouts = plan_layouts(graph, plan)
    cache = tmp_path / "reads.json"
    first = tune_layouts(graph, plan, layouts, source, device, cache=cache,
                         residual_index=_residual_index)
    assert first.measured > 0 and first.tuned_total <= first.greedy_total
    stored = json.loads(cache.read_text())
    assert len(stored) == first.measured and all(v >= 0 for v in stored.values())
    again = tune_layouts(graph, plan, layouts, source, device, cache=cache,
                         residual_index=_residual_index)
    assert again.measured == 0 and again.tuned_total == pytest.approx(first.tuned_total)
    monkeypatch.setenv("TUNER_LAYOUT_CACHE", str(cache))
    module = build(graph, records=source, device=device, optimized=True, graph_tune=True)
    x = np.random.default_rng(7).uniform(-1, 1, (1, 16, 12, 12)).astype(np.float32)
    (want,) = evaluate(graph, [x])
    (got,) = module.run([x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert sum(len(t.layers) for t in module.tasks) == 4


def test_cli_compile_graph_tune(device: Device, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``tuner compile --graph-tune`` builds with the DP and says what it chose."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from typer.testing import CliRunner

    from cli.main import app
    from compiler.build_module import load_graph

    rng = np.random.default_rng(8)

    def const(name: str, *shape: int):  # type: ignore[no-untyped-def]
        return numpy_helper.from_array(rng.uniform(-0.3, 0.3, shape).astype(np.float32), name)

    pads = [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=pads),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], "conv2", pads=pads),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["y"], "conv3", pads=pads)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])],
        [const("w1", 32, 16, 3, 3), const("w2", 32, 32, 3, 3), const("w3", 16, 32, 3, 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    log = tmp_path / "records.log"
    log.write_text("".join(r.to_line() + "\n" for r in layout_record_list(
        optimize(load_graph(str(path))), device)))
    monkeypatch.setenv("TUNER_LAYOUT_CACHE", str(tmp_path / "reads.json"))
    result = CliRunner().invoke(app, ["compile", str(path), "--target", str(device.target),
                                      "--records", str(log), "--graph-tune"])
    assert result.exit_code == 0, result.output
    assert "graph tuning: " in result.output and "of 3 layers changed" in result.output
    assert (tmp_path / "reads.json").is_file()


class FixedReads(ReadCosts):
    """The real key, cache file and kernels, with a constant for the timed difference."""

    def _paired(self, choice: Choice, epilogue: Epilogue, ios: tuple[IOLayout, IOLayout],
                kernels: tuple[Kernel, Kernel]) -> float:
        return 1e-4


def chain_options(device: Device) -> list[tuple[Option, Epilogue]]:
    """chain_graph's layers' first options, each with its layer's epilogue."""
    graph = chain_graph()
    source = layout_records(graph, device)
    plan, _tasks, _choices = select_layers(graph, device.target, source, device.limits)
    nodes = [n for n in graph.nodes if n in plan]
    options = layer_options(nodes, source, device.target, device.limits)
    return [(opts[0], node_epilogue(node)) for node, opts in zip(nodes, options) if opts]


def test_a_layers_options_timed_cold_leave_out_its_warm_ones(device: Device) -> None:
    """Costs timed with cold weights and warm ones do not compare: where a layer has a
    cold record, its options are its cold layouts alone, though a warm one is cheaper."""
    graph = chain_graph()
    plan, _tasks, _choices = select_layers(graph, device.target, None, device.limits)
    nodes = [n for n in graph.nodes if n in plan]
    records = layout_record_list(graph, device)
    # the 16-wide record of the first layer timed cold and slower than its 8-wide one
    first = records[1].model_copy(update={
        "info": {COLD_INFO: True},
        "result": records[1].result.model_copy(update={"costs": (2e-3,)})})
    assert first.workload == records[0].workload and first.config != records[0].config
    options = layer_options(nodes, MemorySource([records[0], first, *records[2:]]),
                            device.target, device.limits)
    assert [(o.in_block, o.cost) for o in options[0]] == [(16, 2e-3)]
    assert [len(o) for o in options[1:]] == [2] * (len(options) - 1)  # warm alike: both


def other_block(option: Option) -> int:
    return 16 if option.in_block == 8 else 8


def test_the_read_cost_cache_merges_saves_and_survives_a_partial_file(
        device: Device, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two builds that opened the cache before either saved keep both entries; a partial
    file (a build killed mid-write by an older version) is read as empty, with a warning."""
    (a, ea), (b, eb) = chain_options(device)[:2]
    cache = tmp_path / "reads.json"
    cache.write_text('{"stale": 1.0, "cut')
    with caplog.at_level(logging.WARNING, logger="compiler.layout_tune"):
        first, second = FixedReads(device, cache), FixedReads(device, cache)
    assert "unreadable layout read costs" in caplog.text
    assert first.penalty(a, ea, DATA, other_block(a)) == 1e-4
    assert second.penalty(b, eb, DATA, other_block(b)) == 1e-4
    assert len(json.loads(cache.read_text())) == 2  # the second save kept the first's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reads.json"]  # no temp left
    third = FixedReads(device, cache)
    third.penalty(a, ea, DATA, other_block(a))
    third.penalty(b, eb, DATA, other_block(b))
    assert third.measured == 0


def test_read_costs_are_measured_again_when_the_kernel_source_changes(
        device: Device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (a, ea), *_ = chain_options(device)
    cache = tmp_path / "reads.json"
    FixedReads(device, cache).penalty(a, ea, DATA, other_block(a))
    same = FixedReads(device, cache)
    same.penalty(a, ea, DATA, other_block(a))
    assert same.measured == 0
    template = get_template(a.choice.workload.template)
    codegen = template.codegen

    def changed(*args: Any, **kwargs: Any) -> Kernel:  # a new version of the template
        kernel = codegen(*args, **kwargs)
        return dataclasses.replace(kernel, source=kernel.source + "\n// v2\n")

    monkeypatch.setattr(template, "codegen", changed)
    after = FixedReads(device, cache)
    after.penalty(a, ea, DATA, other_block(a))
    assert after.measured == 1


def test_the_read_cost_cache_is_the_runs_own_and_follows_xdg(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest pins the cache to a file of the test run's own; unpinned, it lives in
    $XDG_CACHE_HOME/tuner, beside the kernel cache."""
    assert os.environ.get(CACHE_ENV)
    assert not default_cache().is_relative_to(Path.home() / ".cache")
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache() == tmp_path / "xdg" / "tuner" / "layout_costs.json"

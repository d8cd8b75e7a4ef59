"""The graph executor: runs a hand-made program, shares intermediate buffers by
liveness without changing the answer, times the whole graph and each step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from compiler.ir import GraphBuilder, Node, evaluate
from compiler.kernels import lower
from compiler.runtime.device import BuildError, Device
from compiler.runtime.executor import GraphExecutor, Program, Step, plan_storage
from compiler.tasks import node_workload
from compiler.templates import Epilogue, Kernel, get_template

X = np.random.default_rng(1).uniform(-1, 1, (1, 4, 6, 6)).astype(np.float32)


def _graph() -> tuple[GraphBuilder, dict[str, Node]]:
    """conv+bias+relu feeding both a max-pool and a sigmoid (read twice), their sum
    flattened (an alias, no kernel), then dense and softmax."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    n: dict[str, Node] = {}
    n["x"] = b.input("x", (1, 4, 6, 6))
    n["w"] = b.const(rng.uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32))
    n["bias"] = b.const(rng.uniform(-1, 1, 8).astype(np.float32))
    n["conv"] = b.call("fused.conv2d", [n["x"], n["w"], n["bias"]], name="conv",
                       padding=(1, 1, 1, 1), epilogue=("bias", "relu"))
    n["maxpool"] = b.call("nn.max_pool2d", [n["conv"]], name="maxpool", pool_size=(2, 2),
                          strides=(2, 2))
    n["sigmoid"] = b.call("sigmoid", [n["conv"]], name="sigmoid")
    n["avgpool"] = b.call("nn.avg_pool2d", [n["sigmoid"]], name="avgpool", pool_size=(2, 2),
                          strides=(2, 2))
    n["add"] = b.call("add", [n["maxpool"], n["avgpool"]], name="add")
    n["flat"] = b.call("nn.batch_flatten", [n["add"]], name="flat")
    n["fc_w"] = b.const(rng.uniform(-0.2, 0.2, (10, 72)).astype(np.float32))
    n["dense"] = b.call("nn.dense", [n["flat"], n["fc_w"]], name="dense")
    n["softmax"] = b.call("nn.softmax", [n["dense"]], name="softmax")
    return b, n


ORDER = ["x", "w", "bias", "conv", "maxpool", "sigmoid", "avgpool", "add", "flat", "fc_w",
         "dense", "softmax"]
VID = {name: i for i, name in enumerate(ORDER)}
STEPS = [("conv", ["x", "w", "bias"]), ("maxpool", ["conv"]), ("sigmoid", ["conv"]),
         ("avgpool", ["sigmoid"]), ("add", ["maxpool", "avgpool"]), ("dense", ["flat", "fc_w"]),
         ("softmax", ["dense"])]


def _kernel(node: Node) -> Kernel:
    """conv2d and dense run their template (default config), as builds do; the rest
    plain kernels."""
    workload = node_workload(node)
    if workload is None:
        return lower(node)
    template = get_template(workload.template)
    return template.codegen(workload, template.default_config(workload), "opencl",
                            Epilogue(tuple(node.attr("epilogue", ()))))


def make_program(outputs: tuple[str, ...] = ("softmax",)) -> tuple[Program, list[np.ndarray]]:
    """The program written out by hand, and numpy's answer for input ``X``."""
    b, n = _graph()
    program = Program(
        values=[n[name].ty for name in ORDER],
        inputs=[("x", VID["x"])],
        outputs=[VID[o] for o in outputs],
        constants={VID[c]: n[c].value for c in ("w", "bias", "fc_w")},  # type: ignore[misc]
        steps=[Step(name, _kernel(n[name]), (*(VID[a] for a in args), VID[name]))
               for name, args in STEPS],
        aliases={VID["flat"]: VID["add"]},
    )
    expected = evaluate(b.finish([n[o] for o in outputs]), {"x": X})
    return program, expected


@pytest.fixture(scope="module")
def executor(device: Device) -> GraphExecutor:
    return GraphExecutor(make_program()[0], device)


def test_runs_and_matches_numpy(executor: GraphExecutor) -> None:
    _, expected = make_program()
    for inputs in ({"x": X}, [X]):  # by name or by position; twice on the same pool
        (got,) = executor.run(inputs)
        np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-5)


def test_storage_plan_reuses_buffers(executor: GraphExecutor) -> None:
    """Intermediates share pool buffers, and never two values live at the same time."""
    program = executor.program
    assert executor.planned_bytes < executor.naive_bytes
    plan = plan_storage(program)
    assert len(plan.pool_bytes) < len(plan.slot)
    root = {**{v: v for v in range(len(program.values))}, **program.aliases}
    live: dict[int, tuple[int, int]] = {}
    for k, step in enumerate(program.steps):
        for vid in step.args:
            first, _ = live.get(root[vid], (k, k))
            live[root[vid]] = (first, k)
    for a, slot_a in plan.slot.items():
        for b, slot_b in plan.slot.items():
            if a < b and slot_a == slot_b:
                (a0, a1), (b0, b1) = live[a], live[b]
                assert a1 < b0 or b1 < a0, (a, b)
    pinned = {VID[name] for name in ("x", "w", "bias", "fc_w", "softmax")}
    assert not pinned & set(plan.slot)
    assert VID["flat"] not in plan.slot and VID["add"] in plan.slot


def test_alias_output_keeps_its_storage(device: Device) -> None:
    """An output reached through an alias pins the aliased value: still right after
    later steps run."""
    program, expected = make_program(outputs=("flat", "softmax"))
    assert VID["add"] not in plan_storage(program).slot
    got = GraphExecutor(program, device).run({"x": X})
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_two_executors_sharing_kernel_objects_keep_their_own_arguments(
        device: Device) -> None:
    """Two executors of one program on one device launch the same kernel objects (the
    device caches programs by source) on their own buffers; each prepares its launches
    once (``Device.prepare``), so a launch must still bind its own arguments after the
    other executor's: runs interleaved, each gives its own input's answer."""
    program, expected = make_program()
    other_x = -X
    b, n = _graph()
    other = evaluate(b.finish([n["softmax"]]), {"x": other_x})
    first, second = GraphExecutor(program, device), GraphExecutor(program, device)
    for _ in range(2):
        (got,) = first.run({"x": X})
        np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-5)
        (got,) = second.run({"x": other_x})
        np.testing.assert_allclose(got, other[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(expected[0], other[0])


def test_benchmark_and_profile(executor: GraphExecutor) -> None:
    executor.set_inputs({"x": X})
    result = executor.benchmark(number=3, repeat=2)
    assert len(result.costs) == 2 and all(c > 0 for c in result.costs)
    assert result.mean > 0 and result.median > 0 and result.std >= 0
    assert len(executor.benchmark(number=1, repeat=1, min_repeat_ms=1.0).costs) == 1
    steps = executor.profile(number=2)
    assert [s.name for s in steps] == [name for name, _ in STEPS]
    assert all(s.seconds > 0 for s in steps)
    assert sum(s.share for s in steps) == pytest.approx(1.0)


def test_wrong_inputs_name_the_input(executor: GraphExecutor) -> None:
    with pytest.raises(ValueError, match=r"input x: shape \[1, 4, 6, 5\]"):
        executor.run({"x": X[..., :5]})
    with pytest.raises(ValueError, match="missing input.*x"):
        executor.run({"y": X})
    with pytest.raises(ValueError, match="takes 1 input"):
        executor.run([X, X])


def test_bad_programs_are_refused(device: Device) -> None:
    program, _ = make_program()
    broken = dataclasses.replace(program.steps[1].kernel, source="this is not C")
    steps = [*program.steps]
    steps[1] = dataclasses.replace(steps[1], kernel=broken)
    with pytest.raises(BuildError, match="step maxpool"):
        GraphExecutor(dataclasses.replace(program, steps=steps), device)
    steps = [*program.steps]
    steps[0], steps[1] = steps[1], steps[0]
    with pytest.raises(ValueError, match="step maxpool: reads value 3 before"):
        GraphExecutor(dataclasses.replace(program, steps=steps), device)
    steps = [dataclasses.replace(program.steps[0], args=program.steps[0].args[:-1]),
             *program.steps[1:]]
    with pytest.raises(ValueError, match="step conv: 3 arguments for 4 kernel buffers"):
        GraphExecutor(dataclasses.replace(program, steps=steps), device)


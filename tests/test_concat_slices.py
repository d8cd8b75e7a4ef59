"""Concatenation by writing into slices of one buffer (issue 17, point 4).

A concatenation along channels of N = 1 tensors runs no kernel: its inputs are views
of its storage (``Program.views``), so the convolutions that compute them write their
channel slices in place, and only an input that cannot (a graph input) is copied into
its slice. Checked here: the built model equals numpy, no concatenate step remains and
only the model input is copied, nested concatenations (DenseNet's growing feature map)
share one buffer, the storage plan never lets two live values overlap except a part and
the whole it is a slice of, and the executor refuses views that do not tile their whole
or that the device cannot make.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from compiler.build_module import Module, build
from compiler.ir import Graph, GraphBuilder, Node, TensorType, evaluate
from compiler.runtime.device import Device
from compiler.runtime.executor import GraphExecutor, Program, place, plan_storage

RNG = np.random.default_rng(3)


def _conv(b: GraphBuilder, x: Node, co: int, k: int, name: str) -> Node:
    w = b.const(RNG.normal(0, 0.3, (co, x.ty.shape[1], k, k)).astype(np.float32))
    return b.call("nn.conv2d", [x, w], name=name, padding=(k // 2,) * 4)


def dense_block(n: int = 1, hw: int = 8) -> Graph:
    """Two DenseNet-style layers on an 8-channel input: cat1 = [relu(conv a), x, conv c],
    cat2 = [cat1, conv d(relu(cat1))], then a 1x1 conv; cat1 takes the model input."""
    b = GraphBuilder()
    x = b.input("x", (n, 8, hw, hw))
    a = b.call("nn.relu", [_conv(b, x, 16, 3, "a")], name="ra")
    c = _conv(b, x, 8, 1, "c")
    cat1 = b.call("concatenate", [a, x, c], name="cat1", axis=1)
    d = _conv(b, b.call("nn.relu", [cat1], name="r1"), 8, 3, "d")
    cat2 = b.call("concatenate", [cat1, d], name="cat2", axis=1)
    return b.finish([_conv(b, cat2, 4, 1, "out")])


def _input(graph: Graph) -> np.ndarray:
    return RNG.uniform(-1, 1, graph.inputs[0].ty.shape).astype(np.float32)


def _ops(module: Module) -> list[str]:
    return [step.name.split()[0] for step in module.program.steps]


def _check_plan_sound(program: Program) -> None:
    """No two values whose bytes overlap in one buffer are live at once, unless one is
    a view (a part, or a part of a part) of the other. A value is live from the first
    step that writes it (or a part of it) to the last step that reads or writes it, an
    alias of it or a part of it."""
    plan = plan_storage(program)
    count = len(program.values)
    places = [place(program, v) for v in range(count)]
    within: dict[int, set[int]] = {v: {v} for v in range(count)}  # v and what lies in it
    for v in range(count):
        u = v
        while u in program.views or u in program.aliases:
            u = program.views[u][0] if u in program.views else program.aliases[u]
            within[u].add(v)
    live: dict[int, list[int]] = {}
    for k, step in enumerate(program.steps):
        for v in step.args:
            for u in (u for u in range(count) if v in within[u]):
                span = live.setdefault(u, [k, k])
                span[1] = k
    storage = {v: plan.slot.get(places[v][0], ("pinned", places[v][0])) for v in live}
    for a in live:
        for b in live:
            if a >= b or storage[a] != storage[b] or a in within[b] or b in within[a]:
                continue
            (a0, a1), (b0, b1) = live[a], live[b]
            lo_a, lo_b = places[a][1], places[b][1]
            bytes_overlap = (lo_a < lo_b + program.values[b].nbytes
                             and lo_b < lo_a + program.values[a].nbytes)
            assert not (bytes_overlap and a0 <= b1 and b0 <= a1), (a, b, live[a], live[b])


@pytest.fixture(scope="module")
def block_modules(device: Device) -> tuple[Graph, Module, Module]:
    graph = dense_block()
    return (graph, build(graph, device=device),
            build(graph, device=device, slice_concat=False))


def test_concat_inputs_written_in_place(block_modules: tuple[Graph, Module, Module]) -> None:
    graph, module, plain = block_modules
    x = _input(graph)
    (want,) = evaluate(graph, {"x": x})
    (got,) = module.run([x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(plain.run([x])[0], want, rtol=1e-4, atol=1e-4)
    assert "concatenate" not in _ops(module)
    assert _ops(plain).count("concatenate") == 2
    # only the model input is copied into its slice: the convs write theirs
    assert _ops(module).count("copy") == 1
    copy = next(s for s in module.program.steps if s.name.startswith("copy"))
    assert copy.args[0] == module.program.inputs[0][1]
    # every conv that feeds a concatenation writes a view; all into one buffer (cat2's)
    program = module.program
    roots = {place(program, s.args[-1])[0] for s in program.steps
             if s.name.split()[1] in ("a", "c", "d", "cat1")}
    assert len(roots) == 1
    assert len(program.views) == 5  # ra, c, the copied x and d in cat1 / cat2; cat1 in cat2
    assert module.executor.planned_bytes < plain.executor.planned_bytes


def test_storage_plan_is_sound(block_modules: tuple[Graph, Module, Module]) -> None:
    _, module, plain = block_modules
    _check_plan_sound(module.program)
    _check_plan_sound(plain.program)


def test_batch_and_misaligned_concats_keep_their_kernel(device: Device) -> None:
    """N = 2 (a channel slice is not one run of elements) runs both concatenate
    kernels. On 3x3 maps cat1's slices start at bytes 576 and 864 (not multiples of
    PoCL's 128-byte view alignment): cat1 runs its kernel, which then writes its slice
    of cat2 (at byte 0; d's starts at byte 1152) in place. Both equal numpy."""
    batched, small = dense_block(n=2), dense_block(hw=3)
    module = build(batched, device=device)
    assert _ops(module).count("concatenate") == 2 and not module.program.views
    x = _input(batched)
    np.testing.assert_allclose(module.run([x])[0], evaluate(batched, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)
    module = build(small, device=device)
    names = [s.name for s in module.program.steps]
    align = device.view_align
    assert ("concatenate cat1" in names) == bool(576 % align or 864 % align)
    assert ("concatenate cat2" in names) == bool(1152 % align)
    x = _input(small)
    np.testing.assert_allclose(module.run([x])[0], evaluate(small, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)
    _check_plan_sound(module.program)


def test_concat_output_is_graph_output(device: Device) -> None:
    """A concatenation that is a graph output keeps its own storage; its conv inputs
    still write into it, and a value that is an output itself is copied, not viewed."""
    b = GraphBuilder()
    x = b.input("x", (1, 8, 4, 8))
    a = _conv(b, x, 8, 3, "a")
    c = _conv(b, x, 16, 1, "c")
    cat = b.call("concatenate", [a, c, a], name="cat", axis=1)
    graph = b.finish([cat, c])
    module = build(graph, device=device)
    assert "concatenate" not in _ops(module)
    assert _ops(module).count("copy") == 2  # c (a graph output) and a's second slice
    xv = _input(graph)
    for got, want in zip(module.run([xv]), evaluate(graph, {"x": xv})):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    _check_plan_sound(module.program)


def test_executor_refuses_views_that_do_not_tile(
        block_modules: tuple[Graph, Module, Module], device: Device) -> None:
    program = block_modules[1].program
    part, (whole, offset) = next(iter(program.views.items()))
    bad = {
        "overlap or leave a gap": {**program.views, part: (whole, offset + 1)},
        "does not fit": {**program.views, part: (whole, program.values[whole].size)},
    }
    for message, views in bad.items():
        with pytest.raises(ValueError, match=message):
            GraphExecutor(dataclasses.replace(program, views=views), device)
    (name, vid), = program.inputs
    with pytest.raises(ValueError, match="cannot be parts or wholes"):
        GraphExecutor(dataclasses.replace(program, views={**program.views, vid: (whole, 0)}),
                      device)
    with pytest.raises(ValueError, match="not one of the program's"):
        GraphExecutor(dataclasses.replace(
            program, views={**program.views, part: (len(program.values), 0)}), device)


def test_misaligned_view_is_refused(block_modules: tuple[Graph, Module, Module],
                                    device: Device) -> None:
    """A part at a byte offset the device cannot view (one float past a slice that
    tiles) is refused before anything runs, naming the alignment."""
    program = block_modules[1].program
    part, (whole, offset) = max(program.views.items(), key=lambda kv: kv[1][1])
    size = program.values[part].size
    shrunk = TensorType((size - 1,), program.values[part].dtype)
    values = [*program.values, TensorType((1,), shrunk.dtype)]
    bad = dataclasses.replace(program, values=[*values[:part], shrunk, *values[part + 1:]],
                              views={**program.views, part: (whole, offset + 1),
                                     len(values) - 1: (whole, offset)})
    with pytest.raises(ValueError, match=f"multiples of {device.view_align} bytes"):
        GraphExecutor(bad, device)

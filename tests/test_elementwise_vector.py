"""Vectorised element-wise kernels (issue 17, point 4): a float chain or op whose
broadcast operands are one value over runs of 16 (8, 4, 2) elements gives each
work-item such a run as one OpenCL floatN (a loop of the same run in CUDA); a chain
read only by CPU convolutions writes their blocked NCHW[b]c data itself.

Checked: the lanes each shape gets (DenseNet's per-channel scale/shift/relu on 56x56
takes 16, on 7x7 none), results equal numpy on the vector, one-element and blocked
paths, integer chains stay one element per work-item, a build blocks the chain before
a conv, and the CUDA sources compile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import needs_nvcc, nvcc_ptx

from compiler.build_module import build
from compiler.ir import Graph, GraphBuilder, Node, evaluate
from compiler.kernels import NoKernelError, lower
from compiler.kernels.elementwise import blocks_output
from compiler.passes import fuse_elementwise
from compiler.runtime.device import Device
from compiler.templates import Kernel
from compiler.templates.base import from_blocked, to_blocked

RNG = np.random.default_rng(11)


def pre_activation_of(b: GraphBuilder, x: Node) -> Node:
    """DenseNet's folded batch-norm + relu on ``x``: x * scale + shift, relu, the scale
    and shift per channel (C, 1, 1)."""
    c, dtype = x.ty.shape[1], x.ty.dtype
    if dtype == "float32":
        scale = b.const(RNG.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32))
        shift = b.const(RNG.uniform(-0.5, 0.5, (c, 1, 1)).astype(np.float32))
    else:
        scale = b.const(RNG.integers(1, 4, (c, 1, 1)).astype(dtype))
        shift = b.const(RNG.integers(-5, 5, (c, 1, 1)).astype(dtype))
    return b.call("nn.relu", [b.call("add", [b.call("multiply", [x, scale]), shift])])


def pre_activation(shape: tuple[int, ...], dtype: str = "float32") -> Graph:
    """``pre_activation_of`` an input of ``shape``, fused into one chain."""
    b = GraphBuilder()
    return fuse_elementwise(b.finish([pre_activation_of(b, b.input("x", shape, dtype))]))


def _vector(kernel: Kernel, lanes: int = 0) -> bool:
    """Whether the kernel's body (not the prelude) loads float vectors (of ``lanes``)."""
    body = kernel.source[kernel.source.index(f"void {kernel.entry}"):]
    return f"vload{lanes or ''}" in body


def _run(graph: Graph, device: Device, feeds: dict[str, np.ndarray] | None = None
         ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(ours, numpy's) on ``feeds`` (default: random inputs), one kernel per op."""
    if feeds is None:
        feeds = {n.name: RNG.uniform(-4, 4, n.ty.shape).astype(n.ty.dtype)
                 for n in graph.inputs}
    module = build(graph, device=device, optimized=True)
    return module.run(feeds), evaluate(graph, feeds)


@pytest.mark.parametrize(("shape", "lanes"), [
    ((1, 64, 56, 56), 16), ((1, 128, 28, 28), 16), ((1, 256, 14, 14), 4),
    ((1, 512, 7, 7), 1), ((2, 3, 5, 6), 2)])
def test_pre_activation_chain(device: Device, shape: tuple[int, ...], lanes: int) -> None:
    graph = pre_activation(shape)
    (chain,) = [n for n in graph.nodes if n.op == "fused.elementwise"]
    kernel = lower(chain)
    assert _vector(kernel) == (lanes > 1)
    assert kernel.global_size[0] >= chain.ty.size // lanes
    assert kernel.grid[0] == -(-(chain.ty.size // lanes) // kernel.block[0])
    (got,), (want,) = _run(graph, device)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_broadcast_runs_pick_the_lanes(device: Device) -> None:
    """Each broadcast operand limits the run: a scalar none, (C, 1, 1) to H x W,
    (C, H, 1) to W; a full-shape operand is loaded as a vector. NaN stays NaN."""
    b = GraphBuilder()
    x = b.input("x", (1, 6, 4, 8))
    cases = {
        "scalar": (b.const(np.float32([0.5])), 16),
        "channel": (b.const(RNG.uniform(-1, 1, (6, 1, 1)).astype(np.float32)), 16),
        "row": (b.const(RNG.uniform(-1, 1, (6, 4, 1)).astype(np.float32)), 8),
        "full": (b.const(RNG.uniform(-1, 1, (1, 6, 4, 8)).astype(np.float32)), 16),
        "column": (b.const(RNG.uniform(-1, 1, (8,)).astype(np.float32)), 1),
    }
    outs = []
    for name, (operand, lanes) in cases.items():
        node = b.call("maximum", [x, operand], name=name)
        kernel = lower(node)
        assert kernel.grid[0] * kernel.block[0] >= node.ty.size // lanes, name
        assert _vector(kernel) == (lanes > 1), name
        if lanes > 1:
            assert f"vload{lanes}" in kernel.source, name
        outs.append(node)
    graph = b.finish(outs)
    feeds = {"x": RNG.uniform(-1, 1, (1, 6, 4, 8)).astype(np.float32)}
    feeds["x"][0, 2, 1, 3] = np.nan
    program_out, want = _run(graph, device, feeds)
    for got, expected in zip(program_out, want):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_allclose(got, expected, rtol=0, atol=0)


def test_integer_chain_stays_scalar(device: Device) -> None:
    graph = pre_activation((1, 16, 8, 8), "int32")
    (chain,) = [n for n in graph.nodes if n.op == "fused.elementwise"]
    assert not _vector(lower(chain))
    (got,), (want,) = _run(graph, device)
    np.testing.assert_array_equal(got, want)


@needs_nvcc
def test_vector_kernels_compile_as_cuda(tmp_path: Path) -> None:
    graph = pre_activation((1, 64, 56, 56))
    (chain,) = [n for n in graph.nodes if n.op == "fused.elementwise"]
    source = tmp_path / "chain.cu"
    source.write_text(lower(chain, "cuda").source)
    result = nvcc_ptx(source)
    assert result.returncode == 0, result.stderr


def _launch(device: Device, kernel: Kernel, arrays: list[np.ndarray]) -> np.ndarray:
    """Run one kernel on ``arrays`` (its inputs, in order); its output, as stored."""
    buffers = [device.upload(np.ascontiguousarray(a)) for a in arrays]
    out = kernel.buffers[-1]
    buffers.append(device.alloc_bytes(out.nbytes))
    device.run(device.build(kernel), kernel, buffers)
    return device.download(buffers[-1], out.shape, out.dtype)


@pytest.mark.parametrize("block", [16, 8, 4])
def test_chain_written_blocked(device: Device, block: int) -> None:
    """A chain over a full-shape operand, a per-channel one (an (N, C, 1, 1) one too)
    and a scalar, read plain and written in NCHW[block]c, equals numpy blocked."""
    shape = (2, 32, 5, 6)
    b = GraphBuilder()
    x = b.input("x", shape)
    full = b.input("full", shape)
    per_nc = b.input("per_nc", (2, 32, 1, 1))
    scale = b.const(RNG.uniform(0.5, 1.5, (32, 1, 1)).astype(np.float32))
    y = b.call("multiply", [x, scale])
    y = b.call("add", [y, full])
    y = b.call("subtract", [y, per_nc])
    y = b.call("maximum", [y, b.const(np.float32([0.1]))])
    graph = fuse_elementwise(b.finish([b.call("nn.relu", [y])]))
    (chain,) = [n for n in graph.nodes if n.op == "fused.elementwise"]
    assert blocks_output(chain, block) and not blocks_output(chain, 3)
    kernel = lower(chain, out_block=block)
    assert kernel.buffers[-1].shape == (2, 32 // block, 5, 6, block)
    feeds = {n.name: RNG.uniform(-1, 1, n.ty.shape).astype(np.float32) for n in graph.inputs}
    (want,) = evaluate(graph, feeds)
    arrays = [feeds[a.name] if a.name in feeds else a.value for a in chain.inputs]
    got = _launch(device, kernel, arrays)
    np.testing.assert_allclose(from_blocked(got, block), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, to_blocked(want, block), rtol=1e-6, atol=1e-6)


def test_pre_activation_chain_feeds_its_conv_blocked(device: Device) -> None:
    """A build that runs the chain as its own kernel (``fold_prologues=False``; a chain
    read by several convs cannot fold) writes a chain read only by CPU convolutions in
    their data block (the layout transform fused into the chain); the model still equals
    numpy, and with ``blocked_layout=False`` nothing is blocked. By default the conv
    applies the chain on its load: no chain step."""
    b = GraphBuilder()
    x = b.input("x", (1, 32, 8, 8))
    act = pre_activation_of(b, x)
    weight = b.const(RNG.normal(0, 0.2, (16, 32, 1, 1)).astype(np.float32))
    conv = b.call("nn.conv2d", [act, weight], name="conv")
    graph = b.finish([b.call("nn.relu", [conv])])
    feeds = {"x": RNG.uniform(-1, 1, (1, 32, 8, 8)).astype(np.float32)}
    (want,) = evaluate(graph, feeds)
    for blocked in (True, False):
        module = build(graph, device=device, blocked_layout=blocked, fold_prologues=False)
        chains = [s for s in module.program.steps if s.name.startswith("fused.elementwise")]
        assert len(chains) == 1
        stored = module.program.blocks.get(chains[0].args[-1], 0)
        assert stored == (16 if blocked else 0)
        np.testing.assert_allclose(module.run(feeds)[0], want, rtol=1e-4, atol=1e-5)
    module = build(graph, device=device)
    assert not [s for s in module.program.steps if s.name.startswith("fused.elementwise")]
    np.testing.assert_allclose(module.run(feeds)[0], want, rtol=1e-4, atol=1e-5)


def test_lower_refuses_blocked_output_it_cannot_write() -> None:
    graph = pre_activation((1, 12, 4, 4))
    (chain,) = [n for n in graph.nodes if n.op == "fused.elementwise"]
    with pytest.raises(NoKernelError, match=r"NCHW\[8\]c"):
        lower(chain, out_block=8)  # 8 does not divide 12 channels
    relu = GraphBuilder().call("nn.relu", [graph.inputs[0]])
    with pytest.raises(NoKernelError, match="no kernel writes"):
        lower(relu, out_block=4)


@needs_nvcc
def test_blocked_chain_compiles_as_cuda(tmp_path: Path) -> None:
    graph = pre_activation((1, 64, 14, 14))
    (chain,) = [n for n in graph.nodes if n.op == "fused.elementwise"]
    source = tmp_path / "chain_blocked.cu"
    source.write_text(lower(chain, "cuda", out_block=16).source)
    result = nvcc_ptx(source)
    assert result.returncode == 0, result.stderr

"""Every plain kernel computes what the IR's numpy semantics compute.

Each case is a one-node graph (graph inputs and constants as operands) lowered with
``compiler.kernels.lower``, run on the local OpenCL device and compared with
``compiler.ir.evaluate`` (rtol 1e-4, atol 1e-5); the CUDA sources of the same cases
compile with ``nvcc -ptx -arch=sm_80``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import needs_nvcc, nvcc_ptx

from compiler.ir import GraphBuilder, Node, evaluate
from compiler.kernels import NoKernelError, lower
from compiler.runtime.device import Device
from compiler.templates import Prologue

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Maker:
    """Builds a one-node graph and the random arrays to feed it."""

    def __init__(self, seed: int) -> None:
        self.b = GraphBuilder()
        self.rng = np.random.default_rng(seed)
        self.feeds: dict[str, np.ndarray] = {}

    def _array(self, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    def input(self, *shape: int, lo: float = -1.0, hi: float = 1.0) -> Node:
        name = f"x{len(self.feeds)}"
        self.feeds[name] = self._array(shape, lo, hi)
        return self.b.input(name, shape)

    def const(self, *shape: int, lo: float = -1.0, hi: float = 1.0) -> Node:
        return self.b.const(self._array(shape, lo, hi))

    def call(self, op: str, *args: Node, **attrs: Any) -> Node:
        return self.b.call(op, args, name=f"the_{op}", **attrs)


def _conv(m: Maker, groups: int, epilogue: tuple[str, ...] | None, c: int = 8, co: int = 8,
          **attrs: Any) -> Node:
    data = m.input(2, c, 9, 9)
    weight = m.const(co, c // groups, 3, 3)
    if epilogue is None:
        return m.call("nn.conv2d", data, weight, groups=groups, **attrs)
    args = [data, weight]
    if "bias" in epilogue:
        args.append(m.const(co))
    if "add" in epilogue:
        probe = GraphBuilder().call("nn.conv2d", [data, weight], groups=groups, **attrs)
        args.append(m.input(*probe.ty.shape))
    return m.call("fused.conv2d", *args, groups=groups, epilogue=epilogue, **attrs)


def _shared_operand_chain(m: Maker) -> Node:
    """One vector as a channel bias and as a last-axis addend, as fuse_elementwise
    passes it: once per step."""
    v = m.const(4)
    return m.call("fused.elementwise", m.input(1, 4, 4, 4), v, v,
                  chain=(("nn.bias_add", 1, (("axis", 1),)), ("add", 2, ())))


POOL = dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1))
EPILOGUES = (("bias",), ("relu",), ("add",), ("bias", "relu"), ("bias", "add", "relu"),
             ("relu", "add"))

CASES: dict[str, Callable[[Maker], Node]] = {
    # element-wise, broadcasting either operand
    "add.same": lambda m: m.call("add", m.input(2, 3, 4, 5), m.input(2, 3, 4, 5)),
    "add.channel_const": lambda m: m.call("add", m.input(2, 3, 4, 5), m.const(3, 1, 1)),
    "multiply.both_broadcast": lambda m: m.call("multiply", m.input(4, 1, 5), m.input(3, 1)),
    "subtract.scalar": lambda m: m.call("subtract", m.input(2, 3), m.const()),
    "divide.lhs_broadcast": lambda m: m.call("divide", m.const(1, 3, 1, 1),
                                             m.input(2, 3, 4, 5, lo=0.5, hi=2.0)),
    "relu": lambda m: m.call("nn.relu", m.input(3, 50)),
    "leaky_relu": lambda m: m.call("nn.leaky_relu", m.input(3, 50), alpha=0.2),
    "sigmoid": lambda m: m.call("sigmoid", m.input(3, 50, lo=-30.0, hi=30.0)),
    "copy": lambda m: m.call("copy", m.input(7, 3)),
    "bias_add.axis1": lambda m: m.call("nn.bias_add", m.input(2, 8, 3, 3), m.const(8)),
    "bias_add.last": lambda m: m.call("nn.bias_add", m.input(4, 6), m.const(6), axis=-1),
    "batch_norm": lambda m: m.call("nn.batch_norm", m.input(2, 4, 5, 5), m.const(4),
                                   m.const(4), m.const(4), m.const(4, lo=0.1, hi=2.0),
                                   epsilon=1e-3),
    "chain.scale_shift_relu": lambda m: m.call(
        "fused.elementwise", m.input(2, 5, 4, 4), m.const(5, 1, 1), m.const(5), m.const(1),
        chain=(("multiply", 1, ()), ("nn.bias_add", 2, (("axis", 1),)),
               ("subtract", 3, ()), ("nn.relu", -1, ()), ("nn.leaky_relu", -1,
                                                          (("alpha", 0.3),)))),
    "chain.shared_operand": lambda m: _shared_operand_chain(m),
    # pooling
    "max_pool.3x3s2p1": lambda m: m.call("nn.max_pool2d", m.input(1, 4, 11, 11), **POOL),
    "max_pool.ceil": lambda m: m.call("nn.max_pool2d", m.input(1, 2, 8, 8), pool_size=(3, 3),
                                      strides=(2, 2), ceil_mode=True),
    "max_pool.dilated_asym_pad": lambda m: m.call(
        "nn.max_pool2d", m.input(1, 3, 9, 10), pool_size=(2, 3), strides=(1, 2),
        padding=(0, 1, 1, 0), dilation=(2, 2)),
    "avg_pool.exclude_pad": lambda m: m.call("nn.avg_pool2d", m.input(1, 4, 11, 11), **POOL),
    "avg_pool.include_pad": lambda m: m.call("nn.avg_pool2d", m.input(1, 4, 11, 11),
                                             count_include_pad=True, **POOL),
    "avg_pool.include_pad_ceil": lambda m: m.call(
        "nn.avg_pool2d", m.input(1, 3, 10, 10), pool_size=(3, 3), strides=(2, 2),
        padding=(1, 1, 1, 1), ceil_mode=True, count_include_pad=True),
    "avg_pool.include_asym_pad_ceil": lambda m: m.call(
        "nn.avg_pool2d", m.input(1, 2, 9, 8), pool_size=(3, 2), strides=(2, 3),
        padding=(2, 0, 1, 1), ceil_mode=True, count_include_pad=True),
    "avg_pool.exclude_pad_ceil_dilated": lambda m: m.call(
        "nn.avg_pool2d", m.input(1, 3, 10, 9), pool_size=(2, 2), strides=(2, 2),
        padding=(1, 0, 0, 1), dilation=(2, 1), ceil_mode=True),
    "global_avg_pool": lambda m: m.call("nn.global_avg_pool2d", m.input(2, 5, 7, 7)),
    # softmax, lrn
    "softmax.axis1": lambda m: m.call("nn.softmax", m.input(2, 10, 3, 3, lo=-5, hi=5), axis=1),
    "softmax.last": lambda m: m.call("nn.softmax", m.input(4, 1000, lo=-20, hi=20)),
    "lrn.size5": lambda m: m.call("nn.lrn", m.input(1, 8, 4, 4), size=5, alpha=0.5),
    "lrn.size4_last_axis": lambda m: m.call("nn.lrn", m.input(2, 3, 6), size=4, axis=-1,
                                            alpha=0.3, beta=0.5, bias=2.0),
    # data movement
    "concat.3_axis1": lambda m: m.call("concatenate", m.input(2, 3, 4, 4), m.const(2, 1, 4, 4),
                                       m.input(2, 5, 4, 4), axis=1),
    "concat.last": lambda m: m.call("concatenate", m.input(3, 2), m.input(3, 5), axis=-1),
    "transpose.nhwc": lambda m: m.call("transpose", m.input(2, 3, 4, 5), axes=(0, 2, 3, 1)),
    "transpose.reverse": lambda m: m.call("transpose", m.input(2, 3, 4)),
    "pad": lambda m: m.call("nn.pad", m.input(2, 3, 4, 5),
                            pad_width=((0, 0), (1, 0), (2, 1), (0, 3)), pad_value=-1.5),
    "full": lambda m: m.call("full", shape=(3, 4), fill_value=2.5),
    # conv2d: plain, strided / dilated / asymmetric padding, grouped, depthwise
    "conv2d.3x3p1": lambda m: _conv(m, 1, None, padding=(1, 1, 1, 1)),
    "conv2d.s2_d2_asym_pad": lambda m: _conv(m, 1, None, strides=(2, 2), dilation=(2, 2),
                                             padding=(0, 1, 2, 1)),
    "conv2d.groups2": lambda m: _conv(m, 2, None, co=6, padding=(1, 1, 1, 1)),
    "conv2d.depthwise_s2": lambda m: _conv(m, 8, None, strides=(2, 2), padding=(1, 1, 1, 1)),
    "conv2d.depthwise_x2": lambda m: _conv(m, 4, None, c=4, co=8, padding=(1, 1, 1, 1)),
    **{f"fused_conv2d.groups2.{'+'.join(ep)}":
       (lambda m, ep=ep: _conv(m, 2, ep, co=6, padding=(1, 1, 1, 1))) for ep in EPILOGUES},
    **{f"fused_conv2d.depthwise.{'+'.join(ep)}":
       (lambda m, ep=ep: _conv(m, 8, ep, strides=(2, 2), padding=(1, 1, 1, 1)))
       for ep in EPILOGUES},
}


def _case(name: str) -> tuple[Maker, Node]:
    maker = Maker(seed=sorted(CASES).index(name))
    return maker, CASES[name](maker)


def run_node(device: Device, node: Node, feeds: dict[str, np.ndarray]) -> np.ndarray:
    kernel = lower(node, device.dialect)
    arrays = [arg.value if arg.is_const else feeds[arg.name] for arg in node.inputs]
    out = device.alloc(node.ty.shape)
    buffers = [*(device.upload(a) for a in arrays), out]
    device.run(device.build(kernel), kernel, buffers)
    return device.download(out, node.ty.shape)


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_numpy(device: Device, name: str) -> None:
    maker, node = _case(name)
    graph = maker.b.finish([node])
    (expected,) = evaluate(graph, maker.feeds)
    got = run_node(device, node, maker.feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("dialect", ["opencl", "cuda"])
def test_kernel_contract(dialect: str) -> None:
    """Buffers: one per input in order, then the output; C identifiers; grid covers it."""
    for name in CASES:
        _, node = _case(name)
        kernel = lower(node, dialect)
        assert kernel.dialect == dialect and IDENT.fullmatch(kernel.entry), name
        assert [b.shape for b in kernel.buffers] == [a.ty.shape for a in node.inputs] + [
            node.ty.shape], name
        assert [b.role for b in kernel.buffers] == ["in"] * len(node.inputs) + ["out"], name
        assert all(IDENT.fullmatch(b.name) for b in kernel.buffers), name
        guard = re.search(r"if \(i >= (\d+)\) return;", kernel.source)
        assert guard and kernel.grid[1:] == kernel.block[1:] == (1, 1), name
        items = int(guard.group(1))
        assert items <= kernel.global_size[0] < items + kernel.block[0], name


def test_ops_without_a_kernel_name_the_node() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 6))
    with pytest.raises(NoKernelError, match=r"reshape flat.*alias"):
        lower(b.call("reshape", [x], name="flat", newshape=(12,)))
    with pytest.raises(NoKernelError, match=r"input x"):
        lower(x)
    ints = b.input("ids", (4,), dtype="int64")
    with pytest.raises(NoKernelError, match=r"copy ids_copy.*int64"):
        lower(b.call("copy", [ints], name="ids_copy"))
    with pytest.raises(ValueError, match="dialect"):
        lower(b.call("nn.relu", [x]), "metal")


# ---- pools applying a prologue (a pre-activation chain) on what they read ----

POOL_PROLOGUES = {
    "avg 2x2/2": ("nn.avg_pool2d", (1, 6, 8, 8), {"pool_size": (2, 2), "strides": (2, 2)}),
    "avg 3x3/2 padded, counted": ("nn.avg_pool2d", (2, 5, 9, 7), {
        "pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1),
        "count_include_pad": True}),
    "avg 9x9 looped, ceil": ("nn.avg_pool2d", (1, 3, 10, 10), {
        "pool_size": (9, 9), "strides": (2, 2), "ceil_mode": True}),  # past the unrolled
    "avg 3-D": ("nn.avg_pool3d", (1, 4, 4, 6, 6), {
        "pool_size": (2, 2, 2), "strides": (2, 2, 2)}),
    "global avg": ("nn.global_avg_pool2d", (2, 6, 7, 7), {}),
}


@pytest.mark.parametrize("name", list(POOL_PROLOGUES))
def test_pools_apply_a_prologue_on_what_they_read(device: Device, name: str) -> None:
    """pool(relu(x * scale + shift)) per channel; padding stays 0 (it pads the chain's
    output, not x)."""
    op, shape, attrs = POOL_PROLOGUES[name]
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    vectors = {"scale": rng.uniform(-1, 2, shape[1]).astype(np.float32),
               "shift": rng.uniform(-0.5, 0.5, shape[1]).astype(np.float32)}
    b = GraphBuilder()
    node = b.call(op, [b.input("x", shape)], name="pool", **attrs)
    where = (1, -1, *(1,) * (len(shape) - 2))
    chained = np.maximum(x * vectors["scale"].reshape(where)
                         + vectors["shift"].reshape(where), 0).astype(np.float32)
    (want,) = evaluate(b.finish([node]), {"x": chained})
    prologue = Prologue(("scale", "shift", "relu"))
    kernel = lower(node, device.dialect, prologue=prologue)
    assert [b.name for b in kernel.buffers] == ["data", "pro_scale", "pro_shift", "out"]
    out = device.alloc(node.ty.shape)
    device.run(device.build(kernel), kernel,
               [device.upload(x), *(device.upload(vectors[op]) for op in ("scale", "shift")),
                out])
    np.testing.assert_allclose(device.download(out, node.ty.shape), want, rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_only_pools_in_nchw_take_a_prologue() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 8, 4, 4))
    relu = Prologue(("relu",))
    with pytest.raises(NoKernelError, match="no kernel applies a prologue"):
        lower(b.call("nn.max_pool2d", [x], pool_size=(2, 2), strides=(2, 2)), prologue=relu)
    with pytest.raises(NoKernelError, match=r"prologue for it in NCHW\[8\]c"):
        lower(b.call("nn.avg_pool2d", [x], pool_size=(2, 2), strides=(2, 2)), out_block=8,
              prologue=relu)


# ---- CUDA: every case's source compiles with nvcc ----



@needs_nvcc
def test_cuda_sources_compile_with_nvcc(tmp_path: Path) -> None:
    """All cases in one .cu file (entries renamed apart): nvcc's start-up dominates."""
    sources, entries = [], []
    for i, name in enumerate(CASES):
        kernel = lower(_case(name)[1], "cuda")
        entry = f"{kernel.entry}_{i}"
        sources.append(re.sub(rf"\b{kernel.entry}\b", entry, kernel.source))
        entries.append(entry)
    path = tmp_path / "kernels.cu"
    path.write_text("\n".join(sources))
    proc = nvcc_ptx(path, timeout=300)
    assert proc.returncode == 0, proc.stderr[:4000]
    ptx = path.with_suffix(".ptx").read_text()
    assert set(re.findall(r"\.entry\s+(\w+)", ptx)) == set(entries)

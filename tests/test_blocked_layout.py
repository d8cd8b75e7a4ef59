"""Blocked NCHW[x]c activations for ``conv2d_NCHWc.x86`` (issue 5: "the blocked layout is
kept between consecutive convolutions, with layout transforms only where a non-blocked
op needs them").

Kernel level: random valid configs of ResNet-50 layers with the data, output and
residual each in plain NCHW or NCHW[b]c (b in 4, 8, 16, oc_bn) equal numpy once numpy
converts the layouts. Build level: the compiler's layout plan keeps conv outputs blocked
when only convolutions read them and plain where another op (a pool, a graph output)
does, and the built model equals the graph interpreter / onnxruntime. Whole-model
latency, plain everywhere against the blocked plan, is printed, never asserted.
"""

from __future__ import annotations

import random
import re
import zlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import nchwc_config, nchwc_workload, needs_nvcc, nvcc_ptx
from conftest import run_blocked as run_with_prologue

from compiler.build_module import Module, build, load_graph, plan_layouts, select_layers
from compiler.ir import GraphBuilder, evaluate
from compiler.kernels import lower
from compiler.kernels.pool import pools_blocked
from compiler.passes import optimize
from compiler.runtime.device import Device
from compiler.runtime.measure import max_abs_error_ok
from compiler.templates import Epilogue, IOLayout, Prologue, get_template
from compiler.templates.base import blocked_shape, from_blocked, to_blocked
from schemas import Config, DeviceLimits, MeasureOptions, Target, Workload

NAME = "conv2d_NCHWc.x86"
TEMPLATE = get_template(NAME)
CPU = Target.parse("opencl -model=pocl-cpu")
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
CHECK = MeasureOptions()  # rtol 1e-4, atol 1e-4 x max|ref|: what every trial is held to
FULL = Epilogue(("bias", "add", "relu"))
CONFIGS_PER_WORKLOAD = 4
BLOCKS = (0, 4, 8, 16)  # and each config's oc_bn


# ResNet-50: stage 2's padded 3x3 (border copies), v1.5's stride-2 3x3, a stage-4 1x1
# and stage 5's 7x7 1x1 (odd height: a tile_oh = 2 tail).
WORKLOADS: dict[str, Workload] = {
    "res2.3x3": nchwc_workload(1, 64, 56, 64, 3, 1, 1),
    "res3a.3x3s2": nchwc_workload(1, 128, 56, 128, 3, 2, 1),
    "res4.1x1": nchwc_workload(1, 1024, 14, 256, 1, 1, 0),
    "res5.1x1": nchwc_workload(1, 2048, 7, 512, 1, 1, 0),
}


def blocks_for(channels: int, oc_bn: int) -> list[int]:
    return sorted({b for b in (*BLOCKS, oc_bn) if not b or channels % b == 0})


@cache
def cases(name: str) -> tuple[tuple[Config, IOLayout], ...]:
    """Seeded random configs; per config one layout chained as the compiler does (output
    in NCHW[oc_bn]c) and one drawn at random from the blocks that divide the channels."""
    wl = WORKLOADS[name]
    op = TEMPLATE.parse(wl)
    rng = random.Random(zlib.crc32(f"blocked/{name}".encode()))
    found: dict[int, Config] = {}
    while len(found) < CONFIGS_PER_WORKLOAD:
        config = TEMPLATE.random_config(wl, rng, CPU_LIMITS)
        found.setdefault(config.index, config)
    out = []
    for config in found.values():
        oc_bn = TEMPLATE.out_block(wl, config)
        data, res = blocks_for(op.c, oc_bn), blocks_for(op.co, oc_bn)
        out.append((config, IOLayout(rng.choice(data), oc_bn, rng.choice(res))))
        out.append((config, IOLayout(rng.choice(data), rng.choice(res), rng.choice(res))))
    return tuple(out)


@cache
def operands(wl: Workload) -> tuple[list[np.ndarray], np.ndarray]:
    """Inputs for the full epilogue (bias, add, relu) and the conv alone in float64."""
    arrays = TEMPLATE.make_inputs(wl, FULL, np.random.default_rng(7))
    return arrays, TEMPLATE.compute_reference(wl, arrays[:2])


def run_blocked(device: Device, wl: Workload, config: Config, epilogue: Epilogue,
                io: IOLayout) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's output converted back to NCHW, and numpy's."""
    arrays, conv = operands(wl)
    bias, residual = arrays[2], arrays[3]
    want = epilogue.apply(conv, bias, residual, 1)
    kernel = TEMPLATE.codegen(wl, config, device.dialect, epilogue, io)
    inputs = [to_blocked(arrays[0], io.data_block), TEMPLATE.pack_weight(wl, config, arrays[1])]
    if "bias" in epilogue.ops:
        inputs.append(bias)
    if "add" in epilogue.ops:
        inputs.append(to_blocked(residual, io.residual_block))
    assert [a.shape for a in inputs] == [b.shape for b in kernel.buffers[:-1]]
    out_shape = kernel.buffers[-1].shape
    assert out_shape == blocked_shape(want.shape, io.out_block)
    program = device.build(kernel)
    buffers = [device.upload(np.ascontiguousarray(a)) for a in inputs]
    out = device.alloc(out_shape)
    device.run(program, kernel, [*buffers, out])
    return from_blocked(device.download(out, out_shape), io.out_block), want


# ---- no device ----

def test_layout_helpers_round_trip_and_index_as_documented() -> None:
    x = np.random.default_rng(0).standard_normal((2, 12, 3, 5)).astype(np.float32)
    for b in (0, 1, 2, 3, 4, 6, 12):
        y = to_blocked(x, b)
        assert y.shape == blocked_shape(x.shape, b)
        assert np.array_equal(from_blocked(y, b), x)
        if b:  # element (n, c, h, w) at ((((n * C/b + c // b) * H + h) * W + w) * b + c % b
            flat = y.ravel()
            for n, c, h, w in [(0, 0, 0, 0), (1, 7, 2, 4), (1, 11, 1, 3)]:
                at = (((n * (12 // b) + c // b) * 3 + h) * 5 + w) * b + c % b
                assert flat[at] == x[n, c, h, w]
    with pytest.raises(ValueError, match="block 5 does not divide its 12 channels"):
        blocked_shape(x.shape, 5)
    with pytest.raises(ValueError, match="integer >= 0"):
        IOLayout(data_block=-1)


def test_codegen_takes_io_only_where_a_template_has_blocked_io() -> None:
    wl = WORKLOADS["res2.3x3"]
    config = TEMPLATE.default_config(wl)
    plain = TEMPLATE.codegen(wl, config)
    # the default and an explicit plain layout give the same kernel (the NCHW fast path)
    assert TEMPLATE.codegen(wl, config, io=IOLayout()).source == plain.source
    assert plain.buffers[0].shape == (1, 64, 56, 56) and plain.buffers[-1].shape == (1, 64, 56, 56)
    blocked = TEMPLATE.codegen(wl, config, "opencl", FULL, IOLayout(8, 16, 4))
    assert [b.shape for b in blocked.buffers] == [
        (1, 8, 56, 56, 8), (4, 4, 3, 3, 16, 16), (64,), (1, 16, 56, 56, 4), (1, 4, 56, 56, 16)]
    assert blocked.meta["io"] == IOLayout(8, 16, 4)
    assert "VSTORE(16," in blocked.source  # out_block == oc_bn: vector stores
    gpu = get_template("conv2d_nchw.cuda")
    gpu_wl = Workload(template=gpu.name, args=[*wl.args[:5], "float32"])
    gpu_config = gpu.default_config(gpu_wl)
    assert gpu.codegen(gpu_wl, gpu_config, io=IOLayout()).source == \
        gpu.codegen(gpu_wl, gpu_config).source
    with pytest.raises(ValueError, match="plain NCHW only"):
        gpu.codegen(gpu_wl, gpu_config, io=IOLayout(out_block=16))
    with pytest.raises(ValueError, match="block 3 does not divide its 64 channels"):
        TEMPLATE.codegen(wl, config, io=IOLayout(data_block=3))
    with pytest.raises(ValueError, match="reads no residual"):
        TEMPLATE.codegen(wl, config, io=IOLayout(residual_block=16))


def test_cases_cover_every_block_and_both_store_paths() -> None:
    drawn = [(TEMPLATE.decode(WORKLOADS[n], c), io) for n in WORKLOADS for c, io in cases(n)]
    for field in ("data_block", "out_block", "residual_block"):
        assert {getattr(io, field) for _, io in drawn} >= {0, 4, 8, 16}, field
    oc_bns = {k["tile_oc"][1] for k, _ in drawn}
    assert oc_bns - {4, 8, 16}, "some config's oc_bn is none of the fixed blocks"
    assert any(io.out_block == k["tile_oc"][1] and io.residual_block != io.out_block
               for k, io in drawn)


# ---- on the OpenCL device ----

@pytest.mark.parametrize("name", list(WORKLOADS))
def test_blocked_io_matches_numpy(device: Device, name: str) -> None:
    wl = WORKLOADS[name]
    failures = []
    for config, io in cases(name):
        got, want = run_blocked(device, wl, config, FULL, io)
        ok, why = max_abs_error_ok(got, want, CHECK)
        if not ok:
            failures.append(f"{io} {TEMPLATE.decode(wl, config)}: {why}")
    assert not failures, "\n".join(failures)


def test_other_epilogues_border_copies_and_odd_blocks(device: Device) -> None:
    """Epilogues without a residual or with relu before it; border blocks of the 7x7
    stem; a layer whose channel blocks do not nest (ic_bn 6 against data block 8,
    oc_bn 8 against out block 12): the general index paths."""
    stem = nchwc_workload(1, 8, 30, 16, 7, 2, 3)
    odd = nchwc_workload(1, 24, 10, 24, 3, 1, 1)
    wl3 = WORKLOADS["res2.3x3"]
    runs = [
        (wl3, nchwc_config(wl3, tile_ic=16, tile_oc=16, tile_ow=8, vec=8, wg=2),
         Epilogue(("bias", "relu")), IOLayout(16, 16)),
        (wl3, nchwc_config(wl3, tile_ic=8, tile_oc=32, tile_ow=7, vec=4, unroll_kw=False),
         Epilogue(("relu", "add")), IOLayout(4, 32, 16)),
        (wl3, nchwc_config(wl3, tile_ic=4, tile_oc=8, tile_ow=4, vec=1),
         FULL, IOLayout(16, 8, 8)),
        (stem, nchwc_config(stem, tile_ic=8, tile_oc=16, tile_ow=1, unroll_kw=False),
         Epilogue(), IOLayout(4, 16)),
        (stem, nchwc_config(stem, tile_ic=2, tile_oc=4, tile_ow=15, vec=4),
         FULL, IOLayout(8, 4, 16)),
        (odd, nchwc_config(odd, tile_ic=6, tile_oc=8, tile_ow=5, vec=8),
         FULL, IOLayout(8, 12, 6)),
        (odd, nchwc_config(odd, tile_ic=6, tile_oc=8, tile_ow=10, vec=2, unroll_kw=False),
         FULL, IOLayout(12, 8, 3)),
    ]
    failures = []
    for wl, config, epilogue, io in runs:
        got, want = run_blocked(device, wl, config, epilogue, io)
        ok, why = max_abs_error_ok(got, want, CHECK)
        if not ok:
            failures.append(f"{wl.args[:2]} {epilogue.ops} {io}: {why}")
    assert not failures, "\n".join(failures)




def test_prologue_on_the_direct_template_matches_numpy(device: Device) -> None:
    """A prologue (``Prologue``) on each loaded value: a padded 3x3 layer's border copies
    (padded taps left out), the stem's 7x7 with kw rolled, a padded 1x1 whose two-row
    blocks mask rows outside the image (zeroed after the prologue), plain and blocked
    data, vectors and plain floats, unrolled channel steps."""
    wl3, stem = WORKLOADS["res2.3x3"], nchwc_workload(1, 8, 30, 16, 7, 2, 3)
    padded = nchwc_workload(1, 12, 9, 16, 1, 1, 1)
    pre = Prologue(("scale", "shift", "relu"))
    runs = [
        (wl3, nchwc_config(wl3, tile_ic=16, tile_oc=16, tile_ow=8, vec=8, unroll_ci=4),
         FULL, IOLayout(16, 16, 16), pre),
        (wl3, nchwc_config(wl3, tile_ic=8, tile_oc=32, tile_ow=7, vec=1),
         Epilogue(("bias", "relu")), IOLayout(), Prologue(("shift", "relu"))),
        (stem, nchwc_config(stem, tile_ic=2, tile_oc=4, tile_ow=15, vec=4, unroll_kw=False),
         FULL, IOLayout(4, 4, 16), pre),
        (padded, nchwc_config(padded, tile_ic=6, tile_oc=16, tile_ow=11, tile_oh=2, vec=16),
         FULL, IOLayout(4, 16), pre),
        (padded, nchwc_config(padded, tile_ic=12, tile_oc=8, tile_ow=1, tile_oh=2, vec=1),
         Epilogue(), IOLayout(), Prologue(("relu", "scale"))),
    ]
    failures = []
    for wl, config, epilogue, io, prologue in runs:
        got, want = run_with_prologue(device, TEMPLATE, wl, config, epilogue, io, prologue)
        ok, why = max_abs_error_ok(got, want, CHECK)
        if not ok:
            failures.append(f"{wl.args[:2]} {prologue.ops} {io}: {why}")
    assert not failures, "\n".join(failures)
    sources = [TEMPLATE.codegen(wl, c, "opencl", e, io, p).source for wl, c, e, io, p in runs]
    assert "rm1" in sources[3] and "} else if (owb ==" in sources[0]  # the paths covered


# a 16 -> 64 channel conv on each CPU template that fuses a residual, at oc_bn 32: tails
# where they have one (the direct 1x1's second row, the GEMMs' last pixel block,
# Winograd's cropped tiles)
RESIDUAL_CASES: dict[str, tuple[list[object], dict[str, object]]] = {
    "direct 3x3": (nchwc_workload(1, 16, 10, 64, 3, 1, 1).args, {}),
    "direct 1x1": (nchwc_workload(1, 16, 7, 64, 1, 1, 0).args,
                   {"tile_oh": 2, "tile_ow": (7, 1)}),
    "conv2d_NCHWc_1x1.x86": (nchwc_workload(1, 16, 7, 64, 1, 1, 0).args, {"tile_p": 6}),
    "conv2d_NCHWc_gemm.x86": (nchwc_workload(1, 16, 10, 64, 3, 1, 1).args, {"tile_p": 6}),
    "conv2d_NCHWc_winograd.x86": (nchwc_workload(1, 16, 10, 64, 3, 1, 1).args,
                                  {"tile_size": 4}),
}


@pytest.mark.parametrize("case", list(RESIDUAL_CASES))
def test_a_residual_in_another_block_is_read_a_vector_at_a_time(device: Device,
                                                                 case: str) -> None:
    """A tuned record's oc_bn need not be the residual producer's: the epilogue still runs
    on vectors where vec divides the residual's block (64 or 16 against oc_bn 32), lane by
    lane where it does not (4) and on plain floats (vec 1); numpy agrees either way."""
    name = case if "." in case else NAME
    template = get_template(name)
    args, knobs = RESIDUAL_CASES[case]
    wl = Workload(template=name, args=args)
    for vec, rb, vectors in ((8, 64, True), (8, 16, True), (8, 4, False), (1, 64, False)):
        values = {**template.decode(wl, template.default_config(wl)), **knobs,
                  "tile_oc": (2, 32), "vec": vec}
        cfg = template.space(wl).to_config(values)
        assert template.check_limits(wl, cfg, CPU_LIMITS) == []
        io = IOLayout(16, 32, rb)
        source = template.codegen(wl, cfg, device.dialect, FULL, io).source
        assert ("residual[" not in source) == vectors, (vec, rb, vectors)
        got, want = run_with_prologue(device, template, wl, cfg, FULL, io)
        ok, why = max_abs_error_ok(got, want, CHECK)
        assert ok, f"vec {vec} {io}: {why}"


@pytest.mark.slow
@needs_nvcc
def test_blocked_cuda_sources_compile_with_nvcc(tmp_path: Path) -> None:
    """The vector stores and vector epilogue (a residual in another block) through the
    CUDA prelude; the blocked max-pool; the 1x1 GEMM's and the direct template's
    prologues on vectors and floats (the direct one's rows masked)."""
    sources = []
    for name in ("res2.3x3", "res5.1x1"):
        for i, (config, io) in enumerate(cases(name)[:3]):
            k = TEMPLATE.codegen(WORKLOADS[name], config, "cuda", FULL, io)
            sources.append(k.source.replace(k.entry, f"{k.entry}_{len(sources)}"))
    gemm = get_template("conv2d_NCHWc_1x1.x86")
    wl = Workload(template=gemm.name, args=WORKLOADS["res5.1x1"].args)
    pre = Prologue(("scale", "shift", "relu"))
    for vec, io in ((16, IOLayout(64, 64)), (1, IOLayout())):
        knobs = {**gemm.decode(wl, gemm.default_config(wl, DeviceLimits(simd_lanes=16))),
                 "vec": vec}
        k = gemm.codegen(wl, gemm.space(wl).to_config(knobs), "cuda", FULL, io, pre)
        sources.append(k.source.replace(k.entry, f"{k.entry}_{len(sources)}"))
    for name, case in ((NAME, "direct 3x3"), ("conv2d_NCHWc_1x1.x86", "conv2d_NCHWc_1x1.x86")):
        t = get_template(name)  # a residual in another block, on vectors
        wl = Workload(template=name, args=RESIDUAL_CASES[case][0])
        knobs = {**t.decode(wl, t.default_config(wl)), "tile_oc": (2, 32), "vec": 8}
        k = t.codegen(wl, t.space(wl).to_config(knobs), "cuda", FULL, IOLayout(16, 32, 64))
        sources.append(k.source.replace(k.entry, f"{k.entry}_{len(sources)}"))
    padded = nchwc_workload(1, 12, 9, 16, 1, 1, 1)  # the direct template's masked rows
    for vec in (16, 1):
        config = nchwc_config(padded, tile_ic=6, tile_oc=16, tile_ow=11, tile_oh=2, vec=vec)
        k = TEMPLATE.codegen(padded, config, "cuda", FULL, IOLayout(4, 16), pre)
        sources.append(k.source.replace(k.entry, f"{k.entry}_{len(sources)}"))
    b = GraphBuilder()
    pool = b.call("nn.max_pool2d", [b.input("x", (1, 64, 112, 112))], pool_size=(3, 3),
                  strides=(2, 2), padding=(1, 1, 1, 1))
    k = lower(pool, "cuda", out_block=32)
    sources.append(k.source.replace(k.entry, f"{k.entry}_{len(sources)}"))
    path = tmp_path / "blocked.cu"
    path.write_text(sources[0] + "\n".join(s[s.index("KERNEL void"):] for s in sources[1:]))
    proc = nvcc_ptx(path, timeout=600)
    assert proc.returncode == 0, proc.stderr[:3000]
    entries = set(re.findall(r"\.entry\s+(\w+)", path.with_suffix(".ptx").read_text()))
    assert len(entries) == len(sources)


# ---- the compiler's layout plan ----

def branchy_graph():  # type: ignore[no-untyped-def]
    """conv1 -> conv2 -> conv3 (+ conv1 as residual) -> conv4, and a max-pool on conv2.

    conv1 (24 ch, default oc_bn 12) is read by conv2 and by conv3's residual: blocked.
    conv2 (32 ch, oc_bn 16) is read by conv3 and the pool: plain. conv3 (24 ch) feeds
    conv4 only: blocked. conv4 (20 ch, oc_bn 10) is a graph output: plain."""
    rng = np.random.default_rng(3)

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    b = GraphBuilder()
    x = b.input("x", (1, 16, 14, 14))
    pad = dict(padding=(1, 1, 1, 1))
    c1 = b.call("nn.relu", [b.call("nn.bias_add", [b.call("nn.conv2d", [x, w(24, 16, 3, 3)],
                                                          "conv1", **pad), w(24)])])
    c2 = b.call("nn.relu", [b.call("nn.bias_add", [b.call("nn.conv2d", [c1, w(32, 24, 3, 3)],
                                                          "conv2", **pad), w(32)])])
    c3 = b.call("nn.bias_add", [b.call("nn.conv2d", [c2, w(24, 32, 1, 1)], "conv3"), w(24)])
    c3 = b.call("nn.relu", [b.call("add", [c3, c1])])
    c4 = b.call("nn.conv2d", [c3, w(20, 24, 3, 3)], "conv4", **pad)
    pool = b.call("nn.max_pool2d", [c2], pool_size=(2, 2), strides=(2, 2))
    return b.finish([c4, pool])


def steps_by_layer(module: Module) -> dict[str, object]:
    return {s.name.split()[-1]: s for s in module.program.steps if "conv" in s.name}


def test_plan_blocks_conv_outputs_only_convs_read() -> None:
    """Each block is its conv's default oc_bn for the device's lanes: 12 for 24 channels
    (conv1 and the 1x1 conv3 run the direct template untuned, Winograd being preferred
    from 64 output channels on, conv1 the implicit GEMM on 8 lanes, whose default takes
    the same block; the direct 16-lane default keeps 12: 32 does not divide 24)."""
    for lanes, want in ((0, {"conv1": 12, "conv3": 12}), (8, {"conv1": 12, "conv3": 12}),
                        (16, {"conv1": 12, "conv3": 12})):
        graph = optimize(branchy_graph())
        plan, _tasks, _choices = select_layers(graph, CPU, None, DeviceLimits(simd_lanes=lanes))
        blocks = {n.name: b for n, b in plan_layouts(graph, plan).items()}
        assert blocks == want, lanes


def test_branchy_graph_keeps_blocks_between_convs_and_matches_the_interpreter() -> None:
    graph = branchy_graph()
    x = np.random.default_rng(4).uniform(-1, 1, (1, 16, 14, 14)).astype(np.float32)
    want = evaluate(graph, [x])
    module = build(graph, target="opencl -model=pocl-cpu")
    assert module.device.target.device_class == "cpu"
    # each block is its conv's default oc_bn on this device: 12 for 24 channels
    optimized = optimize(branchy_graph())
    plan, _tasks, _choices = select_layers(optimized, CPU, None, module.device.limits)
    blocks = {n.name: b for n, b in plan_layouts(optimized, plan).items()}
    b1, b3 = blocks["conv1"], blocks["conv3"]
    assert blocks == {"conv1": 12, "conv3": 12}
    steps = steps_by_layer(module)
    shapes = {name: [b.shape for b in s.kernel.buffers] for name, s in steps.items()}
    # conv1: plain graph input in, NCHW[b1]c out (read by conv2 and conv3's residual)
    assert shapes["conv1"][0] == (1, 16, 14, 14)
    assert shapes["conv1"][-1] == (1, 24 // b1, 14, 14, b1)
    # conv2: blocked in, plain out: the max-pool reads it
    assert shapes["conv2"][0] == (1, 24 // b1, 14, 14, b1)
    assert shapes["conv2"][-1] == (1, 32, 14, 14)
    # conv3: plain data, blocked residual, blocked out
    assert shapes["conv3"][0] == (1, 32, 14, 14)
    assert shapes["conv3"][-2] == (1, 24 // b1, 14, 14, b1)
    assert shapes["conv3"][-1] == (1, 24 // b3, 14, 14, b3)
    # conv4: blocked in, plain out (a graph output)
    assert shapes["conv4"][0] == (1, 24 // b3, 14, 14, b3)
    assert shapes["conv4"][-1] == (1, 20, 14, 14)
    pool = next(s for s in module.program.steps if "max_pool" in s.name)
    assert [b.shape for b in pool.kernel.buffers] == [(1, 32, 14, 14), (1, 32, 7, 7)]
    assert sorted(module.program.blocks.values()) == sorted([b1, b3])
    assert not any("layout" in s.name for s in module.program.steps)
    got = module.run([x])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))
    plain = build(graph, target="opencl -model=pocl-cpu", blocked_layout=False)
    assert not plain.program.blocks
    assert all(len(b.shape) == 4 for s in steps_by_layer(plain).values()
               for b in s.kernel.buffers if b.name in ("data", "residual", "out"))
    for g, p in zip(got, plain.run([x])):
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-6)
    assert len(module.profile(number=1)) == len(module.program.steps)


# ---- a max-pool between blocked convolutions (ResNet's stem and its pool) ----

@pytest.mark.parametrize("pool, block", [
    ({"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}, 16),  # ResNet's
    ({"pool_size": (2, 2), "strides": (2, 2)}, 8),
    ({"pool_size": (3, 3), "strides": (1, 1), "padding": (2, 1, 2, 1), "dilation": (2, 1)}, 4),
    ({"pool_size": (2, 2), "strides": (2, 2), "ceil_mode": True}, 32),  # 6 x 7: overhang
])
def test_max_pool_reads_and_writes_one_block(device: Device, pool: dict[str, object],
                                             block: int) -> None:
    """The blocked max-pool kernel equals numpy's on NCHW[block]c in and out: padding,
    dilation, ceil mode's overhang, two images, odd sizes."""
    b = GraphBuilder()
    x = b.input("x", (2, 32, 11, 13))
    graph = b.finish([b.call("nn.max_pool2d", [x], **pool)])
    (node,) = graph.outputs
    assert pools_blocked(node, block) and not pools_blocked(node, 3)
    kernel = lower(node, out_block=block)
    data = np.random.default_rng(block).uniform(-1, 1, (2, 32, 11, 13)).astype(np.float32)
    (want,) = evaluate(graph, [data])
    assert [b.shape for b in kernel.buffers] == [blocked_shape(data.shape, block),
                                                blocked_shape(want.shape, block)]
    buffers = [device.upload(to_blocked(data, block)), device.alloc(kernel.buffers[-1].shape)]
    device.run(device.build(kernel), kernel, buffers)
    got = device.download(buffers[-1], kernel.buffers[-1].shape)
    np.testing.assert_array_equal(from_blocked(got, block), want)


def stem_graph(pool_feeds_relu: bool):  # type: ignore[no-untyped-def]
    """conv (32 ch, 3x3) -> max-pool 3x3/2 -> two 1x1 convs (graph outputs); with
    ``pool_feeds_relu`` the pool is also read by a ReLU (a third output)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    stem = b.call("nn.relu", [b.call("nn.conv2d", [x, w(32, 8, 3, 3)], "stem",
                                     padding=(1, 1, 1, 1))])
    pool = b.call("nn.max_pool2d", [stem], pool_size=(3, 3), strides=(2, 2),
                  padding=(1, 1, 1, 1))
    outs = [b.call("nn.conv2d", [pool, w(24, 32, 1, 1)], "left"),
            b.call("nn.conv2d", [pool, w(16, 32, 1, 1)], "right")]
    if pool_feeds_relu:
        outs.append(b.call("nn.relu", [pool]))
    return b.finish(outs)


@pytest.mark.parametrize("pool_feeds_relu", [False, True])
def test_a_pool_between_convs_keeps_the_stems_block(device: Device,
                                                    pool_feeds_relu: bool) -> None:
    """Read only by CPU convolutions, the pool reads and writes the stem's block, so the
    stem writes it (vector stores) and the convs after read it; read by any other op
    too, the stem and the pool stay plain. Both equal the interpreter."""
    graph = stem_graph(pool_feeds_relu)
    data = np.random.default_rng(6).uniform(-1, 1, (1, 8, 16, 16)).astype(np.float32)
    want = evaluate(graph, [data])
    module = build(graph, device=device)
    stem, pool = module.program.steps[:2]
    assert "max_pool" in pool.name
    shapes = [b.shape for b in pool.kernel.buffers]
    if pool_feeds_relu:
        assert shapes == [(1, 32, 16, 16), (1, 32, 8, 8)]
        assert stem.kernel.buffers[-1].shape == (1, 32, 16, 16)
    else:
        block = stem.kernel.buffers[-1].shape[-1]
        assert shapes == [(1, 32 // block, 16, 16, block), (1, 32 // block, 8, 8, block)]
        assert stem.kernel.buffers[-1].shape == (1, 32 // block, 16, 16, block)
        left = next(s for s in module.program.steps if s.name.endswith("left"))
        assert left.kernel.buffers[0].shape == (1, 32 // block, 8, 8, block)
    for got, w in zip(module.run([data]), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


# ---- ResNet-50 ----

onnx_available = True
try:
    import onnx
    import onnxruntime as ort
except ImportError:  # pragma: no cover
    onnx_available = False


def logits_model(model):  # type: ignore[no-untyped-def]
    """``model`` without its final Softmax: with random weights the light ResNet-50's
    softmax is one-hot, which would hide small errors."""
    from onnx import helper

    g = model.graph
    softmax = [n for n in g.node if n.op_type == "Softmax"][-1]
    out = helper.make_tensor_value_info(softmax.input[0], onnx.TensorProto.FLOAT, None)
    graph = helper.make_graph([n for n in g.node if n is not softmax], g.name, g.input,
                              [out], list(g.initializer))
    new = helper.make_model(graph, opset_imports=model.opset_import)
    new.ir_version = model.ir_version
    return new


@cache
def resnet50():  # type: ignore[no-untyped-def]
    from compiler.frontend.samples import light_path, runner_input, with_random_weights

    try:
        path = light_path("resnet50")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    model = with_random_weights(onnx.load(path), seed=0)
    x = np.random.default_rng(1).uniform(0, 1, size=runner_input(model).shape)
    return model, x.astype(np.float32)


def onnxruntime_run(model, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    ort.set_default_logger_severity(3)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.slow
@pytest.mark.skipif(not onnx_available, reason="onnx / onnxruntime not installed")
def test_resnet50_blocked_matches_onnxruntime(device: Device) -> None:
    model, x = resnet50()
    module = build(model, device=device)
    convs = [s for s in module.program.steps if "conv2d" in s.name]
    blocked_out = [s for s in convs if len(s.kernel.buffers[-1].shape) == 5]
    blocked_in = [s for s in convs if len(s.kernel.buffers[0].shape) == 5]
    print(f"\nResNet-50: {len(blocked_out)} of {len(convs)} conv outputs blocked, "
          f"{len(blocked_in)} convs read blocked data")
    assert len(blocked_out) > len(convs) // 2 and len(blocked_in) > len(convs) // 2
    (got,) = module.run([x])
    np.testing.assert_allclose(got, onnxruntime_run(model, x), rtol=1e-3, atol=1e-5)
    # and the logits, where a softmax cannot round errors away
    logits = logits_model(model)
    want = onnxruntime_run(logits, x)
    (got,) = build(logits, device=device).run([x])
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.slow
@pytest.mark.skipif(not onnx_available, reason="onnx / onnxruntime not installed")
def test_resnet50_latency_plain_against_blocked(device: Device,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Template default configs, plain NCHW everywhere against the blocked plan, one run
    (interleaved repeats; a shared machine's timings vary, so printed, not asserted)."""
    model, x = resnet50()
    graph = optimize(load_graph(model))
    modules = {label: build(graph, device=device, optimized=True, blocked_layout=flag)
               for label, flag in (("plain NCHW", False), ("blocked NCHW[x]c", True))}
    outs = {label: m.run([x])[0] for label, m in modules.items()}
    np.testing.assert_allclose(*outs.values(), rtol=1e-4, atol=1e-6)
    costs: dict[str, list[float]] = {label: [] for label in modules}
    for _ in range(5):
        for label, m in modules.items():
            costs[label] += m.benchmark(number=3, repeat=1).costs
    with capsys.disabled():
        print("\nResNet-50 (PoCL, default configs), ms per run, best / median of "
              f"{len(costs['plain NCHW'])}: " + "; ".join(
                  f"{label} {min(c) * 1e3:.1f} / {np.median(c) * 1e3:.1f}"
                  for label, c in costs.items()))


def test_a_trial_times_a_cpu_conv_in_the_layout_a_build_runs_it(device: Device) -> None:
    """What a trial builds and checks: each CPU conv template's kernel reading its data
    in NCHW16c (a stem's 3 channels plain) and writing its own oc_bn, its output taken
    back to NCHW for the check against numpy, which it passes (error 0); a template
    without blocked layouts is timed plain."""
    from compiler.runtime.measure import MeasureRequest, measure, request_kernel

    stem = nchwc_workload(1, 3, 32, 16, 7, 2, 3)
    cases = [(NAME, WORKLOADS["res2.3x3"], 16), (NAME, stem, 0),
             ("conv2d_NCHWc_1x1.x86", WORKLOADS["res5.1x1"], 16),
             ("conv2d_NCHWc_winograd.x86", WORKLOADS["res2.3x3"], 16)]
    rng = random.Random(5)
    for name, args, data_block in cases:
        template = get_template(name)
        workload = Workload(template=name, args=args.args)
        for config in (template.default_config(workload, device.limits),
                       template.random_config(workload, rng, device.limits)):
            request = MeasureRequest(name, workload, config, MeasureOptions(
                number=1, repeat=1, min_repeat_ms=0))
            io = template.measure_io(workload, config)
            assert io == IOLayout(data_block, template.out_block(workload, config)), name
            _template, kernel = request_kernel(device, request)
            op = template.parse(workload)
            assert kernel.buffers[0].shape == blocked_shape(op.input_shapes[0], data_block)
            assert kernel.buffers[-1].shape == blocked_shape(op.output_shape, io.out_block)
            result = measure(device, request)
            assert result.error_no == 0, (name, config.index, result.error_msg)
    dense = get_template("dense_pack.x86")
    dense_workload = Workload(template="dense_pack.x86", args=[
        ["TENSOR", [1, 64], "float32"], ["TENSOR", [32, 64], "float32"], None, "float32"])
    assert dense.measure_io(dense_workload, dense.default_config(dense_workload)) is None

"""``conv2d_NCHWc_gemm.x86``: any CPU convolution as an implicit GEMM over (tap, channel)
with the 1x1 template's flat pixel tiles (issue 17).

No device: it takes any window, its space and default are the 1x1 template's, the packed
weight (taps, then a zero tail the padding reads), features, which layers a CPU build
prefers it on untuned. On the OpenCL device: outputs equal numpy (the measurer's
tolerance) for padded and unpadded windows, strides, dilation, asymmetric padding, two
images, blocked data of one and of several blocks (padding read from the zero tail) and
plain data (padding selected away), every vector width, tails, spare work-items and fused
epilogues; ResNet-50's layers it is preferred on, through the measurer; a build takes it
where its record is faster, chained to the other templates in blocked layouts.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import next_block_prefetch, run_blocked

from compiler.build_module import build, select_layers
from compiler.ir import GraphBuilder, evaluate
from compiler.passes import optimize
from compiler.records import DEFAULT, THIS_DEVICE, MemorySource
from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, max_abs_error_ok, measure
from compiler.tasks import CONV1X1_CPU, CONV_CPU, GEMM_CPU, WINOGRAD_CPU, candidates
from compiler.templates import Epilogue, IOLayout, get_template
from schemas import (
    Config,
    DeviceLimits,
    MeasureErrorNo,
    MeasureOptions,
    MeasureResult,
    Record,
    Target,
    Workload,
)

TEMPLATE = get_template(GEMM_CPU)
CPU = Target.parse("opencl -model=pocl-cpu")
GPU = Target.parse("cuda -model=h200")
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
CHECK = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)
FULL = Epilogue(("bias", "add", "relu"))


def workload(n: int, c: int, h: int, w: int, k: int, kernel: int | tuple[int, int] = 3,
             stride: int | tuple[int, int] = 1, pad: int | tuple[int, ...] = 1,
             dilation: int = 1) -> Workload:
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    pads = [pad] * 4 if isinstance(pad, int) else list(pad)
    return Workload(template=GEMM_CPU, args=[
        ["TENSOR", [n, c, h, w], "float32"], ["TENSOR", [k, c, kh, kw], "float32"],
        [sh, sw], pads, [dilation, dilation], "NCHW", "NCHW", "float32"])


def config(wl: Workload, **values: object) -> Config:
    """The default config with ``values`` changed (``oc_bn`` sets tile_oc's inner factor)."""
    knobs = TEMPLATE.decode(wl, TEMPLATE.default_config(wl))
    oc_bn = values.pop("oc_bn", None)
    if oc_bn is not None:
        knobs["tile_oc"] = (TEMPLATE.parse(wl).co // oc_bn, oc_bn)
    knobs.update(values)
    return TEMPLATE.space(wl).to_config(knobs)


# ---- no device ----

def test_any_window_with_the_1x1_templates_space_and_default() -> None:
    wl = workload(1, 256, 28, 28, 256, stride=2)
    op = TEMPLATE.parse(wl)
    assert (op.kh, op.kw, op.oh, op.ow) == (3, 3, 14, 14)
    assert TEMPLATE.flops(wl) == 2 * 256 * 256 * 9 * 14 * 14
    one = get_template(CONV1X1_CPU)
    square = workload(1, 256, 14, 14, 256, kernel=1, pad=0)
    assert [k.name for k in TEMPLATE.space(wl).knobs] == [
        k.name for k in one.space(Workload(template=CONV1X1_CPU, args=square.args)).knobs]
    assert TEMPLATE.decode(wl, TEMPLATE.default_config(wl)) == {
        "tile_oc": (16, 16), "tile_p": 6, "vec": 8, "unroll_ci": 2, "wg": 1, "order_oc": 0}
    assert TEMPLATE.check_limits(wl, TEMPLATE.default_config(wl), CPU_LIMITS) == []
    # the direct template's workload: its records and TopHub's keep their template
    assert get_template(CONV_CPU).parse(Workload(template=CONV_CPU, args=wl.args)) == op


def test_pack_weight_is_taps_of_channel_rows_then_zeros() -> None:
    wl = workload(1, 6, 5, 5, 8, kernel=(3, 2), pad=(1, 0, 1, 1))
    weight = np.random.default_rng(0).uniform(-1, 1, (8, 6, 3, 2)).astype(np.float32)
    for oc_bn in (2, 4, 8):
        cfg = config(wl, oc_bn=oc_bn, vec=2)
        packed = TEMPLATE.pack_weight(wl, cfg, weight)
        assert packed.shape == (8 * 6 * 3 * 2 + 6,)
        body = packed[:-6].reshape(8 // oc_bn, 3, 2, 6, oc_bn)
        for kb in range(8 // oc_bn):
            for r in range(3):
                for s in range(2):
                    np.testing.assert_array_equal(
                        body[kb, r, s], weight[kb * oc_bn:(kb + 1) * oc_bn, :, r, s].T)
        np.testing.assert_array_equal(packed[-6:], 0.0)  # what padding reads
        assert TEMPLATE.codegen(wl, cfg).buffers[1].shape == packed.shape


def test_features_count_taps_and_border_pixels() -> None:
    wl = workload(1, 512, 14, 14, 512, stride=2)
    names = TEMPLATE.feature_names(wl)
    matrix = TEMPLATE.feature_matrix(wl, np.arange(len(TEMPLATE.space(wl))))
    assert matrix.shape == (len(TEMPLATE.space(wl)), len(names)) and np.isfinite(matrix).all()
    assert names == TEMPLATE.feature_names(workload(1, 3, 224, 224, 64, kernel=7, stride=2,
                                                    pad=3))
    one = TEMPLATE.features(wl, TEMPLATE.default_config(wl))
    # 7x7 output of a stride-2 3x3 window padded 1: row 0 and column 0 read padding
    assert one["border_pixels"] == pytest.approx(1 - 36 / 49)
    assert one["log_taps"] == pytest.approx(np.log2(9))
    assert one["log_reduction_steps"] == pytest.approx(np.log2(512 * 9))
    assert TEMPLATE.features(workload(1, 16, 9, 9, 16, pad=0),
                             config(workload(1, 16, 9, 9, 16, pad=0)))["border_pixels"] == 0


def test_padding_reads_zeros_or_selects_and_no_padding_reads_plainly() -> None:
    """Blocked data: a pixel whose tap lies in the padding points at the zero tail and
    stays there from block to block; plain data selects 0; no padding, neither."""
    padded, bare = workload(1, 32, 9, 9, 16), workload(1, 32, 9, 9, 16, pad=0)
    blocked = TEMPLATE.codegen(padded, config(padded), io=IOLayout(16, 16)).source
    assert ": zeros;" in blocked and "step0" in blocked and "? 0.0f" not in blocked
    one_block = TEMPLATE.codegen(padded, config(padded), io=IOLayout(32, 16)).source
    assert ": zeros;" in one_block and "step0" not in one_block
    plain = TEMPLATE.codegen(padded, config(padded)).source
    assert "zeros" not in plain and "(v0 ? x0[" in plain
    for io in (IOLayout(), IOLayout(16, 16)):
        source = TEMPLATE.codegen(bare, config(bare), io=io).source
        assert "zeros" not in source and "v0" not in source


def layer(name: str, c: int, side: int, k: int, kernel: int, stride: int, pad: int
          ) -> tuple[str, int, int, int, int, int, int]:
    return (name, c, side, k, kernel, stride, pad)


def graph_of(*layers: tuple[str, int, int, int, int, int, int]):  # type: ignore[no-untyped-def]
    """Independent convs, each on its own input."""
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    outs = []
    for name, c, side, k, kernel, stride, pad in layers:
        x = b.input(f"x_{name}", (1, c, side, side))
        w = b.const(rng.uniform(-1, 1, (k, c, kernel, kernel)).astype(np.float32))
        outs.append(b.call("nn.conv2d", [x, w], name, strides=(stride, stride),
                           padding=(pad,) * 4))
    return optimize(b.finish(outs))


def test_eight_lanes_prefer_it_on_narrow_outputs_of_enough_channels() -> None:
    """Untuned, on 8 lanes (AVX2): outputs at most 14 wide from 16 input channels, not an
    unpadded 1x1 (the 1x1 template's) nor where Winograd is preferred; 16 lanes, an
    unknown width and a GPU keep their order."""
    graph = graph_of(layer("s2_14", 256, 28, 256, 3, 2, 1), layer("s1_7", 512, 7, 512, 3, 1, 1),
                     layer("wide", 64, 30, 64, 3, 2, 1), layer("few", 8, 14, 64, 3, 1, 1),
                     layer("wino", 256, 14, 256, 3, 1, 1), layer("one", 64, 7, 64, 1, 1, 0),
                     layer("padded1x1", 64, 7, 64, 1, 1, 1))
    nodes = {n.name: n for n in graph.ops()}
    first = {name: candidates(node, CPU, 8)[0].template for name, node in nodes.items()}
    assert first == {"s2_14": GEMM_CPU, "s1_7": GEMM_CPU, "wide": CONV_CPU, "few": CONV_CPU,
                     "wino": WINOGRAD_CPU, "one": CONV_CPU, "padded1x1": GEMM_CPU}
    for lanes in (0, 16):
        assert GEMM_CPU not in {candidates(n, CPU, lanes)[0].template for n in nodes.values()}
    assert {candidates(n, GPU, 8)[0].template for n in nodes.values()} == {"conv2d_nchw.cuda"}
    plan, _tasks, _choices = select_layers(graph, CPU, None, DeviceLimits(simd_lanes=8))
    chosen = {n.name: (c.template, c.source) for n, c in plan.items()}
    assert chosen["s2_14"] == (GEMM_CPU, DEFAULT) and chosen["wide"] == (CONV_CPU, DEFAULT)


PREFETCH_WL = workload(1, 512, 7, 7, 512, kernel=3, pad=1)  # 9 MB of weight


def test_large_weights_prefetch_the_next_channel_block_tap_by_tap() -> None:
    """As the 1x1 template (its channel loop, one per tap): the next oc block's weight,
    every tap's rows, covered by the slices of a block's pixel blocks but the first
    (numpy checks the kernel in ``test_prefetching_kernel_matches_numpy``)."""
    wl = PREFETCH_WL
    cfg = TEMPLATE.default_config(wl, DeviceLimits(simd_lanes=16))
    assert TEMPLATE.decode(wl, cfg)["tile_oc"][1] == 64
    walks = [t * 512 * 64 + cb * 64 * 64 + c * 64 for t in range(9) for cb in range(8)
             for c in range(0, 64, 16)]
    src = TEMPLATE.codegen(wl, cfg, "opencl", Epilogue(), IOLayout(64, 64)).source
    assert "cq += 16" in src  # the walks' chunks: 16 channels, 16 x 64 / 12 floats
    found, covered = next_block_prefetch(src, walks)
    assert found == 9 * 512 * 64 and covered.all()


# ---- on the OpenCL device ----

# (workload, knobs, epilogue, layout): 3x3 padded (stride 1, 2), unpadded, 7x7 stride 2 on
# plain data of 3 channels (the stem), 5x5 dilated, asymmetric padding and stride, a
# padded 1x1, two images; data blocks of one block and of several, plain data; vec 1-16;
# tails and spare work-items; vector and lane-wise stores; fused epilogues.
CASES = [
    (workload(1, 16, 8, 8, 16), dict(tile_p=6), FULL, IOLayout(16, 16, 16)),
    (workload(1, 32, 9, 9, 16), dict(tile_p=5, unroll_ci=4), FULL, IOLayout(8, 16, 16)),
    (workload(2, 12, 11, 13, 24, stride=2), dict(oc_bn=8, tile_p=4, vec=4, wg=4),
     Epilogue(("bias", "relu")), IOLayout(4, 8)),
    (workload(1, 16, 10, 10, 8, pad=0), dict(oc_bn=8, tile_p=7, vec=2, order_oc=1),
     Epilogue(("relu", "add")), IOLayout(16, 0, 8)),
    (workload(1, 3, 23, 23, 16, kernel=7, stride=2, pad=3), dict(oc_bn=16, tile_p=6, vec=8),
     Epilogue(("bias",)), IOLayout(0, 16)),
    (workload(1, 8, 12, 12, 16, kernel=5, pad=4, dilation=2), dict(tile_p=3, vec=16, wg=2),
     FULL, IOLayout(8, 16, 4)),
    (workload(1, 8, 9, 7, 12, kernel=(3, 2), stride=(2, 1), pad=(0, 1, 2, 0)),
     dict(oc_bn=12, tile_p=8, vec=4, unroll_ci=2), Epilogue(), IOLayout()),
    (workload(1, 16, 7, 7, 32, kernel=1, pad=1), dict(oc_bn=32, tile_p=8, vec=16, wg=8),
     FULL, IOLayout(16, 32, 32)),
    (workload(1, 6, 6, 6, 6), dict(oc_bn=3, tile_p=2, vec=1, unroll_ci=2), FULL,
     IOLayout(2, 3, 6)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_matches_numpy(device: Device, case: int) -> None:
    wl, knobs, epilogue, io = CASES[case]
    cfg = config(wl, **knobs)
    assert TEMPLATE.check_limits(wl, cfg, CPU_LIMITS) == []
    got, want = run_blocked(device, TEMPLATE, wl, cfg, epilogue, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{knobs} {epilogue.ops} {io}: {why}"


def test_cases_cover_padding_paths_vectors_and_layouts() -> None:
    seen = [(config(wl, **dict(k)), wl, io) for wl, k, _, io in CASES]
    sources = [TEMPLATE.codegen(wl, c, "opencl", FULL, io).source for c, wl, io in seen]
    assert any(": zeros;" in s and "step0" in s for s in sources)  # several data blocks
    assert any(": zeros;" in s and "step0" not in s for s in sources)  # one
    assert any("(v0 ? x0[" in s for s in sources)  # plain data
    assert any("v0" not in s for s in sources)  # no padding
    assert any("min(p0 +" in s for s in sources) and any("if (pb >=" in s for s in sources)
    knobs = [TEMPLATE.decode(wl, c) for c, wl, _ in seen]
    assert {k["vec"] for k in knobs} == {1, 2, 4, 8, 16}
    ops = [TEMPLATE.parse(wl) for _, wl, _ in seen]
    assert {op.dilation for op in ops} == {(1, 1), (2, 2)} and any(op.n == 2 for op in ops)


@pytest.mark.parametrize("io", [IOLayout(64, 64, 64), IOLayout()])
def test_prefetching_kernel_matches_numpy(device: Device, io: IOLayout) -> None:
    """Blocked data (a run per data block, padding read from the zeros) and plain (one
    run, padding masked)."""
    cfg = TEMPLATE.default_config(PREFETCH_WL, DeviceLimits(simd_lanes=16))
    assert "PREFETCH(wf" in TEMPLATE.codegen(PREFETCH_WL, cfg, "opencl", FULL, io).source
    got, want = run_blocked(device, TEMPLATE, PREFETCH_WL, cfg, FULL, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{io}: {why}"


def test_resnet50_layers_it_is_preferred_on_pass_the_measurer(device: Device) -> None:
    """The 3x3 stride-2 layers of 14x14 and 7x7 outputs and the 7x7 3x3 one, default
    config, through the measurer (numpy check, blocked layouts as a trial times them)."""
    for c, h, s in ((256, 28, 2), (512, 14, 2), (512, 7, 1)):
        wl = workload(1, c, h, h, c, stride=s)
        res = measure(device, MeasureRequest(GEMM_CPU, wl, TEMPLATE.default_config(wl), CHECK))
        assert res.ok, f"{wl.args[:3]}: {res.error_no.name} {res.error_msg}"


def test_measurer_refuses_impossible_configs_with_error_1(device: Device) -> None:
    wl = workload(1, 12, 2, 3, 16)
    res = measure(device, MeasureRequest(GEMM_CPU, wl, config(wl, tile_p=7), CHECK))
    assert res.error_no == MeasureErrorNo.INSTANTIATION_ERROR, res
    assert "tile_p 7 is more than the image's 6 output pixels" in res.error_msg


def test_build_takes_it_where_its_record_is_faster_and_chains_layouts(device: Device) -> None:
    """conv1 (3x3, bias, relu) -> conv2 (3x3 stride 2) -> conv3 (1x1, the 1x1 template's
    neighbour): the GEMM records faster on conv1 and conv2, slower on conv3's padded
    twin (the direct one kept); blocked layouts between them; equal to the graph
    interpreter."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    x = b.input("x", (1, 16, 12, 12))
    c1 = b.call("nn.relu", [b.call("nn.bias_add", [
        b.call("nn.conv2d", [x, w(32, 16, 3, 3)], "conv1", padding=(1, 1, 1, 1)), w(32)])])
    c2 = b.call("nn.conv2d", [c1, w(24, 32, 3, 3)], "conv2", strides=(2, 2),
                padding=(1, 1, 1, 1))
    c3 = b.call("nn.conv2d", [b.call("nn.relu", [c2]), w(16, 24, 1, 1)], "conv3",
                padding=(1, 1, 1, 1))
    graph = optimize(b.finish([c3]))
    xs = rng.uniform(-1, 1, (1, 16, 12, 12)).astype(np.float32)
    want = evaluate(graph, [xs])[0]
    records = []
    for node in graph.ops():
        if node.op not in ("nn.conv2d", "fused.conv2d"):
            continue
        found = {wl.template: wl for wl in candidates(node, CPU)}
        direct, gemm = found[CONV_CPU], found[GEMM_CPU]
        records.append(Record(target=CPU, workload=direct,
                              config=get_template(CONV_CPU).default_config(direct),
                              result=MeasureResult(costs=(2e-3,),
                                                   error_no=MeasureErrorNo.NO_ERROR)))
        seconds = 3e-3 if node.name == "conv3" else 1e-3
        cfg = config(gemm, oc_bn=8, tile_p=5) if node.name == "conv2" else config(gemm)
        records.append(Record(target=CPU, workload=gemm, config=cfg,
                              result=MeasureResult(costs=(seconds,),
                                                   error_no=MeasureErrorNo.NO_ERROR)))
    module = build(graph, target=str(device.target), records=MemorySource(records),
                   optimized=True)
    assert [c.template for c in module.choices] == [GEMM_CPU, GEMM_CPU, CONV_CPU]
    assert all(c.source == THIS_DEVICE for c in module.choices)
    blocked = [s for s in module.program.steps
               if "conv" in s.name and len(s.kernel.buffers[0].shape) == 5]
    assert len(blocked) >= 2
    got = module.run([xs])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))

"""``conv2d_NCHWc_1x1.x86``: 1x1 convolutions on CPU-class OpenCL devices as a packed GEMM
over the flattened output pixels (issue 17).

No device: what the template accepts, its space and default, the packed weight, the
config rules (error 1 through the measurer too), features, task extraction. On the
OpenCL device: outputs equal numpy (the measurer's tolerance) on stride-1, stride-2 and
asymmetric-stride layers, odd and non-square images, two images, channel counts that are
not multiples of the blocks, register blocks that do not divide the pixels, every vector
width, capped unrolls, both grid orders, spare work-items, fused epilogues, with the
data, output and residual each plain or blocked; ResNet-50's 1x1 layers at the default
config. A build takes the template where its record is faster and chains it to direct
layers in blocked layouts, equal to the graph interpreter. A prologue (per-input-channel
scale, shift, relu on the data load) equals numpy in every layout and vector width; a
build runs DenseNet's pre-activation chains in the 1x1 convs that read them, scales
moved into the weights where positive, and equals the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import next_block_prefetch, run_blocked

from compiler.build_module import (
    Fold,
    _as_prologue,
    _scale_into_weight,
    build,
    held_for_prologues,
    plan_layouts,
    plan_prologues,
    select_layers,
)
from compiler.ir import GraphBuilder, evaluate
from compiler.layout_tune import Option, ReadCosts, tune_layouts
from compiler.passes import optimize
from compiler.records import THIS_DEVICE, MemorySource
from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, max_abs_error_ok, measure
from compiler.tasks import (
    CONV1X1_CPU,
    CONV_CPU,
    candidates,
    extract_tasks,
    tuning_candidates,
)
from compiler.templates import (
    ConfigError,
    Epilogue,
    IOLayout,
    Prologue,
    WorkloadError,
    get_template,
)
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

TEMPLATE = get_template(CONV1X1_CPU)
CPU = Target.parse("opencl -model=pocl-cpu")
GPU = Target.parse("cuda -model=h200")
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
CHECK = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)  # rtol 1e-4, atol 1e-4 x max
FULL = Epilogue(("bias", "add", "relu"))


def workload(n: int, c: int, h: int, w: int, k: int, stride: int | tuple[int, int] = 1,
             pad: int = 0, kernel: int = 1) -> Workload:
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    return Workload(template=CONV1X1_CPU, args=[
        ["TENSOR", [n, c, h, w], "float32"], ["TENSOR", [k, c, kernel, kernel], "float32"],
        [sh, sw], [pad, pad, pad, pad], [1, 1], "NCHW", "NCHW", "float32"])


def config(wl: Workload, **values: object) -> Config:
    """The default config with ``values`` changed (``oc_bn`` sets tile_oc's inner factor)."""
    knobs = TEMPLATE.decode(wl, TEMPLATE.default_config(wl))
    oc_bn = values.pop("oc_bn", None)
    if oc_bn is not None:
        knobs["tile_oc"] = (TEMPLATE.parse(wl).co // oc_bn, oc_bn)
    knobs.update(values)
    return TEMPLATE.space(wl).to_config(knobs)


# ---- no device ----

@pytest.mark.parametrize("wl, words", [
    (workload(1, 8, 8, 8, 8, pad=1, kernel=3), "only 1x1 kernels"),
    (workload(1, 8, 8, 8, 8, pad=1), "only padding 0"),
])
def test_workloads_it_cannot_compute_are_refused(wl: Workload, words: str) -> None:
    with pytest.raises(WorkloadError, match=words):
        TEMPLATE.parse(wl)


def test_space_knobs_and_default() -> None:
    wl = workload(1, 256, 56, 56, 128)
    space = TEMPLATE.space(wl)
    assert [k.name for k in space.knobs] == ["tile_oc", "tile_p", "vec", "unroll_ci", "wg",
                                            "order_oc"]
    knobs = TEMPLATE.decode(wl, TEMPLATE.default_config(wl))
    assert knobs == {"tile_oc": (8, 16), "tile_p": 6, "vec": 8, "unroll_ci": 2, "wg": 1,
                     "order_oc": 0}
    assert TEMPLATE.check_limits(wl, TEMPLATE.default_config(wl), CPU_LIMITS) == []
    assert TEMPLATE.out_block(wl, TEMPLATE.default_config(wl)) == 16
    # a 2x2 image of odd channels: 4 pixels per block, 4-lane vectors, no unroll
    small = workload(1, 9, 2, 2, 12)
    assert TEMPLATE.decode(small, TEMPLATE.default_config(small)) == {
        "tile_oc": (1, 12), "tile_p": 4, "vec": 4, "unroll_ci": 1, "wg": 1, "order_oc": 0}
    # the same workload as the direct template's: a TopHub record keys the other one
    direct = Workload(template=CONV_CPU, args=wl.args)
    assert get_template(CONV_CPU).parse(direct) == TEMPLATE.parse(wl)
    assert TEMPLATE.flops(wl) == 2 * 256 * 128 * 56 * 56


def test_pack_weight_is_oc_blocks_of_channel_rows() -> None:
    wl = workload(1, 6, 5, 5, 8)
    weight = np.random.default_rng(0).uniform(-1, 1, (8, 6, 1, 1)).astype(np.float32)
    for oc_bn in (2, 4, 8):
        cfg = config(wl, oc_bn=oc_bn, vec=2)
        packed = TEMPLATE.pack_weight(wl, cfg, weight)
        assert packed.shape == (8 // oc_bn, 6, oc_bn)
        for kb in range(8 // oc_bn):
            for c in range(6):
                np.testing.assert_array_equal(
                    packed[kb, c], weight[kb * oc_bn:(kb + 1) * oc_bn, c, 0, 0])
        assert TEMPLATE.codegen(wl, cfg).buffers[1].shape == packed.shape


def test_config_rules_name_the_problem() -> None:
    wl = workload(1, 12, 2, 3, 16)
    assert TEMPLATE.check_limits(wl, config(wl, vec=16, oc_bn=8), CPU_LIMITS) == [
        "vec 16 does not divide the output-channel block 8"]
    assert TEMPLATE.check_limits(wl, config(wl, unroll_ci=8), CPU_LIMITS) == [
        "unroll_ci 8 does not divide the 12 input channels"]
    assert TEMPLATE.check_limits(wl, config(wl, tile_p=7), CPU_LIMITS) == [
        "tile_p 7 is more than the image's 6 output pixels"]
    big = workload(1, 16, 8, 8, 32)
    assert TEMPLATE.check_limits(big, config(big, tile_p=16, oc_bn=32), CPU_LIMITS) == [
        "512 accumulators per work-item (16 pixels x 32 channels) > 256"]
    with pytest.raises(ConfigError, match="does not divide"):
        TEMPLATE.codegen(wl, config(wl, vec=16, oc_bn=8))
    indices = np.arange(len(TEMPLATE.space(wl)))
    mask = TEMPLATE.valid_mask(wl, indices, CPU_LIMITS)
    assert 0 < mask.sum() < len(indices)
    for i in (0, 1, len(indices) // 3, len(indices) // 2, len(indices) - 1):
        assert mask[i] == (not TEMPLATE.check_limits(wl, TEMPLATE.space(wl).get(int(i)),
                                                      CPU_LIMITS))


def test_features_have_the_same_keys_for_every_config() -> None:
    wl = workload(1, 512, 28, 28, 1024, stride=2)
    names = TEMPLATE.feature_names(wl)
    matrix = TEMPLATE.feature_matrix(wl, np.arange(len(TEMPLATE.space(wl))))
    assert matrix.shape == (len(TEMPLATE.space(wl)), len(names)) and np.isfinite(matrix).all()
    assert names == TEMPLATE.feature_names(workload(1, 64, 7, 7, 32))
    one = TEMPLATE.features(wl, TEMPLATE.default_config(wl))
    # 14 x 14 = 196 pixels in blocks of 6: 33 blocks, 2 pixels idle
    assert one["idle_pixels"] == pytest.approx(2 / 198) and one["strided"] == 1.0
    assert one["loads_per_vector_fma"] == pytest.approx((6 + 2) / 12)


def conv_graph(*convs: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    """x (1, 8, 10, 10) through convs of (out channels, kernel, stride)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    value, c = b.input("x", (1, 8, 10, 10)), 8
    for i, (k, kernel, stride) in enumerate(convs):
        w = b.const(rng.uniform(-1, 1, (k, c, kernel, kernel)).astype(np.float32))
        pad = kernel // 2
        value = b.call("nn.conv2d", [value, w], f"conv{i}", strides=(stride, stride),
                       padding=(pad, pad, pad, pad))
        c = k
    return optimize(b.finish([value]))


def test_compiler_extracts_the_task_beside_the_direct_one_on_a_cpu() -> None:
    graph = conv_graph((16, 3, 1), (16, 1, 1), (32, 1, 2))
    tasks = extract_tasks(graph, CPU)
    assert [t.template for t in tasks] == [CONV_CPU, "conv2d_NCHWc_winograd.x86",
                                           "conv2d_NCHWc_gemm.x86", CONV_CPU, CONV1X1_CPU,
                                           CONV_CPU, CONV1X1_CPU]
    assert tasks[4].workload.args == tasks[3].workload.args  # the same workload
    assert list(tasks[6].workload.args[2]) == [2, 2]  # the stride-2 one too
    # a GPU lists it among the candidates (a build may take its record) but tunes it not
    node = next(n for n in graph.ops() if n.name == "conv1")
    assert CONV1X1_CPU in [w.template for w in candidates(node, GPU)]
    assert CONV1X1_CPU not in [w.template for w in tuning_candidates(node, GPU)]
    # no records: the default build keeps the direct template
    _plan, chosen, _ = select_layers(graph, CPU, None, DeviceLimits())
    assert [t.template for t in chosen] == [CONV_CPU, CONV_CPU, CONV_CPU]


# ResNet-50's res5 expand 1x1 (4 MB of weight) at the 16-lane default (oc_bn 64, 4 pixels
# a block: 13 pixel blocks, 12 slices), in the layouts that give each prefetch form: a
# data block's run in chunks of 16 channels, the whole plain run in chunks, runs of 16
# channels each one chunk
PREFETCH_WL = workload(1, 512, 7, 7, 2048)
PREFETCH_LAYOUTS = (IOLayout(64, 64), IOLayout(), IOLayout(16, 64))


def test_large_weights_prefetch_the_next_channel_block() -> None:
    """Where the weight is 1 MB or more, every pixel block of an oc block but the first
    prefetches a slice of the next oc block's weight, a chunk of channels at a time of at
    least CHUNK_LINES lines (within a data block's run; the whole run where no smaller
    chunk has that many): the slices cover the whole next block and stay inside it. Not
    for a small weight, with oc blocks innermost, nor with one oc block. (Kernels that
    prefetch are checked against numpy in the ResNet-50 layers' test below.)"""
    wl = PREFETCH_WL
    cfg = TEMPLATE.default_config(wl, DeviceLimits(simd_lanes=16))
    assert TEMPLATE.decode(wl, cfg)["tile_p"] == 4  # 13 pixel blocks: 12 slices
    block = 512 * 64  # C x oc_bn floats
    # chunks of 16 channels: 16 x 64 / 12 floats, 5.3 lines; a run of 16 is one chunk
    walks = ([cb * 64 * 64 + c * 64 for cb in range(8) for c in range(0, 64, 16)],
             [c * 64 for c in range(0, 512, 16)], [cb * 16 * 64 for cb in range(32)])
    for io, walk, chunked in zip(PREFETCH_LAYOUTS, walks, (True, True, False)):
        src = TEMPLATE.codegen(wl, cfg, "opencl", Epilogue(), io).source
        assert ("cq += 16" in src) == chunked, io
        found, covered = next_block_prefetch(src, walk)
        assert found == block and covered.all(), io
        assert src.count("PREFETCH(wf") == 2 * 6  # a full pixel block's copy, the tail's
    small = workload(1, 64, 56, 56, 256)
    assert "PREFETCH(wf" not in TEMPLATE.codegen(small, TEMPLATE.default_config(small)).source
    inner = config(wl, order_oc=1)
    assert "PREFETCH(wf" not in TEMPLATE.codegen(wl, inner).source
    one = workload(1, 4096, 7, 7, 64)  # 1 MB, one block of 64
    assert "PREFETCH(wf" not in TEMPLATE.codegen(one, config(one, oc_bn=64)).source


# ---- on the OpenCL device ----

# (workload, knobs, epilogue, layout): stride 1, 2 and (2, 1); odd, non-square images;
# two images; C and K not multiples of 8 or 16; a register block that divides the pixels
# and ones that do not (the contiguous path with a per-pixel tail, or per-pixel pointers
# throughout when strided); vec 1 (plain floats) to 16; an unroll capped by the data
# block; both grid orders; spare work-items in the last group; vector and lane-wise
# stores and epilogues.
CASES = [
    (workload(1, 16, 8, 8, 16), dict(tile_p=4), FULL, IOLayout()),
    (workload(1, 16, 8, 8, 16), dict(tile_p=6, unroll_ci=4), FULL, IOLayout(16, 16, 16)),
    (workload(1, 12, 9, 7, 24), dict(oc_bn=8, tile_p=5, vec=4, wg=4),
     Epilogue(("bias", "relu")), IOLayout(4, 8)),
    (workload(1, 12, 9, 7, 24), dict(oc_bn=12, tile_p=3, vec=4, order_oc=1, unroll_ci=4),
     FULL, IOLayout(6, 12, 8)),
    (workload(2, 10, 11, 13, 6, stride=2), dict(oc_bn=6, tile_p=7, vec=2, unroll_ci=2),
     Epilogue(("relu", "add")), IOLayout(0, 3, 2)),
    (workload(2, 10, 11, 13, 6, stride=2), dict(oc_bn=3, tile_p=4, vec=1, wg=8),
     FULL, IOLayout(5, 0, 6)),
    (workload(1, 24, 14, 14, 32, stride=2), dict(oc_bn=32, tile_p=8, vec=16, order_oc=1),
     Epilogue(("bias", "add")), IOLayout(8, 32, 32)),
    (workload(1, 24, 14, 14, 32), dict(oc_bn=16, tile_p=12, vec=8, unroll_ci=8),
     Epilogue(("bias", "clip:0.0:6.0")), IOLayout(0, 16)),
    (workload(1, 8, 9, 6, 16, stride=(2, 1)), dict(tile_p=16, vec=8, wg=2),
     FULL, IOLayout(2, 16, 16)),
    (workload(1, 3, 5, 5, 4), dict(oc_bn=4, tile_p=1, vec=4), Epilogue(), IOLayout()),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_matches_numpy(device: Device, case: int) -> None:
    wl, knobs, epilogue, io = CASES[case]
    cfg = config(wl, **knobs)
    assert TEMPLATE.check_limits(wl, cfg, CPU_LIMITS) == []
    got, want = run_blocked(device, TEMPLATE, wl, cfg, epilogue, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{knobs} {epilogue.ops} {io}: {why}"


def test_cases_cover_strides_tails_layouts_and_store_paths() -> None:
    seen = [(config(wl, **dict(k)), wl, io) for wl, k, _, io in CASES]
    knobs = [TEMPLATE.decode(wl, c) for c, wl, _ in seen]
    ops = [TEMPLATE.parse(wl) for _, wl, _ in seen]
    assert {op.stride for op in ops} == {(1, 1), (2, 2), (2, 1)}
    assert {k["vec"] for k in knobs} == {1, 2, 4, 8, 16}
    assert {k["order_oc"] for k in knobs} == {0, 1}
    tails = {(op.stride == (1, 1), op.oh * op.ow % k["tile_p"] != 0)
             for op, k in zip(ops, knobs)}
    assert tails == {(True, True), (True, False), (False, True), (False, False)}
    assert any(io.out_block == k["tile_oc"][1] for k, (_, _, io) in zip(knobs, seen))
    assert any(io.out_block not in (0, k["tile_oc"][1]) for k, (_, _, io) in zip(knobs, seen))
    for field in ("data_block", "out_block", "residual_block"):
        assert {getattr(io, field) for _, _, io in seen} > {0}
    sources = [TEMPLATE.codegen(wl, c, "opencl", FULL, io).source for c, wl, io in seen]
    assert any("min(p0 +" in s for s in sources)  # a clamped last block
    assert any("if (pb >=" in s for s in sources)  # spare work-items
    # unroll_ci 4 on a data block of 6 channels runs 2 steps per loop step
    assert "ci += 2" in sources[3] and "ci + 2" not in sources[3]


def resnet_requests() -> list[MeasureRequest]:
    """ResNet-50's distinct 1x1 layers with the most channels, and the stride-2 ones."""
    out = []
    for c, h, k, s in ((64, 56, 256, 1), (256, 56, 512, 2), (512, 28, 1024, 2),
                       (1024, 14, 2048, 2), (2048, 7, 512, 1), (512, 7, 2048, 1)):
        wl = workload(1, c, h, h, k, stride=s)
        out.append(MeasureRequest(CONV1X1_CPU, wl, TEMPLATE.default_config(wl), CHECK))
    return out


@pytest.mark.parametrize("io", PREFETCH_LAYOUTS)
def test_prefetching_kernels_match_numpy(device: Device, io: IOLayout) -> None:
    cfg = TEMPLATE.default_config(PREFETCH_WL, DeviceLimits(simd_lanes=16))
    got, want = run_blocked(device, TEMPLATE, PREFETCH_WL, cfg, FULL, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{io}: {why}"


def test_resnet50_1x1_layers_at_the_default_config_match_numpy(device: Device) -> None:
    for req in resnet_requests():
        res = measure(device, req)
        assert res.ok, f"{req.workload.args[:3]}: {res.error_no.name} {res.error_msg}"


def test_measurer_refuses_impossible_configs_with_error_1(device: Device) -> None:
    wl = workload(1, 12, 2, 3, 16)
    for cfg in (config(wl, vec=16, oc_bn=8), config(wl, tile_p=7)):
        res = measure(device, MeasureRequest(CONV1X1_CPU, wl, cfg, CHECK))
        assert res.error_no == MeasureErrorNo.INSTANTIATION_ERROR, res
        assert "config does not fit" in res.error_msg


def record(wl: Workload, cfg: Config, seconds: float) -> Record:
    return Record(target=CPU, workload=wl, config=cfg,
                  result=MeasureResult(costs=(seconds,), error_no=MeasureErrorNo.NO_ERROR))


def test_build_takes_the_1x1_template_where_it_measured_faster_and_chains_layouts(
        device: Device) -> None:
    """conv1 (1x1, bias, relu) -> conv2 (3x3, direct) -> conv3 (1x1 stride 2) and conv4
    (1x1 stride 2, conv3 as residual, relu) -> conv5 (1x1, graph output): the 1x1 layers
    whose records are faster take the template, read and write NCHW[x]c between direct
    ones, and the model equals the graph interpreter."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    x = b.input("x", (1, 16, 14, 14))
    c1 = b.call("nn.relu", [b.call("nn.bias_add", [
        b.call("nn.conv2d", [x, w(24, 16, 1, 1)], "conv1"), w(24)])])
    c2 = b.call("nn.relu", [b.call("nn.conv2d", [c1, w(32, 24, 3, 3)], "conv2",
                                   padding=(1, 1, 1, 1))])
    c3 = b.call("nn.conv2d", [c2, w(24, 32, 1, 1)], "conv3", strides=(2, 2))
    c4 = b.call("nn.conv2d", [c1, w(24, 24, 1, 1)], "conv4", strides=(2, 2))
    c4 = b.call("nn.relu", [b.call("add", [c4, c3])])
    c5 = b.call("nn.conv2d", [c4, w(20, 24, 1, 1)], "conv5")
    graph = optimize(b.finish([c5]))
    xs = rng.uniform(-1, 1, (1, 16, 14, 14)).astype(np.float32)
    want = evaluate(graph, [xs])[0]

    # 1x1 records faster than the direct ones on conv1, conv3 and conv4 (oc_bn 8 on
    # conv3: an output block other than conv4's residual block), slower on conv5
    faster = {"conv1": dict(oc_bn=12, vec=4), "conv3": dict(oc_bn=8, tile_p=5),
              "conv4": dict(oc_bn=24, tile_p=3, vec=8)}
    records = []
    for node in graph.ops():
        if node.op not in ("nn.conv2d", "fused.conv2d"):
            continue
        found = {w.template: w for w in candidates(node, CPU)}
        direct = found[CONV_CPU]
        records.append(record(direct, get_template(CONV_CPU).default_config(direct), 2e-3))
        if CONV1X1_CPU in found:
            wl = found[CONV1X1_CPU]
            seconds = 1e-3 if node.name in faster else 3e-3
            records.append(record(wl, config(wl, **faster.get(node.name, {})), seconds))
    module = build(graph, target=str(device.target), records=MemorySource(records),
                   optimized=True)
    assert [c.template for c in module.choices] == [CONV1X1_CPU, CONV_CPU, CONV1X1_CPU,
                                                    CONV1X1_CPU, CONV_CPU]
    assert all(c.source == THIS_DEVICE for c in module.choices)
    steps = {s.name: s for s in module.program.steps if "conv" in s.name}
    blocked = [s for s in steps.values() if len(s.kernel.buffers[0].shape) == 5]
    assert len(blocked) >= 3, [s.kernel.buffers[0].shape for s in steps.values()]
    got = module.run([xs])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


# ---- the prologue: ops on the data load ----

PRE_ACTIVATION = Prologue(("scale", "shift", "relu"))


def test_prologue_ops_are_checked_and_only_templates_that_apply_one_take_it() -> None:
    with pytest.raises(ValueError, match="not one of scale, shift, relu"):
        Prologue(("scale", "clip"))
    with pytest.raises(ValueError, match="once"):
        Prologue(("shift", "relu", "shift"))
    wl = workload(1, 16, 8, 8, 16)
    assert [b.name for b in TEMPLATE.codegen(wl, config(wl), "opencl", FULL, IOLayout(),
                                             PRE_ACTIVATION).buffers] == [
        "data", "weight", "bias", "residual", "pro_scale", "pro_shift", "out"]
    gemm = get_template("conv2d_NCHWc_gemm.x86")  # its padded taps read a block of zeros
    gemm_wl = Workload(template=gemm.name, args=wl.args)
    with pytest.raises(ValueError, match="applies no prologue"):
        gemm.codegen(gemm_wl, gemm.default_config(gemm_wl), "opencl", Epilogue(), None,
                     Prologue(("relu",)))


# every CASES layout (blocked data: the channel a prologue reads is the block's plus the
# step's) under the pre-activation, and other orders on a few
PROLOGUE_CASES = [(case, PRE_ACTIVATION) for case in range(len(CASES))] + [
    (1, Prologue(("shift", "relu"))), (3, Prologue(("relu", "scale"))),
    (5, Prologue(("shift", "scale"))), (8, Prologue(("scale",)))]


@pytest.mark.parametrize("case, prologue", PROLOGUE_CASES)
def test_prologue_kernels_match_numpy(device: Device, case: int, prologue: Prologue) -> None:
    wl, knobs, epilogue, io = CASES[case]
    got, want = run_blocked(device, TEMPLATE, wl, config(wl, **knobs), epilogue, io, prologue)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{knobs} {prologue.ops} {io}: {why}"


def pre_activation_graph(rng: np.random.Generator):  # type: ignore[no-untyped-def]
    """A DenseNet-style block: cat = [relu(conv3x3 x), conv1x1 x]; pre-activation chains
    on cat: batch-norm + relu (positive scales) before a 1x1 conv with its own
    batch-norm + relu after (c); scale (some negative), shift, relu before a 1x1 conv (d);
    a shift + relu read by a 3x3 conv and as a graph output (e); batch-norm + relu
    before a padded 3x3 conv, the direct template (f); shift, positive scale, relu
    before a 1x1 conv (g); a shift + relu read by two 1x1 convs (h1, h2); a transition
    (batch-norm, relu, 1x1 conv t, 2x2 average pool tpool: the pool moves before the
    conv and reads the chain) and a global average pool of batch-norm + relu (gap)."""
    b = GraphBuilder()

    def w(*shape: int, lo: float = -0.3, hi: float = 0.3):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(lo, hi, shape).astype(np.float32))

    def bn(x, channels: int):  # type: ignore[no-untyped-def]
        return b.call("nn.batch_norm", [x, w(channels, lo=0.1, hi=1.0), w(channels),
                                        w(channels), w(channels, lo=0.5, hi=1.5)])

    x = b.input("x", (1, 16, 10, 10))
    a = b.call("nn.relu", [b.call("nn.conv2d", [x, w(16, 16, 3, 3)], "a", padding=(1,) * 4)])
    cat = b.call("concatenate", [a, b.call("nn.conv2d", [x, w(8, 16, 1, 1)], "b")], axis=1)
    pre1 = b.call("nn.relu", [bn(cat, 24)])
    c = b.call("nn.relu", [bn(b.call("nn.conv2d", [pre1, w(32, 24, 1, 1)], "c"), 32)])
    pre2 = b.call("nn.relu", [b.call("add", [b.call("multiply", [cat, w(24, 1, 1, lo=-1, hi=1)]),
                                            w(24, 1, 1)])])
    d = b.call("nn.conv2d", [pre2, w(16, 24, 1, 1)], "d")
    pre3 = b.call("nn.relu", [b.call("add", [cat, w(24, 1, 1)])])
    e = b.call("nn.conv2d", [pre3, w(8, 24, 3, 3)], "e", padding=(1,) * 4)
    f = b.call("nn.conv2d", [b.call("nn.relu", [bn(cat, 24)]), w(8, 24, 3, 3)], "f",
               padding=(1,) * 4)
    pre5 = b.call("nn.relu", [b.call("multiply", [b.call("add", [cat, w(24, 1, 1)]),
                                                 w(24, 1, 1, lo=0.5, hi=1.5)])])
    g = b.call("nn.conv2d", [pre5, w(8, 24, 1, 1)], "g")
    pre6 = b.call("nn.relu", [b.call("add", [cat, w(24, 1, 1)])])
    h1, h2 = (b.call("nn.conv2d", [pre6, w(8, 24, 1, 1)], name) for name in ("h1", "h2"))
    t = b.call("nn.conv2d", [b.call("nn.relu", [bn(cat, 24)]), w(16, 24, 1, 1)], "t")
    tpool = b.call("nn.avg_pool2d", [t], "tpool", pool_size=(2, 2), strides=(2, 2))
    gap = b.call("nn.global_avg_pool2d", [b.call("nn.relu", [bn(cat, 24)])], "gap")
    return optimize(b.finish([c, d, e, pre3, f, g, h1, h2, tpool, gap]))


def default_records(graph, direct: float, one_by_one: float  # type: ignore[no-untyped-def]
                    ) -> MemorySource:
    """Records of every layer's direct default and every 1x1 layer's 1x1 default, each
    measured at the seconds given."""
    records = []
    for node in graph.ops():
        found = {w.template: w for w in candidates(node, CPU)}
        if CONV_CPU in found:
            wl = found[CONV_CPU]
            records.append(record(wl, get_template(CONV_CPU).default_config(wl), direct))
        if CONV1X1_CPU in found:
            records.append(record(found[CONV1X1_CPU], config(found[CONV1X1_CPU]), one_by_one))
    return MemorySource(records)


def prefer_1x1(graph) -> MemorySource:  # type: ignore[no-untyped-def]
    """Records that make every 1x1 layer take this template's default, the rest the
    direct one's (untuned, a device of 8 lanes keeps the direct template on 1x1 layers)."""
    return default_records(graph, direct=2e-3, one_by_one=1e-3)


def test_build_runs_pre_activations_in_the_1x1_convs_that_read_them(device: Device) -> None:
    rng = np.random.default_rng(11)
    graph = pre_activation_graph(rng)
    records = prefer_1x1(graph)
    plan, _, _ = select_layers(graph, device.target, records, device.limits)
    folds = {node.name: fold for node, fold in plan_prologues(graph, plan).items()}
    # positive scales go into c's, f's and g's weights; d's some negative keep theirs;
    # e's chain is also a graph output, h1's and h2's read by both; the pools apply theirs
    assert sorted(folds) == ["c", "d", "f", "g", "gap", "tpool"]
    assert folds["tpool"].prologue.ops == ("scale", "shift", "relu")
    assert folds["g"].prologue.ops == ("shift", "relu") and folds["g"].weight_scale is not None
    assert {node.name: choice.workload.template for node, choice in plan.items()}["f"] \
        == CONV_CPU
    assert folds["c"].prologue.ops == ("shift", "relu") and folds["c"].weight_scale is not None
    assert folds["d"].prologue.ops == ("scale", "shift", "relu")
    assert folds["d"].weight_scale is None
    xs = rng.uniform(-1, 1, (1, 16, 10, 10)).astype(np.float32)
    want = evaluate(graph, [xs])
    for fold, chains in ((True, 2), (False, 8)):
        module = build(graph, target=str(device.target), records=records, optimized=True,
                       device=device, fold_prologues=fold)
        names = [s.name.split()[0] for s in module.program.steps]
        assert names.count("fused.elementwise") == chains, names
        for got, ref in zip(module.run([xs]), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_a_scale_too_small_to_move_stays_in_the_prologue() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 3, 4, 4))
    scale = np.array([1.0, 1e-13, 2.0], np.float32)
    chain = b.call("fused.elementwise", [x, b.const(scale.reshape(3, 1, 1)),
                                         b.const(np.ones((3, 1, 1), np.float32))],
                   chain=(("multiply", 1, ()), ("add", 2, ()), ("nn.relu", -1, ())))
    fold = _as_prologue(chain)
    assert fold is not None and fold.prologue.ops == ("scale", "shift", "relu")
    assert _scale_into_weight(fold) is fold
    moved = _scale_into_weight(Fold(chain, fold.prologue, {**fold.vectors, "scale": scale + 1}))
    np.testing.assert_allclose(moved.vectors["shift"], 1 / (scale + 1), rtol=1e-6)


def test_a_1x1_layer_under_a_prologue_takes_the_1x1_template_on_16_lanes() -> None:
    """Records that make the direct template faster on every 1x1 layer: on a 16-lane
    CPU the layers that will apply their chain in the load (c, d, g) still take the 1x1
    template's record; h1 and h2 (their chain read by both) and every layer on 8 lanes
    take the faster direct one."""
    graph = pre_activation_graph(np.random.default_rng(11))
    records = default_records(graph, direct=1e-3, one_by_one=2e-3)
    for lanes, gemm in ((16, {"c", "d", "g"}), (8, set())):
        plan, _, _ = select_layers(graph, CPU, records, DeviceLimits(simd_lanes=lanes))
        chosen = {n.name: c.workload.template for n, c in plan.items() if n.name in
                  {"b", "c", "d", "g", "h1", "h2"}}
        assert {n for n, t in chosen.items() if t == CONV1X1_CPU} == gemm, chosen
        assert gemm <= {n.name for n in plan_prologues(graph, plan)}
    plan, _, _ = select_layers(graph, CPU, records, DeviceLimits(simd_lanes=16),
                               prologues=False)  # a build that does not fold chains
    assert CONV1X1_CPU not in {c.workload.template for c in plan.values()}


class FreeReads(ReadCosts):
    """Any block read at no cost, constructed, not timed."""

    def penalty(self, option: Option, epilogue: Epilogue, slot: str, block: int) -> float:
        return 0.0


def test_graph_tuning_keeps_the_1x1_template_under_a_prologue(device: Device) -> None:
    """Graph tuning, free to re-choose by the records, leaves the held layers alone."""
    graph = pre_activation_graph(np.random.default_rng(11))
    records = default_records(graph, direct=1e-3, one_by_one=2e-3)
    plan, _, _ = select_layers(graph, CPU, records, DeviceLimits(simd_lanes=16))
    held = held_for_prologues(graph, CPU, 16)
    assert {n.name for n in held} == {"c", "d", "g"}
    for keep, gemm in ((held, {"c", "d", "g"}), (set(), set())):
        tuned = tune_layouts(graph, plan, plan_layouts(graph, plan), records, device,
                             reads=FreeReads(device), held=keep)
        assert {n.name for n, c in tuned.plan.items()
                if c.workload.template == CONV1X1_CPU} == gemm

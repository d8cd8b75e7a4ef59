"""``conv2d_NCHWc_winograd.x86``: Winograd F(2x2, 3x3), F(4x4, 3x3) and F(6x6, 3x3) for
CPU-class OpenCL devices (issue 17, point 2).

No device: what the template accepts, its space, the packed filter, the config rules
(error 1 through the measurer too), features, a record from before F(6x6) decoding by
its entity. On the OpenCL device: outputs equal numpy (the measurer's tolerance) for
every tile size on padded, unpadded, odd-sized, batched layers whose channels are not
multiples of the blocks, with fused epilogues, with the data, output and residual each
plain or blocked; ResNet-50's four 3x3 stride-1 layers at F(4x4) and F(6x6) (accuracy at
C = 512). The compiler extracts the task and builds a model with
Winograd layers chained to direct ones in blocked layouts, equal to the graph
interpreter. The CUDA C side compiles with ``nvcc -ptx -arch=sm_80``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_nvcc, next_block_prefetch, nvcc_ptx, run_blocked

from compiler.build_module import build, select_layers
from compiler.ir import GraphBuilder, evaluate
from compiler.passes import optimize
from compiler.records import THIS_DEVICE, MemorySource
from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, max_abs_error_ok, measure
from compiler.tasks import (
    CONV1X1_CPU,
    CONV_CPU,
    WINOGRAD_CPU,
    candidates,
    extract_tasks,
)
from compiler.templates import (
    ConfigError,
    Epilogue,
    IOLayout,
    WorkloadError,
    get_template,
)
from compiler.templates import conv2d_nchwc_winograd as winograd_cpu
from compiler.templates.conv2d_nchwc_winograd import tile_m, winograd_op
from compiler.templates.conv2d_winograd import pack_filter
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

TEMPLATE = get_template(WINOGRAD_CPU)
CPU = Target.parse("opencl -model=pocl-cpu")
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
CHECK = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)  # rtol 1e-4, atol 1e-4 x max
FULL = Epilogue(("bias", "add", "relu"))


def workload(n: int, c: int, h: int, w: int, k: int, pad: int = 1,
             kernel: int = 3, stride: int = 1, dilation: int = 1) -> Workload:
    return Workload(template=WINOGRAD_CPU, args=[
        ["TENSOR", [n, c, h, w], "float32"], ["TENSOR", [k, c, kernel, kernel], "float32"],
        [stride, stride], [pad, pad, pad, pad], [dilation, dilation], "NCHW", "NCHW",
        "float32"])


def config(wl: Workload, **values: object) -> Config:
    """The default config with ``values`` changed (``oc_bn`` sets tile_oc's inner factor,
    ``tile_size=6`` means tile_size 4 with ``wide_tile``)."""
    knobs = TEMPLATE.decode(wl, TEMPLATE.default_config(wl))
    oc_bn = values.pop("oc_bn", None)
    if oc_bn is not None:
        knobs["tile_oc"] = (TEMPLATE.parse(wl).co // oc_bn, oc_bn)
    if values.get("tile_size") == 6:
        values.update(tile_size=4, wide_tile=True)
    knobs.update(values)
    return TEMPLATE.space(wl).to_config(knobs)


# ---- no device ----

@pytest.mark.parametrize("wl, words", [
    (workload(1, 8, 8, 8, 8, pad=0, kernel=1), "only 3x3 kernels"),
    (workload(1, 8, 8, 8, 8, stride=2), "only stride 1"),
    (workload(1, 8, 8, 8, 8, dilation=2), "only dilation 1"),
])
def test_workloads_it_cannot_compute_are_refused(wl: Workload, words: str) -> None:
    with pytest.raises(WorkloadError, match=words):
        TEMPLATE.parse(wl)


def test_space_knobs_and_default() -> None:
    wl = workload(1, 64, 56, 56, 64)
    space = TEMPLATE.space(wl)
    assert [k.name for k in space.knobs] == ["tile_size", "tile_oc", "tile_p", "vec", "wg",
                                             "wide_tile"]
    knobs = TEMPLATE.decode(wl, TEMPLATE.default_config(wl))
    assert knobs == {"tile_size": 4, "tile_oc": (4, 16), "tile_p": 4, "vec": 8, "wg": 1,
                     "wide_tile": False}
    assert TEMPLATE.check_limits(wl, TEMPLATE.default_config(wl), CPU_LIMITS) == []
    assert TEMPLATE.out_block(wl, TEMPLATE.default_config(wl)) == 16
    # a layer of fewer tiles than 4 gets a register block of all of them
    small = workload(1, 8, 3, 3, 12)
    assert TEMPLATE.decode(small, TEMPLATE.default_config(small))["tile_p"] == 1
    assert TEMPLATE.decode(small, TEMPLATE.default_config(small))["tile_oc"] == (1, 12)
    assert TEMPLATE.decode(small, TEMPLATE.default_config(small))["vec"] == 4


def test_pack_weight_is_the_filter_transform_blocked_by_oc_bn() -> None:
    wl = workload(1, 6, 9, 9, 8)
    weight = np.random.default_rng(0).uniform(-1, 1, (8, 6, 3, 3)).astype(np.float32)
    for m, oc_bn in ((2, 4), (4, 8), (6, 4)):
        cfg = config(wl, tile_size=m, oc_bn=oc_bn, vec=4)
        packed = TEMPLATE.pack_weight(wl, cfg, weight)
        alpha = m + 2
        assert packed.shape == (8 // oc_bn, alpha * alpha, 6, oc_bn)
        u = pack_filter(winograd_op(TEMPLATE.parse(wl), m), weight)  # [a, a, C, K]
        for kb in range(8 // oc_bn):
            for b in range(alpha * alpha):
                np.testing.assert_array_equal(
                    packed[kb, b], u[b // alpha, b % alpha, :, kb * oc_bn:(kb + 1) * oc_bn])
        assert TEMPLATE.codegen(wl, cfg).buffers[1].shape == packed.shape


def test_a_record_from_before_wide_tile_keeps_its_index_and_kernel() -> None:
    """wide_tile (F(6x6)) is the most significant knob: a record stored before it (no
    such knob in its entity) decodes as the F(4x4) it was timed as, at the same index."""
    wl = workload(1, 64, 56, 56, 64)
    cfg = TEMPLATE.default_config(wl)
    before = Config(index=cfg.index,
                    entity=tuple(e for e in cfg.entity if e.name != "wide_tile"))
    assert TEMPLATE.decode(wl, before) == TEMPLATE.decode(wl, cfg)
    assert TEMPLATE.decode(wl, before)["wide_tile"] is False
    assert TEMPLATE.space(wl).normalize(TEMPLATE.space(wl).to_config(
        TEMPLATE.decode(wl, before))).index == cfg.index
    assert TEMPLATE.codegen(wl, before).source == TEMPLATE.codegen(wl, cfg).source
    wide = config(wl, tile_size=6)
    assert wide.index == cfg.index + len(TEMPLATE.space(wl)) // 2
    assert TEMPLATE.codegen(wl, wide).meta["tile_size"] == 6


def test_default_variants_switch_the_tile_size_alone() -> None:
    """What a search measures right after the default: the default at the two other tile
    sizes, every other knob as the default's (tile_p at most the image's tiles), each a
    config the device takes."""
    lanes16 = CPU_LIMITS.model_copy(update={"simd_lanes": 16})
    for wl, default_m in ((workload(1, 64, 224, 224, 64), 4), (workload(1, 512, 7, 7, 512), 2),
                          (workload(1, 8, 3, 3, 12), 4)):
        default = TEMPLATE.decode(wl, TEMPLATE.default_config(wl, lanes16))
        assert tile_m(default) == default_m
        variants = [TEMPLATE.decode(wl, c) for c in TEMPLATE.default_variants(wl, lanes16)]
        assert sorted(tile_m(v) for v in variants) == sorted({2, 4, 6} - {default_m})
        for v, c in zip(variants, TEMPLATE.default_variants(wl, lanes16)):
            assert TEMPLATE.check_limits(wl, c, lanes16) == []
            tiles = winograd_op(TEMPLATE.parse(wl), tile_m(v)).tiles
            assert v["tile_p"] == min(default["tile_p"], tiles)
            same = {k: x for k, x in v.items() if k not in ("tile_size", "wide_tile", "tile_p")}
            assert same == {k: x for k, x in default.items()
                            if k not in ("tile_size", "wide_tile", "tile_p")}


def test_config_rules_name_the_problem() -> None:
    wl = workload(1, 64, 7, 7, 64)
    assert TEMPLATE.check_limits(wl, config(wl, vec=16, oc_bn=8), CPU_LIMITS) == [
        "vec 16 does not divide the output-channel block 8"]
    # 7x7 in 4x4 tiles: 4 tiles, a register block of 5 would repeat one
    assert TEMPLATE.check_limits(wl, config(wl, tile_p=5), CPU_LIMITS) == [
        "tile_p 5 is more than the layer's 4 tiles of 4x4"]
    assert TEMPLATE.check_limits(wl, config(wl, tile_p=8, tile_size=2), CPU_LIMITS) == []
    # F(6x6) takes F(4x4)'s place; beside F(2x2) it would be the same kernel twice
    assert TEMPLATE.check_limits(wl, config(wl, tile_size=2, wide_tile=True, tile_p=4),
                                 CPU_LIMITS) == [
        "wide_tile takes tile_size 4's place, not tile_size 2's (the same F(6x6) kernel)"]
    assert TEMPLATE.check_limits(wl, config(wl, tile_p=8, tile_size=2, oc_bn=64),
                                 CPU_LIMITS) == [
        "512 accumulators per work-item (8 tiles x 64 channels) > 256"]
    with pytest.raises(ConfigError, match="does not divide"):
        TEMPLATE.codegen(wl, config(wl, vec=16, oc_bn=8))
    indices = np.arange(len(TEMPLATE.space(wl)))
    mask = TEMPLATE.valid_mask(wl, indices, CPU_LIMITS)
    assert 0 < mask.sum() < len(indices)
    for i in (0, len(indices) // 3, len(indices) - 1):
        assert mask[i] == (not TEMPLATE.check_limits(wl, TEMPLATE.space(wl).get(int(i)),
                                                      CPU_LIMITS))


def test_features_have_the_same_keys_for_every_config() -> None:
    wl = workload(1, 128, 28, 28, 128)
    names = TEMPLATE.feature_names(wl)
    matrix = TEMPLATE.feature_matrix(wl, np.arange(len(TEMPLATE.space(wl))))
    assert matrix.shape == (len(TEMPLATE.space(wl)), len(names)) and np.isfinite(matrix).all()
    assert names == TEMPLATE.feature_names(workload(1, 64, 7, 7, 32))
    one = TEMPLATE.features(wl, TEMPLATE.default_config(wl))
    assert one["log_tile_size"] == 2 and one["log_tile_p"] == 2
    # F(4x4) on 28x28: 36 points per 16 outputs against 9 multiplies each
    assert one["gemm_flop_ratio"] == pytest.approx(36 * 49 / (9 * 784))


def test_compiler_extracts_the_task_beside_the_direct_one() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 8, 10, 10))
    rng = np.random.default_rng(0)
    w3 = b.const(rng.uniform(-1, 1, (16, 8, 3, 3)).astype(np.float32))
    w1 = b.const(rng.uniform(-1, 1, (16, 16, 1, 1)).astype(np.float32))
    conv3 = b.call("nn.conv2d", [x, w3], "conv3", padding=(1, 1, 1, 1))
    conv1 = b.call("nn.conv2d", [conv3, w1], "conv1")
    graph = optimize(b.finish([conv1]))
    tasks = extract_tasks(graph, CPU)
    # the 1x1 layer: the direct template and the 1x1 packed GEMM (tests/test_conv1x1.py)
    assert [t.template for t in tasks] == [CONV_CPU, WINOGRAD_CPU, "conv2d_NCHWc_gemm.x86",
                                           CONV_CPU, CONV1X1_CPU]
    assert tasks[1].workload.args == tasks[0].workload.args  # the same workload
    # no records: the default build keeps the direct template
    plan, chosen, _ = select_layers(graph, CPU, None, DeviceLimits())
    assert [t.template for t in chosen] == [CONV_CPU, CONV_CPU]


PREFETCH_WL = workload(1, 256, 14, 14, 256)  # U 4 MB at F(2x2), the 16-lane default


def test_large_transformed_weights_prefetch_the_next_groups_slice() -> None:
    """Where U is 1 MB or more, a GEMM work-item prefetches the U slice of the next
    group's work-item (the next oc block, same point), a share each pass over its tiles
    and chunk of channels: the whole slice, inside it. Not for a small U nor one oc
    block. (numpy checks the kernel in ``test_prefetching_kernel_matches_numpy`` and the
    8-lane defaults of the ResNet-50 layers' test, whose U is 2.4-38 MB.)"""
    wl = PREFETCH_WL
    cfg = TEMPLATE.default_config(wl, DeviceLimits(simd_lanes=16))
    knobs = TEMPLATE.decode(wl, cfg)
    assert (knobs["tile_size"], knobs["tile_oc"][1], knobs["tile_p"]) == (2, 64, 4)
    passes = -(-49 // 4)  # 7 x 7 tiles of 2 x 2, 4 a register block
    src = TEMPLATE.codegen(wl, cfg, "opencl", Epilogue(), IOLayout(64, 64)).source
    walks = [q * 256 * 64 + c * 64 for q in range(passes) for c in range(0, 256, 16)]
    distance, covered = next_block_prefetch(src, walks, floats=256 * 64)
    assert distance == 16 * 256 * 64 and covered.all()  # alpha^2 slices a block
    assert "cq += 16" in src and f") / {passes});" in src
    small = workload(1, 64, 56, 56, 64)
    assert "PREFETCH(wf" not in TEMPLATE.codegen(small, TEMPLATE.default_config(small)).source
    assert "PREFETCH(wf" not in TEMPLATE.codegen(wl, config(wl, oc_bn=256, vec=16)).source


def input_transform(source: str) -> str:
    return source.split("wino_cpu_input_transform(")[1].split("KERNEL")[0]


def test_a_large_v_is_streamed_by_whole_cache_lines() -> None:
    """V of ``STREAM_V_BYTES`` or more is written with non-temporal stores, 16 lanes (a
    cache line) each: VGG's 224x224 layer at the 16-lane default; not its 28x28 one (V
    3.6 MB, read from the caches), nor 8-lane input vectors (half a line a store)."""
    vgg224, vgg28 = workload(1, 64, 224, 224, 64), workload(1, 512, 28, 28, 512)
    lanes16 = DeviceLimits(simd_lanes=16)
    big = TEMPLATE.codegen(vgg224, TEMPLATE.default_config(vgg224, lanes16)).source
    assert input_transform(big).count("VSTREAM(16, ") == 36  # every point of F(4x4)
    assert "VSTORE(" not in input_transform(big)
    small = TEMPLATE.codegen(vgg28, TEMPLATE.default_config(vgg28, lanes16)).source
    assert "VSTREAM(" not in input_transform(small)
    half = TEMPLATE.codegen(vgg224, config(vgg224, vec=8)).source
    assert "VSTREAM(" not in input_transform(half)


# ---- on the OpenCL device ----

# (workload, knobs, epilogue, layout): both tile sizes; padding 1 and 0; odd and
# non-square H x W (cropped last tiles); two images; C and K not multiples of 8 or 16;
# vec 1 (plain floats), gathered and vector-loaded input lanes; a register block that
# does not divide the tiles; vector and lane-wise stores and epilogues.
CASES = [
    (workload(1, 16, 8, 8, 16), dict(tile_size=2, tile_p=4), FULL, IOLayout()),
    (workload(1, 16, 8, 8, 16), dict(tile_size=4, tile_p=1), FULL, IOLayout(16, 16, 16)),
    (workload(1, 12, 9, 7, 24), dict(tile_size=2, oc_bn=8, tile_p=3, vec=4),
     Epilogue(("bias", "relu")), IOLayout(4, 8)),
    (workload(1, 12, 9, 7, 24), dict(tile_size=4, oc_bn=12, tile_p=2, vec=4, wg=2),
     FULL, IOLayout(6, 12, 8)),
    (workload(2, 10, 11, 13, 6, pad=0), dict(tile_size=4, oc_bn=6, tile_p=5, vec=2),
     Epilogue(("relu", "add")), IOLayout(0, 3, 2)),
    (workload(2, 10, 11, 13, 6, pad=0), dict(tile_size=2, oc_bn=3, tile_p=7, vec=1, wg=4),
     FULL, IOLayout(5, 0, 6)),
    (workload(1, 24, 14, 14, 32), dict(tile_size=4, oc_bn=32, tile_p=8, vec=16),
     Epilogue(("bias", "add")), IOLayout(8, 32, 32)),
    (workload(1, 24, 14, 14, 32), dict(tile_size=2, oc_bn=16, tile_p=6, vec=8),
     Epilogue(("bias", "clip:0.0:6.0")), IOLayout(0, 16)),
    (workload(1, 3, 5, 5, 4), dict(tile_size=4, oc_bn=4, tile_p=1, vec=4), Epilogue(),
     IOLayout()),
    (workload(1, 16, 14, 14, 16), dict(tile_size=6, tile_p=4), FULL, IOLayout(16, 16, 16)),
    (workload(2, 10, 11, 13, 6, pad=0), dict(tile_size=6, oc_bn=6, tile_p=3, vec=2, wg=4),
     Epilogue(("bias", "relu")), IOLayout(0, 3)),
    (workload(1, 12, 9, 7, 24), dict(tile_size=6, oc_bn=8, tile_p=2, vec=1, wg=2),
     FULL, IOLayout(4, 0, 8)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_matches_numpy(device: Device, case: int) -> None:
    wl, knobs, epilogue, io = CASES[case]
    cfg = config(wl, **knobs)
    assert TEMPLATE.check_limits(wl, cfg, CPU_LIMITS) == []
    got, want = run_blocked(device, TEMPLATE, wl, cfg, epilogue, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{knobs} {epilogue.ops} {io}: {why}"


def test_cases_cover_every_tile_size_layouts_and_store_paths() -> None:
    seen = [(config(wl, **dict(k)), wl, io) for wl, k, _, io in CASES]
    knobs = [TEMPLATE.decode(wl, c) for c, wl, _ in seen]
    assert {6 if k["wide_tile"] else k["tile_size"] for k in knobs} == {2, 4, 6}
    assert {k["vec"] for k in knobs} >= {1, 2, 4, 8, 16}
    assert any(io.out_block == k["tile_oc"][1] for k, (_, _, io) in zip(knobs, seen))
    assert any(io.out_block not in (0, k["tile_oc"][1]) for k, (_, _, io) in zip(knobs, seen))
    for field in ("data_block", "out_block", "residual_block"):
        assert {getattr(io, field) for _, _, io in seen} > {0}
    sources = [TEMPLATE.codegen(wl, c, "opencl", FULL, io).source for c, wl, io in seen]
    assert any("WMAKE(" in s.split("wino_cpu_input_transform(")[1].split("KERNEL")[0]
               for s in sources)  # a gathered plain-NCHW input somewhere
    assert any("min(p0 +" in s for s in sources)  # a register block's tail


@cache
def resnet_requests(m: int = 4) -> list[MeasureRequest]:
    out = []
    for c, h in ((64, 56), (128, 28), (256, 14), (512, 7)):
        wl = workload(1, c, h, h, c)
        out.append(MeasureRequest(WINOGRAD_CPU, wl, config(wl, tile_size=m), CHECK))
    return out


@pytest.mark.parametrize("m", [4, 6])
def test_resnet50_3x3_layers_at_f4x4_and_f6x6_are_within_the_measurers_tolerance(
        device: Device, m: int) -> None:
    """F(4x4) and F(6x6) round more than direct convolution; at C = 512 they must still
    pass the check every trial passes (rtol 1e-4, atol 1e-4 x max |ref| against float64)."""
    for req in resnet_requests(m):
        res = measure(device, req)
        assert res.ok, f"F({m}) {req.workload.args[0]}: {res.error_no.name} {res.error_msg}"


STREAMED_WL = workload(1, 32, 14, 10, 32)  # 16-lane input vectors: V streamed at any size
STREAMED = dict(oc_bn=32, vec=16, tile_p=3)
# (images, channels, tile size, data block): two images, a data block of 32 that a lane
# group's c0 does not start, every tile size, plain NCHW (gathered lanes)
STREAM_CASES = [(1, 32, 4, 16), (2, 48, 2, 0), (2, 32, 6, 32), (1, 64, 4, 32)]


def test_every_streamed_store_is_aligned_to_a_cache_line(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A VSTREAM casts to a 16-float vector pointer: every offset from V's base (whose
    allocation is aligned) is a multiple of 16 floats, for every case below."""
    monkeypatch.setattr(winograd_cpu, "STREAM_V_BYTES", 0)
    for n, c, m, db in STREAM_CASES:
        wl = workload(n, c, 9, 11, 32)
        src = input_transform(TEMPLATE.codegen(
            wl, config(wl, tile_size=m, **STREAMED), "opencl", Epilogue(),
            IOLayout(db, 32)).source)
        base = re.search(r"GLOBAL float\* dst = V \+ r \* (\d+) \+ c0;", src)
        assert base is not None and int(base.group(1)) % 16 == 0, src
        assert re.search(r"const int c0 = cg \* 16;", src)
        stores = re.findall(r"VSTREAM\(16, v\d+_\d+, 0, dst \+ (\d+) \+ tw \* (\d+)\)", src)
        assert len(stores) == (m + 2) ** 2, (n, c, m, db)
        assert all(int(a) % 16 == 0 and int(b) % 16 == 0 for a, b in stores)


@pytest.mark.parametrize("case", STREAM_CASES)
def test_streamed_kernel_matches_numpy(device: Device, monkeypatch: pytest.MonkeyPatch,
                                       case: tuple[int, int, int, int]) -> None:
    """V written with non-temporal stores (here at any size): one and two images, every
    tile size, plain NCHW (gathered lanes) and blocked data."""
    monkeypatch.setattr(winograd_cpu, "STREAM_V_BYTES", 0)
    n, c, m, db = case
    wl = workload(n, c, 9, 11, 32)
    cfg = config(wl, tile_size=m, **STREAMED)
    io = IOLayout(db, 32, 32)
    assert "VSTREAM(16, " in input_transform(TEMPLATE.codegen(wl, cfg, "opencl", FULL,
                                                              io).source)
    got, want = run_blocked(device, TEMPLATE, wl, cfg, FULL, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{case}: {why}"


def test_prefetching_kernel_matches_numpy(device: Device) -> None:
    cfg = TEMPLATE.default_config(PREFETCH_WL, DeviceLimits(simd_lanes=16))
    got, want = run_blocked(device, TEMPLATE, PREFETCH_WL, cfg, FULL, IOLayout(64, 64, 64))
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, why


def test_measurer_refuses_impossible_configs_with_error_1(device: Device) -> None:
    wl = workload(1, 64, 7, 7, 64)
    for cfg in (config(wl, vec=16, oc_bn=8), config(wl, tile_p=5)):
        res = measure(device, MeasureRequest(WINOGRAD_CPU, wl, cfg, CHECK))
        assert res.error_no == MeasureErrorNo.INSTANTIATION_ERROR, res
        assert "config does not fit" in res.error_msg


def record(wl: Workload, cfg: Config, seconds: float) -> Record:
    return Record(target=CPU, workload=wl, config=cfg,
                  result=MeasureResult(costs=(seconds,), error_no=MeasureErrorNo.NO_ERROR))


def test_build_takes_winograd_where_it_measured_faster_and_chains_blocked_layouts(
        device: Device) -> None:
    """conv1 (direct) -> conv2 (Winograd) -> conv3 (Winograd, conv1 as residual) ->
    conv4 (direct, graph output): Winograd layers read and write NCHW[x]c between direct
    ones, and the model equals the graph interpreter."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()

    def w(*shape: int):  # type: ignore[no-untyped-def]
        return b.const(rng.uniform(-0.3, 0.3, shape).astype(np.float32))

    x = b.input("x", (1, 16, 14, 14))
    pad = dict(padding=(1, 1, 1, 1))
    c1 = b.call("nn.relu", [b.call("nn.bias_add", [
        b.call("nn.conv2d", [x, w(24, 16, 1, 1)], "conv1"), w(24)])])
    c2 = b.call("nn.relu", [b.call("nn.conv2d", [c1, w(32, 24, 3, 3)], "conv2", **pad)])
    c3 = b.call("nn.bias_add", [b.call("nn.conv2d", [c2, w(24, 32, 3, 3)], "conv3", **pad),
                                w(24)])
    c3 = b.call("nn.relu", [b.call("add", [c3, c1])])
    c4 = b.call("nn.conv2d", [c3, w(20, 24, 1, 1)], "conv4")
    graph = optimize(b.finish([c4]))
    xs = rng.uniform(-1, 1, (1, 16, 14, 14)).astype(np.float32)
    want = evaluate(graph, [xs])[0]

    # Winograd records faster than the direct ones: F(2x2) for conv2, F(4x4) with
    # oc_bn 8 (an output block other than its reader's data block) for conv3
    winograd_knobs = {"conv2": {"tile_size": 2}, "conv3": {"tile_size": 4, "oc_bn": 8}}
    records = []
    for node in graph.ops():
        if node.op not in ("nn.conv2d", "fused.conv2d"):
            continue
        found = {w.template: w for w in candidates(node, CPU)}
        direct = found[CONV_CPU]
        records.append(record(direct, get_template(CONV_CPU).default_config(direct), 2e-3))
        if WINOGRAD_CPU in found:
            wl = found[WINOGRAD_CPU]
            records.append(record(wl, config(wl, **winograd_knobs[node.name]), 1e-3))
    module = build(graph, target=str(device.target), records=MemorySource(records),
                   optimized=True)
    assert [c.template for c in module.choices] == [CONV_CPU, WINOGRAD_CPU, WINOGRAD_CPU,
                                                    CONV_CPU]
    assert all(c.source == THIS_DEVICE for c in module.choices)
    steps = [s for s in module.program.steps if "conv" in s.name]
    shapes = [[buf.shape for buf in s.kernel.buffers] for s in steps]
    assert shapes[1][0] == (1, 2, 14, 14, 12) and shapes[1][-1] == (1, 2, 14, 14, 16)
    assert shapes[2][0] == (1, 2, 14, 14, 16) and shapes[2][-2] == (1, 2, 14, 14, 12)
    assert shapes[2][-1] == (1, 3, 14, 14, 8) and shapes[3][0] == (1, 3, 14, 14, 8)
    got = module.run([xs])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


# ---- CUDA: the same kernel body compiles with nvcc ----

@needs_nvcc
def test_cuda_sources_compile_with_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    """Every case's CUDA source, the 16-lane ones with V streamed (VSTREAM)."""
    monkeypatch.setattr(winograd_cpu, "STREAM_V_BYTES", 0)
    entries = ("wino_cpu_input_transform", "wino_cpu_batched_gemm", "wino_cpu_output_transform")
    sources = []
    prefetching = (PREFETCH_WL, {}, FULL, IOLayout(16, 16, 16))  # the 8-lane default
    streamed = (STREAMED_WL, STREAMED, FULL, IOLayout(16, 32, 32))
    for wl, knobs, epilogue, io in [*CASES, prefetching, streamed]:
        src = TEMPLATE.codegen(wl, config(wl, **knobs), "cuda", epilogue, io).source
        for entry in entries:
            src = src.replace(entry, f"{entry}_{len(sources)}")
        sources.append(src)
    assert any("VSTREAM(16, " in src for src in sources)
    path = tmp_path / "winograd_cpu.cu"
    path.write_text("\n".join(sources))
    proc = nvcc_ptx(path)
    assert proc.returncode == 0, proc.stderr[:3000]
    found = set(re.findall(r"\.entry\s+(\w+)", path.with_suffix(".ptx").read_text()))
    assert found == {f"{e}_{i}" for e in entries for i in range(len(sources))}

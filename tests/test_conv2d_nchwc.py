"""``conv2d_NCHWc.x86``, the CPU-class conv2d template: correct on PoCL, TopHub's llvm
records are configs of its space, its CUDA source compiles.

Acceptance: >= 20 random valid configs on each of >= 5 ResNet-50 / VGG-16 layers (3x3 and
1x1, strides 1 and 2, the 7x7 stride-2 stem) equal numpy on PoCL (rtol 1e-4, the check
inside ``measure``), and each fused epilogue; every ``conv2d_NCHWc.x86`` record of
llvm_v0.04.log decodes to a config of our space with the same ``index``, and one measured
on PoCL is correct; the CUDA source of a spread of configs compiles with
``nvcc -ptx -arch=sm_80``. A performance sanity line is printed, never asserted.

Random configs are drawn under CPU limits: 8 work-items per group and the 256-accumulator
register budget (every TopHub llvm record fits it).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    NVCC_ARGS,
    TOPHUB_DIR,
    MeasurePool,
    describe_failures,
    nchwc_config,
    nchwc_workload,
    needs_nvcc,
    next_block_prefetch,
    nvcc_ptx,
)

from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, measure
from compiler.templates import ConfigError, Epilogue, WorkloadError, get_template
from compiler.templates.conv2d_nchwc import (
    DEFAULT_WG,
    default_oc_bn,
    default_reg_n,
    default_vec,
    strided_loops,
)
from schemas import Config, DeviceLimits, KnobEntity, MeasureOptions, Workload
from schemas.record import read_lines

NAME = "conv2d_NCHWc.x86"
TEMPLATE = get_template(NAME)
CONFIGS_PER_WORKLOAD = 20
OPTIONS = MeasureOptions(number=1, repeat=1, timeout_s=90)
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
LLVM_LOG = TOPHUB_DIR / "llvm_v0.04.log"
TOPHUB_RECORDS = 35


# ResNet-50 (stem, 3x3 of stage 2 = the perf layer, stride-2 3x3 of v1.5's stage 3, the
# stride-2 1x1 projection, the 7x7 1x1 of stage 5 whose odd height leaves a tile_oh=2
# tail) and VGG-16's conv5 at 14x14.
SWEEP: dict[str, Workload] = {
    "resnet50.conv1.7x7s2": nchwc_workload(1, 3, 224, 64, 7, 2, 3),
    "resnet50.res2.3x3": nchwc_workload(1, 64, 56, 64, 3, 1, 1),
    "resnet50.res3a.3x3s2": nchwc_workload(1, 128, 56, 128, 3, 2, 1),
    "resnet50.res3a.1x1s2": nchwc_workload(1, 256, 56, 512, 1, 2, 0),
    "resnet50.res5.1x1": nchwc_workload(1, 2048, 7, 512, 1, 1, 0),
    "vgg16.conv5.3x3": nchwc_workload(1, 512, 14, 512, 3, 1, 1),
}
PERF_LAYER = "resnet50.res2.3x3"

EPILOGUES = (Epilogue(("bias", "relu")), Epilogue(("bias", "add", "relu")),
             Epilogue(("relu", "add")))


@lru_cache(maxsize=None)
def draw_configs(name: str, count: int = CONFIGS_PER_WORKLOAD) -> tuple[Config, ...]:
    """Distinct configs that fit CPU_LIMITS, drawn with a seed fixed per layer."""
    wl = SWEEP[name]
    rng = random.Random(zlib.crc32(f"{NAME}/{name}".encode()))
    found: dict[int, Config] = {}
    while len(found) < count:
        config = TEMPLATE.random_config(wl, rng, CPU_LIMITS)
        found.setdefault(config.index, config)
    return tuple(found.values())


# ---- workload, space, packing, limits, features (no device) ----

def test_workload_is_autotvms_eight_args_nchw_only() -> None:
    wl = SWEEP["resnet50.res2.3x3"]
    assert TEMPLATE.output_shape(wl) == (1, 64, 56, 56)
    assert TEMPLATE.flops(wl) == 2 * 64 * 56 * 56 * 64 * 9
    for i, layout in ((5, "NCHW8c"), (6, "NHWC")):
        args = list(wl.args)
        args[i] = layout
        with pytest.raises(WorkloadError, match=rf"args\[{i}\].*{layout}.*only \"NCHW\""):
            TEMPLATE.parse(Workload(template=NAME, args=args))
    six = [*wl.args[:5], "float32"]
    with pytest.raises(WorkloadError, match="expected .*layout, out_layout, out_dtype.*6 items"):
        TEMPLATE.parse(Workload(template=NAME, args=six))


def test_knobs_are_autotvms_then_the_opencl_ones() -> None:
    """Then the loop knobs (tests/test_nchwc_space.py)."""
    conv3 = TEMPLATE.space(SWEEP["resnet50.res2.3x3"])
    assert [k.name for k in conv3.knobs] == ["tile_ic", "tile_oc", "tile_ow", "unroll_kw",
                                             "vec", "wg", "order_oc", "unroll_ci"]
    assert conv3.knobs[3].candidates == (True, False)
    conv1 = TEMPLATE.space(SWEEP["resnet50.res5.1x1"])
    assert [k.name for k in conv1.knobs] == ["tile_ic", "tile_oc", "tile_ow", "tile_oh",
                                             "vec", "wg", "order_oc", "unroll_ci"]
    assert conv1.knobs[3].candidates == (1, 2)
    one_row = TEMPLATE.space(nchwc_workload(1, 64, 1, 64, 1, 1, 0))
    assert one_row.knobs[3].candidates == (1,)
    # tile_ow keeps AutoTVM's filter: the inner factor (reg_n) is at most 64
    stem = TEMPLATE.space(SWEEP["resnet50.conv1.7x7s2"])
    assert max(v[1] for v in stem.knobs[2].values) == 56
    assert len(stem.knobs[2]) == 9


def test_pack_weight_is_oihw_blocked_by_ic_bn_and_oc_bn() -> None:
    wl = nchwc_workload(1, 8, 6, 12, 3, 1, 1)
    config = nchwc_config(wl, tile_ic=4, tile_oc=6, tile_ow=3, vec=2)
    w = np.random.default_rng(0).standard_normal((12, 8, 3, 3)).astype(np.float32)
    packed = TEMPLATE.pack_weight(wl, config, w)
    assert packed.shape == (2, 2, 3, 3, 4, 6) and packed.flags.c_contiguous
    for kb, cb, r, s, ci, co in [(0, 0, 0, 0, 0, 0), (1, 0, 2, 1, 3, 5), (1, 1, 1, 2, 2, 4)]:
        assert packed[kb, cb, r, s, ci, co] == w[kb * 6 + co, cb * 4 + ci, r, s]
    kernel = TEMPLATE.codegen(wl, config)
    assert kernel.buffers[1].shape == packed.shape
    arrays = TEMPLATE.make_inputs(wl, Epilogue(), np.random.default_rng(1))
    assert TEMPLATE.kernel_inputs(wl, config, arrays)[1].shape == packed.shape


def test_check_limits_vec_workgroup_and_register_budget() -> None:
    wl = SWEEP["resnet50.res2.3x3"]
    assert TEMPLATE.check_limits(wl, nchwc_config(wl, tile_ic=16, tile_oc=16, tile_ow=8),
                                 CPU_LIMITS) == []
    (why,) = TEMPLATE.check_limits(wl, nchwc_config(wl, tile_ic=16, tile_oc=8, tile_ow=8),
                                   CPU_LIMITS)
    assert "vec 16 does not divide" in why
    (why,) = TEMPLATE.check_limits(wl, nchwc_config(wl, tile_ic=16, tile_oc=64, tile_ow=8),
                                   CPU_LIMITS)
    assert "512 accumulators" in why
    small = CPU_LIMITS.model_copy(update={"max_threads_per_block": 4, "max_thread_x": 2})
    problems = TEMPLATE.check_limits(wl, nchwc_config(wl, tile_ic=16, tile_oc=16, tile_ow=8,
                                                     wg=8), small)
    assert len(problems) == 2 and "8 work-items" in problems[0]
    # a tile_oh=2 block counts both rows
    wl1 = SWEEP["resnet50.res5.1x1"]
    (why,) = TEMPLATE.check_limits(wl1, nchwc_config(wl1, tile_ic=4, tile_oc=32, tile_ow=7,
                                                    tile_oh=2), DeviceLimits(max_local_elements=256))
    assert "448 accumulators per work-item (2 rows x 7 x 32 channels)" in why


def test_features_have_the_same_keys_for_every_config() -> None:
    rng = random.Random(5)
    keys = None
    for name in ("resnet50.res2.3x3", "resnet50.res5.1x1", "resnet50.conv1.7x7s2"):
        wl = SWEEP[name]
        space = TEMPLATE.space(wl)
        for _ in range(30):
            feats = TEMPLATE.features(wl, space.sample(rng))
            assert all(np.isfinite(v) for v in feats.values())
            keys = keys or set(feats)
            assert set(feats) == keys


def test_default_config_fits_and_follows_the_x86_fallback() -> None:
    for name, wl in SWEEP.items():
        config = TEMPLATE.default_config(wl)
        assert TEMPLATE.check_limits(wl, config, CPU_LIMITS) == [], name
        assert TEMPLATE.space(wl).normalize(config) == config
    k = TEMPLATE.decode(SWEEP["resnet50.conv1.7x7s2"],
                        TEMPLATE.default_config(SWEEP["resnet50.conv1.7x7s2"]))
    assert k == {"tile_ic": (1, 3), "tile_oc": (4, 16), "tile_ow": (28, 4), "unroll_kw": True,
                 "vec": 16, "wg": 1, "order_oc": 0, "unroll_ci": 1}
    # a 1x1 kernel's ci loop is unrolled by 2
    k = TEMPLATE.decode(SWEEP["resnet50.res5.1x1"],
                        TEMPLATE.default_config(SWEEP["resnet50.res5.1x1"]))
    assert (k["tile_ic"][1], k["tile_oh"], k["order_oc"], k["unroll_ci"]) == (16, 1, 0, 2)
    # a strided 3x3: channel blocks innermost, ci unrolled by 8 (ic_bn 16); stride 1 and
    # the stem (ic_bn 3: no unroll divides it) keep the loops as they were
    k = TEMPLATE.decode(SWEEP["resnet50.res3a.3x3s2"],
                        TEMPLATE.default_config(SWEEP["resnet50.res3a.3x3s2"]))
    assert (k["tile_ic"][1], k["order_oc"], k["unroll_ci"]) == (16, 1, 8)
    for name in ("resnet50.res2.3x3", "vgg16.conv5.3x3"):
        k = TEMPLATE.decode(SWEEP[name], TEMPLATE.default_config(SWEEP[name]))
        assert (k["order_oc"], k["unroll_ci"]) == (0, 1), name


def test_strided_loops_take_the_largest_unroll_dividing_ic_bn() -> None:
    s2 = TEMPLATE.parse(nchwc_workload(1, 12, 14, 16, 3, 2, 1))
    assert [strided_loops(s2, ic_bn) for ic_bn in (16, 12, 3)] == [
        {"order_oc": 1, "unroll_ci": 8}, {"order_oc": 1, "unroll_ci": 4}, {}]
    assert strided_loops(TEMPLATE.parse(SWEEP["resnet50.res3a.1x1s2"]), 16) == {}
    assert strided_loops(TEMPLATE.parse(SWEEP["resnet50.res2.3x3"]), 16) == {}


def test_default_reg_n_keeps_avx2_registers_free() -> None:
    # 4-6 output x where OW has such a factor (<= 96 of 128 accumulators at oc_bn 16),
    # else AutoTVM's largest factor up to 8
    assert [default_reg_n(ow) for ow in (224, 112, 56, 28, 14, 7, 12, 5, 3, 1)] == [
        4, 4, 4, 4, 7, 7, 6, 5, 3, 1]
    for ow in range(1, 300):
        reg_n = default_reg_n(ow)
        assert ow % reg_n == 0 and reg_n <= 8


AVX512 = DeviceLimits(**{**CPU_LIMITS.model_dump(), "simd_lanes": 16})
AVX2 = DeviceLimits(**{**CPU_LIMITS.model_dump(), "simd_lanes": 8})


def test_a_16_lane_device_gets_two_vectors_by_up_to_8_pixels() -> None:
    """AVX-512 (16 lanes): oc_bn 32 where it divides K, reg_n the largest factor of OW
    up to 8; an 8-lane device, or one whose lanes are unknown, keeps the AVX2 tile."""
    assert [default_reg_n(ow, 16) for ow in (224, 112, 56, 28, 14, 7, 12, 5)] == [
        8, 8, 8, 7, 7, 7, 6, 5]
    assert [default_oc_bn(co, 16) for co in (64, 256, 32, 24, 16, 3)] == [32, 32, 32, 12, 16, 3]
    assert [default_oc_bn(co, 8) for co in (64, 24)] == [16, 12]
    for name, wl in SWEEP.items():
        before = TEMPLATE.default_config(wl)
        assert TEMPLATE.default_config(wl, AVX2) == before, name
        assert TEMPLATE.default_config(wl, DeviceLimits()) == before, name
        wide = TEMPLATE.default_config(wl, AVX512)
        assert TEMPLATE.check_limits(wl, wide, AVX512) == [], name
        k, op = TEMPLATE.decode(wl, wide), TEMPLATE.parse(wl)
        assert k["tile_oc"][1] == (32 if op.co % 32 == 0 else default_oc_bn(op.co)), name
        assert k["tile_ow"][1] == default_reg_n(op.ow, 16) and k["vec"] == 16, name
        assert k["tile_ic"][1] <= 16, name
    k = TEMPLATE.decode(SWEEP["resnet50.res2.3x3"],
                        TEMPLATE.default_config(SWEEP["resnet50.res2.3x3"], AVX512))
    assert (k["tile_ic"], k["tile_oc"], k["tile_ow"]) == ((4, 16), (2, 32), (7, 8))
    # strided 3x3: channel blocks innermost where the input outweighs the weights
    # (128 on 56x56), outermost at 16 lanes where the weights do (512 on 14x14)
    res3a, res5a = SWEEP["resnet50.res3a.3x3s2"], nchwc_workload(1, 512, 14, 512, 3, 2, 1)
    assert strided_loops(TEMPLATE.parse(res3a), 16, 16) == {"order_oc": 1, "unroll_ci": 8}
    assert strided_loops(TEMPLATE.parse(res5a), 16, 16) == {"order_oc": 0, "unroll_ci": 8}
    assert strided_loops(TEMPLATE.parse(res5a), 16, 8) == {"order_oc": 1, "unroll_ci": 8}
    k = TEMPLATE.decode(res5a, TEMPLATE.default_config(res5a, AVX512))
    assert (k["order_oc"], k["unroll_ci"]) == (0, 8)


def test_16_lane_default_configs_match_numpy(measure_pool: MeasurePool) -> None:
    results = measure_pool.map([
        MeasureRequest(NAME, wl, TEMPLATE.default_config(wl, AVX512), OPTIONS)
        for wl in SWEEP.values()])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, describe_failures(failed)


def test_a_config_without_opencl_knobs_gets_their_defaults() -> None:
    wl = SWEEP["resnet50.res2.3x3"]
    for oc_bn, vec in ((32, 16), (16, 16), (8, 8), (4, 4), (2, 2), (1, 1)):
        full = nchwc_config(wl, tile_ic=8, tile_oc=oc_bn, tile_ow=8)
        tophub_like = Config(index=full.index, entity=tuple(
            e for e in full.entity if e.name not in ("vec", "wg")))
        k = TEMPLATE.decode(wl, tophub_like)
        assert (k["vec"], k["wg"]) == (vec, DEFAULT_WG) == (default_vec(oc_bn), 1)
    # only one of the two given: the other is missing, as for any knob
    half = Config(index=0, entity=(*tophub_like.entity, KnobEntity(name="wg", kind="ot",
                                                                   value=2)))
    with pytest.raises(ConfigError, match="missing vec"):
        TEMPLATE.decode(wl, half)


# ---- TopHub's llvm records ----

@lru_cache(maxsize=1)
def tophub_records() -> tuple:
    with LLVM_LOG.open() as f:
        return tuple((line_no, rec) for line_no, rec in read_lines(f)
                     if not isinstance(rec, Exception) and rec.workload.template == NAME)


def test_every_tophub_llvm_record_is_a_config_of_our_space() -> None:
    """All 35 records decode (vec/wg filled in), fit the CPU limits, and our enumeration
    gives each its own index: the space is AutoTVM's, knob for knob."""
    records = tophub_records()
    assert len(records) == TOPHUB_RECORDS
    failures, index_matches, fits, one_by_one = [], 0, 0, 0
    for line_no, rec in records:
        try:
            knobs = TEMPLATE.decode(rec.workload, rec.config)
        except (ConfigError, WorkloadError) as err:
            failures.append(f"line {line_no}: {err}")
            continue
        assert knobs["vec"] == default_vec(knobs["tile_oc"][1]) and knobs["wg"] == 1
        index_matches += TEMPLATE.autotvm_index(rec.workload, rec.config) == rec.config.index
        fits += not TEMPLATE.check_limits(rec.workload, rec.config, CPU_LIMITS)
        one_by_one += "tile_oh" in knobs
    assert not failures, "\n".join(failures)
    print(f"\n{len(records)} conv2d_NCHWc.x86 records: all decode, {index_matches} with "
          f"AutoTVM's index, {fits} fit {CPU_LIMITS.max_local_elements} accumulators "
          f"({one_by_one} are 1x1 with tile_oh)")
    assert index_matches == TOPHUB_RECORDS
    assert fits == TOPHUB_RECORDS


def test_tophub_configs_run_correctly_on_pocl(measure_pool: MeasurePool) -> None:
    """The tuned configs of ResNet-50's 56x56 3x3 layer and of a 1x1 with tile_oh=2,
    measured as TopHub wrote them (no vec/wg)."""
    picks = []
    for _, rec in tophub_records():
        data, kernel = tuple(rec.workload.args[0][1]), tuple(rec.workload.args[1][1])
        if (data, kernel) in (((1, 64, 56, 56), (64, 64, 3, 3)),
                              ((1, 1024, 14, 14), (256, 1024, 1, 1))):
            picks.append(rec)
    assert len(picks) == 2
    results = measure_pool.map([MeasureRequest(NAME, r.workload, r.config, OPTIONS)
                                for r in picks])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, describe_failures(failed)


# ---- correctness on PoCL ----

def test_sweep_meets_the_acceptance_bar() -> None:
    assert len(SWEEP) >= 5
    assert {n.split(".")[0] for n in SWEEP} == {"resnet50", "vgg16"}
    kinds = {(TEMPLATE.parse(wl).kh, TEMPLATE.parse(wl).stride[0]) for wl in SWEEP.values()}
    assert {(7, 2), (3, 1), (3, 2), (1, 1), (1, 2)} <= kinds
    for name in SWEEP:
        assert len({c.index for c in draw_configs(name)}) == CONFIGS_PER_WORKLOAD
    # the draws reach every vec and wg and both tile_oh values
    drawn = [TEMPLATE.decode(SWEEP[n], c) for n in SWEEP for c in draw_configs(n)]
    assert {k["vec"] for k in drawn} == {1, 2, 4, 8, 16}
    assert {k["wg"] for k in drawn} == {1, 2, 4, 8}
    assert {k.get("tile_oh") for k in drawn} >= {1, 2}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SWEEP))
def test_random_configs_match_numpy(measure_pool: MeasurePool, name: str) -> None:
    wl = SWEEP[name]
    results = measure_pool.map([MeasureRequest(NAME, wl, c, OPTIONS) for c in draw_configs(name)])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, (f"{len(failed)} of {len(results)} configs of {NAME} on {name} "
                        f"failed:\n{describe_failures(failed)}")


def epilogue_cases() -> list[tuple[Workload, Config, Epilogue]]:
    """Each epilogue on a padded 3x3 (border and interior work-items) and on a 1x1 whose
    last row block is a tile_oh=2 tail (its guarded store)."""
    wl3, wl1 = SWEEP["resnet50.res2.3x3"], SWEEP["resnet50.res5.1x1"]
    configs = [(wl3, nchwc_config(wl3, tile_ic=16, tile_oc=16, tile_ow=8, vec=8, wg=2)),
               (wl1, nchwc_config(wl1, tile_ic=64, tile_oc=16, tile_ow=7, tile_oh=2, vec=4))]
    return [(wl, c, ep) for wl, c in configs for ep in EPILOGUES]


def test_fused_epilogues_match_numpy(measure_pool: MeasurePool) -> None:
    results = measure_pool.map([MeasureRequest(NAME, wl, c, OPTIONS, ep)
                                for wl, c, ep in epilogue_cases()])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, describe_failures(failed)


def border_cases() -> list[tuple[Workload, Config]]:
    """x blocks whose window reaches into the padding get their own copy of the
    reduction: several per side, all blocks (no interior copy), one block for the whole
    row, and a last work-group with spare work-items."""
    stem, wl3, vgg = (SWEEP["resnet50.conv1.7x7s2"], SWEEP["resnet50.res2.3x3"],
                      SWEEP["vgg16.conv5.3x3"])
    return [
        (stem, nchwc_config(stem, tile_ic=1, tile_oc=16, tile_ow=1, unroll_kw=False)),
        (stem, nchwc_config(stem, tile_ic=3, tile_oc=4, tile_ow=56, vec=4)),
        (vgg, nchwc_config(vgg, tile_ic=32, tile_oc=16, tile_ow=14, unroll_kw=False)),
        (wl3, nchwc_config(wl3, tile_ic=8, tile_oc=32, tile_ow=2, vec=8, wg=8)),
    ]


def test_border_copies_are_generated_per_block() -> None:
    (stem, one), (_, every), (vgg, whole_row), (wl3, spare) = border_cases()
    src = TEMPLATE.codegen(stem, one).source
    # 7x7, pad 3, stride 2, reg_n 1: blocks 0 and 1 on the left, 111 on the right
    assert [int(b) for b in re.findall(r"owb == (\d+)", src)] == [0, 1, 111]
    assert "for (int s = 0; s < 7; ++s)" in src  # the interior copy keeps kw rolled
    assert re.findall(r"owb == (\d+)", TEMPLATE.codegen(stem, every).source) == ["0"]
    assert "owb ==" not in TEMPLATE.codegen(vgg, whole_row).source
    assert "if (owb >= 28) return;" in TEMPLATE.codegen(wl3, spare).source


def test_border_copies_match_numpy(measure_pool: MeasurePool) -> None:
    results = measure_pool.map([MeasureRequest(NAME, wl, c, OPTIONS) for wl, c in border_cases()])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, describe_failures(failed)


def test_large_weights_prefetch_the_next_channel_block() -> None:
    """Where the weight is 1 MB or more, every work-item of a channel block but its first
    prefetches a slice of the next block's weight, a row of taps at a time and before the
    row's bounds check (rows outside the image prefetch too): the slices cover the whole
    next block and stay inside it. Not for a small weight, nor with channel blocks
    innermost (the next block runs beside this one), nor with one block. (The kernels'
    outputs are checked against numpy with the other configs of these layers.)"""
    vgg, small = SWEEP["vgg16.conv5.3x3"], SWEEP["resnet50.res2.3x3"]
    src = TEMPLATE.codegen(vgg, nchwc_config(vgg, tile_ic=16, tile_oc=32, tile_ow=7)).source
    block = 512 * 9 * 32  # a channel block's weight, floats: C x 3 x 3 x oc_bn
    share = 14 * 2  # rows x x blocks: the work-items of one channel block
    assert "(long)(pq - 1)" in src  # a work-item's place: its row and x block
    row = re.search(r"wf = wn \+ \(int\)\(\(long\)\(wc - wk \+ r \* (\d+)\) / (\d+)\);", src)
    assert row and [int(g) for g in row.groups()] == [3 * 16 * 32, share - 1]
    lines = [line.strip() for line in src.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("GLOBAL const float* wf"))
    assert first < next(i for i, line in enumerate(lines) if line.endswith("continue;"))
    walks = [cb * 9 * 16 * 32 + r * 3 * 16 * 32 for cb in range(512 // 16) for r in range(3)]
    found, covered = next_block_prefetch(src, walks)
    assert found == block and covered.all()
    assert "PREFETCH(wf" not in TEMPLATE.codegen(small, TEMPLATE.default_config(small)).source
    inner = nchwc_config(vgg, tile_ic=16, tile_oc=32, tile_ow=7, order_oc=1)
    assert "PREFETCH(wf" not in TEMPLATE.codegen(vgg, inner).source
    one_block = nchwc_config(vgg, tile_ic=16, tile_oc=512, tile_ow=7, vec=16)
    assert "PREFETCH(wf" not in TEMPLATE.codegen(vgg, one_block).source


def test_default_configs_match_numpy(measure_pool: MeasurePool) -> None:
    results = measure_pool.map([MeasureRequest(NAME, wl, TEMPLATE.default_config(wl), OPTIONS)
                                for wl in SWEEP.values()])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, describe_failures(failed)


# ---- CUDA: the same kernel body compiles with nvcc ----

@pytest.mark.slow
@needs_nvcc
def test_cuda_sources_compile_with_nvcc(tmp_path: Path) -> None:
    """Every vec width, kw rolled and unrolled, a tile_oh tail, border copies, a partial
    work-group, the epilogues: one .cu file (entries renamed), recompiled one by one on
    failure."""
    cases: list[tuple[Workload, Config, Epilogue]] = []
    wl3, stem, wl1 = SWEEP["resnet50.res2.3x3"], SWEEP["resnet50.conv1.7x7s2"], \
        SWEEP["resnet50.res5.1x1"]
    for vec, ukw in ((1, True), (2, False), (4, True), (8, False), (16, True)):
        cases.append((wl3, nchwc_config(wl3, tile_ic=8, tile_oc=16, tile_ow=7, vec=vec,
                                       unroll_kw=ukw, wg=4), Epilogue()))
    cases.append((stem, nchwc_config(stem, tile_ic=3, tile_oc=32, tile_ow=8, vec=16,
                                    unroll_kw=False), Epilogue()))
    cases += epilogue_cases()
    cases += [(wl, c, Epilogue()) for wl, c in border_cases()]
    cases += [(wl1, c, Epilogue()) for c in draw_configs("resnet50.res5.1x1")[:3]]
    sources = []
    for i, (wl, config, ep) in enumerate(cases):
        k = TEMPLATE.codegen(wl, config, dialect="cuda", epilogue=ep)
        assert k.source.count(k.entry) == 1
        sources.append(k.source.replace(k.entry, f"{k.entry}_{i}"))
    # one prelude, then every kernel body
    path = tmp_path / "conv2d_nchwc.cu"
    path.write_text(sources[0] + "\n".join(s[s.index("KERNEL void"):] for s in sources[1:]))
    proc = nvcc_ptx(path)
    if proc.returncode == 0:
        entries = set(re.findall(r"\.entry\s+(conv2d_nchwc_kernel_\d+)", path.with_suffix(".ptx")
                                 .read_text()))
        assert len(entries) == len(cases)
        return
    problems = []
    for i, ((wl, config, ep), src) in enumerate(zip(cases, sources)):
        one = tmp_path / f"one_{i}.cu"
        one.write_text(src)
        single = nvcc_ptx(one)
        if single.returncode != 0:
            problems.append(f"workload {json.dumps(wl.args_json())} epilogue {ep.ops} config "
                            f"{json.dumps(config.to_json())}:\n{single.stderr.strip()[:2000]}")
    problems = problems or [proc.stderr.strip()[:2000]]
    pytest.fail("nvcc " + " ".join(NVCC_ARGS) + " rejected:\n" + "\n".join(problems))


# ---- performance sanity (printed, not asserted) ----

def test_performance_sanity_on_resnet50_56x56_3x3(device: Device,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """GFLOP/s of a handful of configs of ResNet-50's 1x64x56x56 3x3 layer (the default,
    TopHub's skylake-avx512 one, a few register blocks) beside the GPU template's best of
    50 random configs from docs/BENCHMARKS.md. Timings on a shared machine vary; this
    only prints them. One trial at a time, in this process: PoCL spreads a launch over
    every core."""
    wl = SWEEP[PERF_LAYER]
    tophub = next(rec.config for _, rec in tophub_records()
                  if tuple(rec.workload.args[1][1]) == (64, 64, 3, 3))
    configs = {
        "default": TEMPLATE.default_config(wl),
        "tophub": tophub,
        "oc16 reg8": nchwc_config(wl, tile_ic=16, tile_oc=16, tile_ow=8),
        "oc32 reg8": nchwc_config(wl, tile_ic=16, tile_oc=32, tile_ow=8),
        "oc32 reg7": nchwc_config(wl, tile_ic=16, tile_oc=32, tile_ow=7),
        "oc16 reg14 ic64 kw-rolled wg2": nchwc_config(wl, tile_ic=64, tile_oc=16, tile_ow=14,
                                                     unroll_kw=False, wg=2),
        "oc8 reg8 vec8": nchwc_config(wl, tile_ic=8, tile_oc=8, tile_ow=8, vec=8),
    }
    options = MeasureOptions(number=5, repeat=3, min_repeat_ms=50, timeout_s=90)
    requests = [MeasureRequest(NAME, wl, c, options) for c in configs.values()]
    gpu_wl = Workload(template="conv2d_nchw.cuda", args=[*wl.args[:5], "float32"])
    gpu = get_template("conv2d_nchw.cuda").space(gpu_wl).to_config(dict(
        tile_f=(1, 2, 2, 16), tile_y=(14, 2, 1, 2), tile_x=(2, 1, 28, 1), tile_rc=(4, 16),
        tile_ry=(1, 3), tile_rx=(1, 3), auto_unroll_max_step=1500, unroll_explicit=1))
    requests.append(MeasureRequest("conv2d_nchw.cuda", gpu_wl, gpu, options))
    results = [(req, measure(device, req)) for req in requests]
    flops = TEMPLATE.flops(wl)
    lines = []
    for label, (req, res) in zip([*configs, "GPU template conv2d_nchw.cuda"], results):
        assert res.ok, describe_failures([(req, res)])
        lines.append((flops / min(res.costs) / 1e9, label))
    with capsys.disabled():
        print(f"\n{NAME} on {PERF_LAYER} (PoCL), GFLOP/s: " + ", ".join(
            f"{label} {g:.0f}" for g, label in sorted(lines, reverse=True)))

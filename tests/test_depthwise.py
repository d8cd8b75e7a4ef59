"""``depthwise_conv2d_nchw.cuda``: operator, config space, TopHub records, kernels.

Acceptance:
- the operator (``DepthwiseConv2dOp``) is TVM's depthwise conv2d: output channel o reads
  input channel o // M with filter weight[o // M][o % M], strides, dilation and 4-value
  padding respected; workloads it cannot compute are WorkloadErrors naming the problem;
- random valid configs (fixed seeds, GPU limits) on MobileNet-v1's depthwise layers
  (32ch 112x112 to 1024ch 7x7, strides 1 and 2) match numpy on PoCL through ``measure``;
  fused epilogues (bias, relu, add), a channel multiplier of 2 (and 3, with blocks that
  straddle input channels) and dilation 2 too; their CUDA sources compile with
  ``nvcc -ptx -arch=sm_80``;
- every depthwise_conv2d_nchw.cuda record of TopHub's logs decodes to a config of our
  space, and for cuda/opencl targets our index of it equals the record's for >= 95%;
- a few TopHub configs run correctly on PoCL.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    GPU_LIMITS,
    NVCC_ARGS,
    MeasurePool,
    assert_measured_ok,
    cuda_sources,
    describe_failures,
    draw_valid_configs,
    index_matches,
    needs_nvcc,
    nvcc_batches,
    read_tophub,
    tophub_decode_failures,
)

from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest
from compiler.templates import ConfigError, Epilogue, WorkloadError, get_template
from compiler.templates.depthwise_conv2d import (
    ENTRY,
    DepthwiseConv2dOp,
    _Tiles,
    channels_spanned,
)
from schemas import Config, DeviceLimits, MeasureOptions, Record, Workload

DEPTHWISE = "depthwise_conv2d_nchw.cuda"
TEMPLATE = get_template(DEPTHWISE)
OPTIONS = MeasureOptions(number=1, repeat=1, timeout_s=90)


def depthwise_workload(n: int, c: int, hw: int, multiplier: int = 1, k: int = 3,
                       stride: int = 1, pad: int | list[int] = 1,
                       dilation: int = 1, h: int | None = None) -> Workload:
    """A depthwise conv2d as AutoTVM's task writes it: kernel [C, M, k, k]."""
    pads = [pad] * 4 if isinstance(pad, int) else list(pad)
    return Workload(template=DEPTHWISE, args=[
        ["TENSOR", [n, c, h or hw, hw], "float32"],
        ["TENSOR", [c, multiplier, k, k], "float32"],
        [stride, stride], pads, [dilation, dilation], "float32"])


# MobileNet-v1's depthwise layers at batch 1 (all 3x3, pad 1).
LAYERS: dict[str, Workload] = {
    "mobilenet.dw1.32x112": depthwise_workload(1, 32, 112),
    "mobilenet.dw2.64x112s2": depthwise_workload(1, 64, 112, stride=2),
    "mobilenet.dw5.128x56": depthwise_workload(1, 128, 56),
    "mobilenet.dw6.256x28s2": depthwise_workload(1, 256, 28, stride=2),
    "mobilenet.dw8.512x14": depthwise_workload(1, 512, 14),
    "mobilenet.dw13.1024x7": depthwise_workload(1, 1024, 7),
}
# What no MobileNet layer has: a channel multiplier of 2; dilation 2 (pad 2 keeps the
# size), with batch 2, a non-square input and uneven padding.
ODD: dict[str, Workload] = {
    "multiplier2.32x28": depthwise_workload(1, 32, 28, multiplier=2),
    "multiplier2.s2.16x30": depthwise_workload(1, 16, 30, multiplier=2, stride=2),
    "dilation2.64x28": depthwise_workload(1, 64, 28, pad=2, dilation=2),
    "dilation2.batch2.uneven": depthwise_workload(2, 8, 20, h=17, pad=[1, 3, 2, 0],
                                                  dilation=2),
}
CONFIGS = {**{name: 4 for name in LAYERS}, **{name: 3 for name in ODD}}
EPILOGUES = (Epilogue(("bias", "relu")), Epilogue(("bias", "add", "relu")),
             Epilogue(("relu", "add")))
EPILOGUE_LAYERS = ("mobilenet.dw8.512x14", "multiplier2.32x28")


def _workload(name: str) -> Workload:
    return {**LAYERS, **ODD}[name]


@lru_cache(maxsize=None)
def draw_configs(name: str) -> tuple[Config, ...]:
    """Distinct valid configs (GPU limits) drawn with a seed fixed per layer."""
    return draw_valid_configs(TEMPLATE, _workload(name), name, CONFIGS[name])


# A multiplier of 3 with blocks of 2 output channels: the block at f0 = 4 reads input
# channel 1 only, the one at f0 = 2 channels 0 and 1; the window holds 2 channels, the
# second past C for the last block (read as zero, unused).
STRADDLE = depthwise_workload(1, 2, 9, multiplier=3, stride=2)


def _straddle_configs() -> list[Config]:
    space = TEMPLATE.space(STRADDLE)
    return [space.to_config({"tile_f": f, "tile_y": (1, 1, 5, 1), "tile_x": (1, 1, 1, 5),
                             "auto_unroll_max_step": step, "unroll_explicit": explicit})
            for f, step, explicit in (((3, 1, 2, 1), 0, 0), ((3, 2, 1, 1), 1500, 1),
                                      ((6, 1, 1, 1), 256, 0), ((1, 1, 2, 3), 256, 1))]


# ---- operator and workloads (no device) ----

def _naive(op: DepthwiseConv2dOp, data: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The definition, loop by loop: out[n, o, y, x] = sum over taps of
    padded[n, o // M, y * sh + ky * dh, x * sw + kx * dw] * weight[o // M, o % M, ky, kx]."""
    pt, pl, pb, pr = op.pad
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    out = np.zeros(op.output_shape)
    m = op.multiplier
    for o in range(op.co):
        for ky in range(op.kh):
            for kx in range(op.kw):
                y0, x0 = ky * op.dilation[0], kx * op.dilation[1]
                win = padded[:, o // m, y0:y0 + op.stride[0] * (op.oh - 1) + 1:op.stride[0],
                             x0:x0 + op.stride[1] * (op.ow - 1) + 1:op.stride[1]]
                out[:, o] += win * weight[o // m, o % m, ky, kx]
    return out


@pytest.mark.parametrize("name", ["mobilenet.dw6.256x28s2", *ODD, "straddle"])
def test_reference_is_the_depthwise_definition(name: str) -> None:
    wl = STRADDLE if name == "straddle" else _workload(name)
    op = TEMPLATE.parse(wl)
    rng = np.random.default_rng(3)
    data, weight = (rng.uniform(-1, 1, s).astype(np.float32) for s in op.input_shapes)
    got = TEMPLATE.compute_reference(wl, [data, weight])
    assert got.shape == op.output_shape == TEMPLATE.output_shape(wl)
    np.testing.assert_allclose(got, _naive(op, data, weight), rtol=1e-5, atol=1e-5)
    assert TEMPLATE.flops(wl) == 2 * op.n * op.c * op.multiplier * op.oh * op.ow * op.kh * op.kw


def test_op_shapes() -> None:
    op = TEMPLATE.parse(LAYERS["mobilenet.dw2.64x112s2"])
    assert (op.c, op.multiplier, op.co, op.oh, op.ow) == (64, 1, 64, 56, 56)
    assert op.input_shapes == [(1, 64, 112, 112), (64, 1, 3, 3)]
    op = TEMPLATE.parse(ODD["dilation2.batch2.uneven"])
    # h 17 + 1 + 2 - 5 + 1 = 16, w 20 + 3 + 0 - 5 + 1 = 19
    assert op.output_shape == (2, 8, 16, 19) and op.pad == (1, 3, 2, 0)
    two = depthwise_workload(1, 8, 10, pad=[1, 2])  # 2-value padding: (top, left) twice
    assert TEMPLATE.parse(two).pad == (1, 2, 1, 2)
    assert TEMPLATE.parse(ODD["multiplier2.32x28"]).output_shape == (1, 64, 28, 28)


def _bad(args_edit: dict[int, object]) -> Workload:
    args = list(depthwise_workload(1, 32, 14).args)
    for i, value in args_edit.items():
        args[i] = value
    return Workload(template=DEPTHWISE, args=args)


@pytest.mark.parametrize(("wl", "words"), [
    (_bad({1: ["TENSOR", [16, 1, 3, 3], "float32"]}),
     r"args\[1\] \(kernel\): 16 channels, data has 32.*\[32, M, kh, kw\]"),
    (_bad({0: ["TENSOR", [1, 32, 2, 2], "float32"], 3: [0, 0, 0, 0]}),
     r"output would be 0x0: the dilated kernel 3x3 .* does not fit the padded 2x2 input"),
    (_bad({4: [8, 8]}),
     r"output would be 0x0: the dilated kernel 3x3 \(dilation 8x8\) does not fit the "
     r"padded 16x16 input"),
    (_bad({1: ["TENSOR", [32, 3, 3], "float32"]}), r"args\[1\] \(kernel\): shape must be 4"),
    (_bad({5: "int8"}), r"args\[5\] \(out_dtype\): 'int8' is not supported"),
    (_bad({3: [1, 1, -1, 1]}), r"args\[3\] \(padding\)"),
    (_bad({2: [0, 1]}), r"args\[2\] \(strides\)"),
    (Workload(template=DEPTHWISE, args=list(depthwise_workload(1, 8, 8).args)[:5]),
     r"expected \[data, kernel, strides, padding, dilation, out_dtype\], got 5 items"),
], ids=["kernel_channels", "kernel_larger_than_input", "dilation_too_large", "kernel_3d",
        "int8", "negative_pad", "zero_stride", "five_args"])
def test_bad_workloads_are_refused_with_a_clear_message(wl: Workload, words: str) -> None:
    with pytest.raises(WorkloadError, match=words):
        TEMPLATE.parse(wl)
    with pytest.raises(WorkloadError):
        TEMPLATE.space(wl)


def test_channels_spanned_is_the_most_any_block_reads() -> None:
    for m in range(1, 9):
        for c in range(1, 13):
            for block_f in (d for d in range(1, c * m + 1) if c * m % d == 0):
                most = max((f0 + block_f - 1) // m - f0 // m + 1
                           for f0 in range(0, c * m, block_f))
                assert channels_spanned(block_f, m, c) == most, (m, c, block_f)
    # the vectorised form (limits, features) agrees
    blocks = np.array([1, 2, 3, 6])
    assert list(channels_spanned(blocks, 3, 2)) == [1, 2, 1, 2]


def test_space_is_autotvms() -> None:
    """Knobs in AutoTVM's order: three 4-way spatial splits, then the unroll pragmas."""
    wl = LAYERS["mobilenet.dw13.1024x7"]
    space = TEMPLATE.space(wl)
    assert [k.name for k in space.knobs] == ["tile_f", "tile_y", "tile_x",
                                             "auto_unroll_max_step", "unroll_explicit"]
    rows = {r["name"]: r for r in space.describe()}
    assert (rows["tile_f"]["extent"], rows["tile_y"]["extent"], rows["tile_x"]["extent"]) \
        == (1024, 7, 7)
    assert all(rows[k]["num_outputs"] == 4 for k in ("tile_f", "tile_y", "tile_x"))
    assert rows["auto_unroll_max_step"]["candidates"] == [0, 256, 1500]
    assert rows["unroll_explicit"]["candidates"] == [0, 1]
    # 1024 = 2^10 in 4 ordered factors: C(13, 3) = 286; 7 in 4: 4
    assert len(space) == 286 * 4 * 4 * 3 * 2
    assert TEMPLATE.space(ODD["multiplier2.32x28"]).knobs[0].extent == 64


def test_defaults_features_and_limits() -> None:
    """The fallback fits GPUs; one feature-name list for every workload; the bulk limit
    check agrees with the single one; a block over the limits is refused."""
    names = None
    for wl in [*LAYERS.values(), *ODD.values(), STRADDLE]:
        config = TEMPLATE.default_config(wl)
        assert not TEMPLATE.check_limits(wl, config, GPU_LIMITS), wl
        t = _Tiles(TEMPLATE.parse(wl), TEMPLATE.decode(wl, config))
        assert t.threads <= 64 and t.acc_size == 1
        k = TEMPLATE.codegen(wl, config, "cuda")
        assert k.entry == ENTRY and k.block == (t.tx, t.ty, t.tf)
        if names is None:
            names = TEMPLATE.feature_names(wl)
        assert TEMPLATE.feature_names(wl) == names
        space = TEMPLATE.space(wl)
        idx = np.random.default_rng(0).integers(0, len(space), 300)
        feats = TEMPLATE.feature_matrix(wl, idx)
        assert feats.shape == (300, len(names)) and np.isfinite(feats).all()
        # the single-config features are a row of the matrix
        one = TEMPLATE.features(wl, space.get(int(idx[0])))
        np.testing.assert_allclose(list(one.values()), feats[0], rtol=1e-6)
        mask = TEMPLATE.valid_mask(wl, idx, GPU_LIMITS)
        assert [not TEMPLATE.check_limits(wl, space.get(int(i)), GPU_LIMITS) for i in idx[:40]] \
            == list(mask[:40])
    # some columns vary across configs: the cost model can tell them apart
    wl = LAYERS["mobilenet.dw5.128x56"]
    feats = TEMPLATE.feature_matrix(wl, np.arange(0, len(TEMPLATE.space(wl)), 997))
    assert (feats.std(axis=0) > 0).sum() >= 20
    # a 112x112 block: 114x114 floats of window, 12544 threads
    wl = LAYERS["mobilenet.dw1.32x112"]
    space = TEMPLATE.space(wl)
    big = space.to_config({**space.values_at(0), "tile_y": (1, 1, 112, 1),
                           "tile_x": (1, 1, 112, 1)})
    problems = TEMPLATE.check_limits(wl, big, GPU_LIMITS)
    assert any("12544 threads per block > 1024" in p for p in problems), problems
    assert any(f"{4 * (114 * 114 + 9)} bytes of local memory > 49152" in p
               for p in problems), problems


def test_kernel_source_reads_the_right_input_channel() -> None:
    """M = 1 indexes the window by the output channel; M > 1 divides by M; only a
    window that can run past C (blocks straddling input channels) guards the channel."""
    plain = TEMPLATE.codegen(LAYERS["mobilenet.dw8.512x14"],
                             draw_configs("mobilenet.dw8.512x14")[0]).source
    assert "/ 1 - c0" not in plain and "c0 + c <" not in plain
    two = TEMPLATE.codegen(ODD["multiplier2.32x28"], draw_configs("multiplier2.32x28")[0])
    assert "/ 2 - c0)" in two.source
    straddle = TEMPLATE.codegen(STRADDLE, _straddle_configs()[0]).source
    assert "c0 + c < 2" in straddle
    assert re.search(r"LOCAL float AA\[(\d+)\]", straddle).group(1) == str(2 * 11 * 11)


# ---- TopHub ----

LOGS = {"cuda_v0.10.log": 97, "rocm_v0.05.log": 9, "opencl_v0.04.log": 9}
# opencl_v0.04.log records whose entity's outer factor does not multiply out (their
# index names the outer factor as written with other inner ones): read as AutoTVM's
# SplitEntity.apply runs them, by the inner factors.
OUTER_MISMATCH = {92: ("tile_f", (128, 1, 4, 1)), 96: ("tile_y", (4, 1, 7, 1)),
                  99: ("tile_y", (14, 1, 2, 4))}


@lru_cache(maxsize=1)
def tophub_records() -> tuple[tuple[str, int, Record], ...]:
    return read_tophub(DEPTHWISE, LOGS)


def test_every_tophub_record_maps_to_a_config_of_our_space() -> None:
    records = tophub_records()
    per_log, failures = tophub_decode_failures(TEMPLATE, records)
    assert per_log == LOGS and len(records) >= 115
    assert not failures, f"{len(failures)} records do not map:\n" + "\n".join(failures)


def test_entities_whose_outer_factor_is_off_read_as_autotvm_applies_them() -> None:
    by_line = {n: rec for log, n, rec in tophub_records() if log == "opencl_v0.04.log"}
    for line_no, (knob, want) in OUTER_MISMATCH.items():
        rec = by_line[line_no]
        with pytest.raises(ConfigError, match="not the extent"):
            TEMPLATE.space(rec.workload).decode(rec.config)
        written = tuple(rec.config.knob(knob))
        got = TEMPLATE.decode(rec.workload, rec.config)[knob]
        assert got == want and got[1:] == written[1:] and got[0] != written[0], line_no
    # an entity that is wrong beyond its outer factor is still refused
    rec = by_line[92]
    space = TEMPLATE.space(rec.workload)
    bad = rec.config.model_copy(update={"entity": tuple(
        e.model_copy(update={"value": [64, 1, 3, 1]}) if e.name == "tile_f" else e
        for e in rec.config.entity)})
    with pytest.raises(ConfigError, match="tile_f"):
        TEMPLATE.decode(rec.workload, bad)
    assert len(space) > 0


def _index_matches(rec: Record) -> bool:
    return index_matches(TEMPLATE, rec)


def test_record_index_agrees_with_our_enumeration() -> None:
    """cuda and opencl targets: our index of the decoded entity is the record's for
    >= 95% (the three entities of OUTER_MISMATCH differ from their index by design).
    rocm targets are left out of the bar: AutoTVM defines unroll_explicit as [1] only for
    rocm, so a rocm index may count a radix-1 knob where ours has [0, 1]; they are
    counted and printed (TopHub's rocm records were tuned before that rule: they agree)."""
    records = tophub_records()
    kept = [(log, n, r) for log, n, r in records if r.target.kind in ("cuda", "opencl")]
    mismatched = [f"{log}:{n}" for log, n, r in kept if not _index_matches(r)]
    matched = len(kept) - len(mismatched)
    rocm = [r for _, _, r in records if r.target.kind == "rocm"]
    rocm_matched = sum(_index_matches(r) for r in rocm)
    print(f"\nindex matches: {matched}/{len(kept)} cuda/opencl records, "
          f"{rocm_matched}/{len(rocm)} rocm records (not in the bar); differ: {mismatched}")
    assert len(kept) >= 100
    assert matched >= 0.95 * len(kept), f"only {matched}/{len(kept)} match: {mismatched}"
    assert set(mismatched) <= {f"opencl_v0.04.log:{n}" for n in OUTER_MISMATCH}, mismatched


def _tophub_sample(limits: DeviceLimits) -> list[tuple[str, int, Record]]:
    """Per (log, stride) the cheapest record that fits ``limits``, and the cheapest of
    OUTER_MISMATCH (it runs the reading decode() gives it)."""
    cheapest: dict[tuple[str, int], tuple[int, int, Record]] = {}
    odd: tuple[int, int, Record] | None = None
    for log, n, rec in tophub_records():
        if TEMPLATE.check_limits(rec.workload, rec.config, limits):
            continue
        flops = TEMPLATE.flops(rec.workload)
        key = (log, TEMPLATE.parse(rec.workload).stride[0])
        if key not in cheapest or (flops, n) < cheapest[key][:2]:
            cheapest[key] = (flops, n, rec)
        if log == "opencl_v0.04.log" and n in OUTER_MISMATCH and (odd is None or flops < odd[0]):
            odd = (flops, n, rec)
    picked = [(log, n, rec) for (log, _), (_, n, rec) in sorted(cheapest.items())]
    if odd is not None and ("opencl_v0.04.log", odd[1]) not in {(lg, n) for lg, n, _ in picked}:
        picked.append(("opencl_v0.04.log", odd[1], odd[2]))
    return picked


@pytest.mark.slow
def test_sample_of_tophub_records_is_correct_on_pocl(measure_pool: MeasurePool,
                                                     device: Device) -> None:
    sample = _tophub_sample(device.limits)
    assert len(sample) >= 5 and {log for log, _, _ in sample} == set(LOGS)
    options = MeasureOptions(number=1, repeat=1, timeout_s=120)
    assert_measured_ok(measure_pool, [MeasureRequest(DEPTHWISE, r.workload, r.config, options)
                                      for _, _, r in sample],
                       "TopHub records on PoCL", [f"{log}:{n}" for log, n, _ in sample])


# ---- kernels on PoCL and nvcc ----

def test_sweep_meets_the_acceptance_bar() -> None:
    assert sum(len(draw_configs(name)) for name in LAYERS) >= 20
    assert {TEMPLATE.parse(wl).stride[0] for wl in LAYERS.values()} == {1, 2}
    assert any(TEMPLATE.parse(wl).multiplier == 2 for wl in ODD.values())
    assert any(TEMPLATE.parse(wl).dilation == (2, 2) for wl in ODD.values())
    for name in CONFIGS:
        wl = _workload(name)
        for config in draw_configs(name):
            assert not TEMPLATE.check_limits(wl, config, GPU_LIMITS)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_configs_match_numpy(measure_pool: MeasurePool, name: str) -> None:
    wl = _workload(name)
    configs = draw_configs(name)
    assert_measured_ok(measure_pool, [MeasureRequest(DEPTHWISE, wl, c, OPTIONS) for c in configs],
                       f"configs on {name}")


@pytest.mark.slow
def test_blocks_straddling_input_channels_match_numpy(measure_pool: MeasurePool) -> None:
    results = measure_pool.map([MeasureRequest(DEPTHWISE, STRADDLE, c, OPTIONS)
                                for c in _straddle_configs()])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, describe_failures(failed)


@pytest.mark.slow
def test_fused_epilogues_match_numpy(measure_pool: MeasurePool) -> None:
    """bias/relu/add fused in the store, in the order given (relu-then-add differs from
    add-then-relu); with M = 2 the bias is per output channel (C * M values)."""
    requests = [MeasureRequest(DEPTHWISE, _workload(name), c, OPTIONS, ep)
                for name in EPILOGUE_LAYERS for c in draw_configs(name)[:2] for ep in EPILOGUES]
    assert_measured_ok(measure_pool, requests, "fused trials")


@pytest.mark.slow
@needs_nvcc
def test_cuda_sources_compile_with_nvcc(tmp_path: Path) -> None:
    """One .cu per workload with every config's kernel (entries renamed ``_i``); a failing
    file is recompiled kernel by kernel to name the configs at fault."""
    cases: dict[str, list[tuple[Workload, Config, Epilogue]]] = {
        name: [(_workload(name), c, Epilogue()) for c in draw_configs(name)] for name in CONFIGS}
    for name in EPILOGUE_LAYERS:
        cases[name] += [(_workload(name), c, ep) for c in draw_configs(name)[:2]
                        for ep in EPILOGUES]
    cases["straddle"] = [(STRADDLE, c, Epilogue()) for c in _straddle_configs()]
    problems = nvcc_batches(tmp_path, {name: cuda_sources(TEMPLATE, trials, [ENTRY])
                                       for name, trials in cases.items()}, [ENTRY])
    assert not problems, "nvcc " + " ".join(NVCC_ARGS) + " rejected:\n" + "\n".join(problems)

"""``conv2d_NCHWc.x86``'s loop knobs (issue 17, point 1): ``unroll_ci`` (the ci loop
split, its inner part written out) and ``order_oc`` (output-channel blocks innermost in
the grid), appended after the OpenCL knobs.

Space: the new knobs come last (most significant), so every older config (TopHub's, ours
from before) keeps its ``index`` and decodes to the loops as they were; an unroll that
does not divide ic_bn is rejected (error 1, INSTANTIATION_ERROR). Kernels: the new knob
values on ResNet-50's 1x1, stride-2 1x1 and 3x3 layers equal numpy on PoCL, with blocked
data/output/residual and fused epilogues, and through the measurer in plain NCHW.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import nchwc_config, nchwc_workload, needs_nvcc, nvcc_ptx

from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, max_abs_error_ok, measure
from compiler.templates import ConfigError, Epilogue, IOLayout, get_template
from compiler.templates.base import blocked_shape, from_blocked, to_blocked
from compiler.templates.conv2d_nchwc import LOOP_DEFAULTS
from schemas import Config, DeviceLimits, MeasureErrorNo, MeasureOptions, Workload

NAME = "conv2d_NCHWc.x86"
TEMPLATE = get_template(NAME)
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
CHECK = MeasureOptions(number=1, repeat=1, timeout_s=90)
FULL = Epilogue(("bias", "add", "relu"))

# ResNet-50: a stage-4 1x1, stage 4's stride-2 1x1 projection, stage 5's 1x1 (7 rows: a
# tile_oh = 2 tail), stage 4's padded 3x3 (border copies).
CONV1 = nchwc_workload(1, 1024, 14, 256, 1, 1, 0)
CONV1_S2 = nchwc_workload(1, 512, 28, 1024, 1, 2, 0)
CONV1_ODD = nchwc_workload(1, 2048, 7, 512, 1, 1, 0)
CONV3 = nchwc_workload(1, 256, 14, 256, 3, 1, 1)


# ---- space (no device) ----

def test_loop_knobs_come_after_the_opencl_ones() -> None:
    for wl, fourth in ((CONV3, "unroll_kw"), (CONV1, "tile_oh")):
        space = TEMPLATE.space(wl)
        assert [k.name for k in space.knobs] == ["tile_ic", "tile_oc", "tile_ow", fourth, "vec",
                                                 "wg", "order_oc", "unroll_ci"]
        assert space.knobs[-2].candidates == (0, 1)
        assert space.knobs[-1].candidates == (1, 2, 4, 8, 16)
        # the defaults are the first candidates: an older index is the same point
        assert all(k.candidates[0] == LOOP_DEFAULTS[k.name] for k in space.knobs[-2:])


def without(config: Config, *names: str) -> Config:
    return Config(index=config.index, entity=tuple(e for e in config.entity
                                                   if e.name not in names))


def test_a_config_without_loop_knobs_keeps_its_index_and_old_loops() -> None:
    """A record of ours from before the knobs (vec and wg, no loop knobs) and a TopHub-like
    one (neither): both decode to order_oc 0, unroll_ci 1 at their own index, and the
    kernel is the one of the explicit defaults."""
    for wl in (CONV1, CONV3):
        space = TEMPLATE.space(wl)
        old_radix = math.prod(len(k) for k in space.knobs[:-2])
        full = nchwc_config(wl, tile_ic=16, tile_oc=32, tile_ow=7, vec=8, wg=2)
        assert full.index < old_radix  # the new knobs at their defaults add nothing
        ours = without(full, "order_oc", "unroll_ci")
        assert TEMPLATE.decode(wl, ours) == TEMPLATE.decode(wl, full)
        assert space.index_of(TEMPLATE.decode(wl, ours)) == ours.index == full.index
        assert TEMPLATE.codegen(wl, ours).source == TEMPLATE.codegen(wl, full).source
        tophub_like = without(full, "order_oc", "unroll_ci", "vec", "wg")
        k = TEMPLATE.decode(wl, tophub_like)
        assert (k["vec"], k["wg"], k["order_oc"], k["unroll_ci"]) == (16, 1, 0, 1)
        assert TEMPLATE.autotvm_index(wl, tophub_like) == full.index % math.prod(
            len(k) for k in space.knobs[:4])
    # one of the two loop knobs given: the other is missing, as for any knob
    half = without(nchwc_config(CONV1, tile_ic=16, tile_oc=32, tile_ow=7), "unroll_ci")
    with pytest.raises(ConfigError, match="missing unroll_ci"):
        TEMPLATE.decode(CONV1, half)


def test_an_unroll_that_does_not_divide_ic_bn_is_rejected(device: Device) -> None:
    bad = nchwc_config(CONV3, tile_ic=8, tile_oc=16, tile_ow=7, unroll_ci=16)
    (why,) = TEMPLATE.check_limits(CONV3, bad, CPU_LIMITS)
    assert why == "unroll_ci 16 does not divide the input-channel block 8"
    with pytest.raises(ConfigError, match="unroll_ci 16 does not divide"):
        TEMPLATE.codegen(CONV3, bad)
    space = TEMPLATE.space(CONV3)
    assert not TEMPLATE.valid_mask(CONV3, np.array([bad.index]), CPU_LIMITS)[0]
    assert TEMPLATE.valid_mask(CONV3, np.array([space.index_of(
        {**TEMPLATE.decode(CONV3, bad), "unroll_ci": 8})]), CPU_LIMITS)[0]
    result = measure(device, MeasureRequest(NAME, CONV3, bad, CHECK))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert "unroll_ci 16 does not divide the input-channel block 8" in (result.error_msg or "")


def test_codegen_unrolls_ci_and_puts_channel_blocks_innermost() -> None:
    # 1024 / 32 ic blocks, unrolled by 4: a loop of 8 steps of 4 copies
    four = TEMPLATE.codegen(CONV1, nchwc_config(CONV1, tile_ic=32, tile_oc=16, tile_ow=7,
                                                vec=8, unroll_ci=4))
    assert "for (int cu = 0; cu < 32; cu += 4) {" in four.source
    assert len(re.findall(r"const int ci = cu( \+ \d)?;", four.source)) == 4
    # unroll_ci = ic_bn: no ci loop left
    whole = TEMPLATE.codegen(CONV1, nchwc_config(CONV1, tile_ic=16, tile_oc=16, tile_ow=7,
                                                 vec=8, unroll_ci=16))
    assert "for (int cu" not in whole.source and "for (int ci" not in whole.source
    assert len(re.findall(r"const int ci = cu( \+ \d+)?;", whole.source)) == 16
    # order_oc = 1: 256 / 16 = 16 channel blocks along x, fastest; 14 / 7 = 2 x blocks
    outer = TEMPLATE.codegen(CONV1, nchwc_config(CONV1, tile_ic=32, tile_oc=16, tile_ow=7))
    inner = TEMPLATE.codegen(CONV1, nchwc_config(CONV1, tile_ic=32, tile_oc=16, tile_ow=7,
                                                 order_oc=1))
    assert outer.grid == (2, 14, 16) and inner.grid == (32, 14, 1)
    assert "kb = BLOCK_X % 16" in inner.source and "kb = BLOCK_Z % 16" in outer.source
    # the limits see the same grid as the launch
    usage = TEMPLATE._usage(TEMPLATE.parse(CONV1), TEMPLATE._knobs(CONV1, np.array(
        [TEMPLATE.space(CONV1).index_of(TEMPLATE.decode(CONV1, c)) for c in
         (nchwc_config(CONV1, tile_ic=32, tile_oc=16, tile_ow=7),
          nchwc_config(CONV1, tile_ic=32, tile_oc=16, tile_ow=7, order_oc=1))])))
    assert usage.grid is not None
    assert [tuple(int(g[i]) if np.ndim(g) else int(g) for g in usage.grid)
            for i in range(2)] == [(2, 14, 16), (32, 14, 1)]


def test_features_see_the_loop_knobs() -> None:
    base = dict(tile_ic=32, tile_oc=16, tile_ow=7, vec=8)
    f1 = TEMPLATE.features(CONV1, nchwc_config(CONV1, **base))
    f8 = TEMPLATE.features(CONV1, nchwc_config(CONV1, **base, unroll_ci=8, order_oc=1))
    assert set(f1) == set(f8)
    assert (f1["log_unroll_ci"], f8["log_unroll_ci"]) == (0, 3)
    assert f8["log_unrolled_fmas"] - f1["log_unrolled_fmas"] == pytest.approx(3)
    assert (f1["order_oc"], f8["order_oc"]) == (0, 1)
    assert (f1["log_input_reuse_in_cache"], f8["log_input_reuse_in_cache"]) == (0, 4)


# ---- kernels on PoCL ----

def run_blocked(device: Device, wl: Workload, config: Config, epilogue: Epilogue,
                io: IOLayout) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's output (converted back to NCHW) and numpy's, as the compiler runs it:
    blocked data, packed weight, blocked residual."""
    arrays = TEMPLATE.make_inputs(wl, epilogue, np.random.default_rng(3))
    want = TEMPLATE.reference(wl, arrays, epilogue)
    kernel = TEMPLATE.codegen(wl, config, device.dialect, epilogue, io)
    inputs = [to_blocked(arrays[0], io.data_block), TEMPLATE.pack_weight(wl, config, arrays[1]),
              *arrays[2:]]
    if "add" in epilogue.ops:
        inputs[-1] = to_blocked(inputs[-1], io.residual_block)
    out_shape = kernel.buffers[-1].shape
    assert out_shape == blocked_shape(want.shape, io.out_block)
    program = device.build(kernel)
    buffers = [device.upload(np.ascontiguousarray(a)) for a in inputs]
    out = device.alloc(out_shape)
    device.run(program, kernel, [*buffers, out])
    return from_blocked(device.download(out, out_shape), io.out_block), want


def blocked_cases() -> list[tuple[str, Workload, Config, Epilogue, IOLayout]]:
    """Each unroll and both orders, on the vector store (output block = oc_bn, epilogue on
    vectors) and the lane-wise one (another block, a residual blocked differently), with
    tile_oh tails, border copies, spare work-items of a last group and scalar lanes."""
    c1, s2, odd, c3 = CONV1, CONV1_S2, CONV1_ODD, CONV3
    return [
        ("1x1 u4 inner", c1, nchwc_config(c1, tile_ic=32, tile_oc=16, tile_ow=7, vec=8,
                                          unroll_ci=4, order_oc=1),
         FULL, IOLayout(16, 16, 16)),
        ("1x1 u16 rows2", c1, nchwc_config(c1, tile_ic=16, tile_oc=32, tile_ow=2, vec=16,
                                           tile_oh=2, unroll_ci=16),
         Epilogue(("bias", "relu")), IOLayout(8, 32, 0)),
        ("1x1 s2 u8 inner", s2, nchwc_config(s2, tile_ic=64, tile_oc=16, tile_ow=7, vec=8,
                                             unroll_ci=8, order_oc=1),
         FULL, IOLayout(16, 8, 4)),
        ("1x1 s2 u2 inner wg4", s2, nchwc_config(s2, tile_ic=8, tile_oc=32, tile_ow=2, vec=8,
                                                 wg=4, unroll_ci=2, order_oc=1),
         Epilogue(("relu", "add")), IOLayout(0, 32, 32)),
        ("1x1 tail u8 inner", odd, nchwc_config(odd, tile_ic=64, tile_oc=16, tile_ow=7, vec=4,
                                                tile_oh=2, unroll_ci=8, order_oc=1),
         FULL, IOLayout(16, 16, 0)),
        ("3x3 u4 inner", c3, nchwc_config(c3, tile_ic=16, tile_oc=16, tile_ow=7, vec=8,
                                          unroll_ci=4, order_oc=1),
         FULL, IOLayout(16, 16, 16)),
        ("3x3 u8 kw rolled", c3, nchwc_config(c3, tile_ic=8, tile_oc=8, tile_ow=2, vec=8,
                                              unroll_kw=False, unroll_ci=8),
         FULL, IOLayout(4, 16, 8)),
        ("3x3 u2 inner wg8 vec1", c3, nchwc_config(c3, tile_ic=4, tile_oc=4, tile_ow=1,
                                                   vec=1, wg=8, unroll_ci=2, order_oc=1),
         Epilogue(("bias", "relu")), IOLayout(0, 4, 0)),
    ]


@pytest.mark.parametrize("case", blocked_cases(), ids=lambda c: c[0])
def test_loop_knobs_match_numpy_with_blocked_io_and_epilogues(
        device: Device, case: tuple[str, Workload, Config, Epilogue, IOLayout]) -> None:
    _, wl, config, epilogue, io = case
    assert not TEMPLATE.check_limits(wl, config, CPU_LIMITS)
    got, want = run_blocked(device, wl, config, epilogue, io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, why


def test_loop_knobs_match_numpy_through_the_measurer(device: Device) -> None:
    """Plain NCHW (what a trial measures), each unroll on each layer kind, both orders."""
    failed = []
    for wl, ic_bn, oc_bn, reg_n in ((CONV1, 16, 16, 7), (CONV1_S2, 16, 32, 2),
                                    (CONV3, 16, 16, 7)):
        for unroll, order in ((2, 1), (4, 0), (8, 1), (16, 0)):
            config = nchwc_config(wl, tile_ic=ic_bn, tile_oc=oc_bn, tile_ow=reg_n, vec=8,
                                  unroll_ci=unroll, order_oc=order)
            result = measure(device, MeasureRequest(NAME, wl, config, CHECK))
            if result.error_no != MeasureErrorNo.NO_ERROR:
                failed.append(f"{TEMPLATE.decode(wl, config)}: {result.error_msg}")
    assert not failed, "\n".join(failed)


@pytest.mark.slow
@needs_nvcc
def test_loop_knob_kernels_compile_as_cuda(tmp_path: Path) -> None:
    """The same bodies through the CUDA prelude (an unrolled ci loop, channel blocks
    innermost with spare work-items, scalar lanes): one .cu file, entries renamed."""
    picked = [c for c in blocked_cases()
              if c[0] in ("1x1 u4 inner", "1x1 s2 u2 inner wg4", "3x3 u2 inner wg8 vec1")]
    assert len(picked) == 3
    sources = []
    for i, (_, wl, config, epilogue, io) in enumerate(picked):
        k = TEMPLATE.codegen(wl, config, "cuda", epilogue, io)
        sources.append(k.source.replace(k.entry, f"{k.entry}_{i}"))
    path = tmp_path / "loop_knobs.cu"
    path.write_text(sources[0] + "\n".join(s[s.index("KERNEL void"):] for s in sources[1:]))
    proc = nvcc_ptx(path)
    assert proc.returncode == 0, proc.stderr[:3000]
    entries = re.findall(r"\.entry\s+(conv2d_nchwc_kernel_\d+)",
                         path.with_suffix(".ptx").read_text())
    assert len(set(entries)) == len(sources)

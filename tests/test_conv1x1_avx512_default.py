"""``conv2d_NCHWc_1x1.x86``'s default config by the device's SIMD lanes (issue 17): a
16-lane (AVX-512) device gets ``avx512_knobs`` (16 accumulator vectors of 16 lanes), an
8-lane one or an unknown one (no limits, ``simd_lanes`` 0) exactly the AVX2 tile of
before. No device: the knob values and the limits check. On the OpenCL device: the
16-lane default's output equals numpy (the measurer's tolerance).
"""

from __future__ import annotations

import pytest
from conftest import run_blocked

from compiler.runtime.device import Device
from compiler.runtime.measure import max_abs_error_ok
from compiler.tasks import CONV1X1_CPU
from compiler.templates import Epilogue, IOLayout, get_template
from schemas import DeviceLimits, MeasureOptions, Workload

TEMPLATE = get_template(CONV1X1_CPU)
CHECK = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)  # rtol 1e-4, atol 1e-4 x max


def limits(lanes: int) -> DeviceLimits:
    """PoCL's limits on a CPU (256 accumulators a work-item) with ``lanes`` float lanes."""
    return DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                        max_thread_z=4096, max_local_elements=256, simd_lanes=lanes)


def workload(c: int, hw: int, k: int, stride: int = 1) -> Workload:
    return Workload(template=CONV1X1_CPU, args=[
        ["TENSOR", [1, c, hw, hw], "float32"], ["TENSOR", [k, c, 1, 1], "float32"],
        [stride, stride], [0, 0, 0, 0], [1, 1], "NCHW", "NCHW", "float32"])


def knobs(wl: Workload, lanes: int | None) -> dict[str, object]:
    cfg = TEMPLATE.default_config(wl, None if lanes is None else limits(lanes))
    return TEMPLATE.decode(wl, cfg)


# the AVX2 default before the lanes were known, written out
AVX2 = {"tile_oc": (8, 16), "tile_p": 6, "vec": 8, "unroll_ci": 2, "wg": 1, "order_oc": 0}


@pytest.mark.parametrize("lanes", [None, 0, 8])
def test_eight_lanes_or_unknown_keep_the_avx2_default(lanes: int | None) -> None:
    assert knobs(workload(256, 56, 128), lanes) == AVX2


@pytest.mark.parametrize("c, hw, k, stride, oc_bn, tile_p, unroll_ci", [
    (256, 56, 128, 1, 64, 4, 4),    # 64 divides K: 4 pixels x 4 vectors
    (1024, 14, 2048, 2, 64, 4, 4),  # strided
    (64, 7, 96, 1, 32, 8, 4),       # 32 is the largest block dividing K: 8 pixels x 2
    (64, 7, 48, 1, 16, 16, 4),      # 16: 16 pixels x 1
    (64, 2, 48, 1, 16, 4, 4),       # at most the image's 4 pixels
    (6, 7, 64, 1, 64, 4, 2),        # the most of 4, 2, 1 dividing C
])
def test_sixteen_lanes_take_sixteen_accumulator_vectors_within_the_limits(
        c: int, hw: int, k: int, stride: int, oc_bn: int, tile_p: int,
        unroll_ci: int) -> None:
    wl = workload(c, hw, k, stride)
    got = knobs(wl, 16)
    assert got == {**knobs(wl, 8), "tile_oc": (k // oc_bn, oc_bn), "tile_p": tile_p,
                   "vec": 16, "unroll_ci": unroll_ci}
    assert got != knobs(wl, 8)
    assert TEMPLATE.check_limits(wl, TEMPLATE.default_config(wl, limits(16)),
                                 limits(16)) == []


def test_sixteen_lanes_keep_the_avx2_default_where_16_does_not_divide_k() -> None:
    wl = workload(9, 8, 24)
    assert knobs(wl, 16) == knobs(wl, 8) == knobs(wl, None)


@pytest.mark.parametrize("wl", [workload(32, 9, 128), workload(48, 10, 64, stride=2)])
def test_sixteen_lane_default_matches_numpy(device: Device, wl: Workload) -> None:
    """Blocked data and output (as a build chains it), a partial last pixel block (81 and
    25 pixels in blocks of 4) and, strided, one pointer per pixel."""
    cfg = TEMPLATE.default_config(wl, limits(16))
    io = IOLayout(16, TEMPLATE.out_block(wl, cfg))
    got, want = run_blocked(device, TEMPLATE, wl, cfg, Epilogue(("bias", "relu")), io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, why

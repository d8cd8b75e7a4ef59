"""``conv2d_NCHWc_winograd.x86``'s default config on a 16-lane (AVX-512) device (issue 17).

No device: on every Winograd layer of ResNet-50, VGG-19 and DenseNet-121 (and a few odd
shapes) the 16-lane default passes the template's checks against a 16-lane device's
limits; it differs from the 8-lane default where the rule says (wider blocks, 16-lane
vectors, F(2x2) on layers of few F(4x4) tiles); an 8-lane device, a device that does not
say its lanes and no limits at all keep the config the template had before. On the
OpenCL device: the 16-lane default's kernel equals numpy, at both tile sizes (data in
NCHW[16]c, output in NCHW[oc_bn]c, bias and relu fused).
"""

from __future__ import annotations

import pytest
from conftest import run_blocked

from compiler.runtime.device import Device
from compiler.runtime.measure import max_abs_error_ok
from compiler.tasks import WINOGRAD_CPU
from compiler.templates import Epilogue, IOLayout, get_template
from schemas import DeviceLimits, MeasureOptions, Workload

TEMPLATE = get_template(WINOGRAD_CPU)
CPU_LIMITS = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096,
                          max_thread_z=4096, max_local_elements=256)
AVX512 = CPU_LIMITS.model_copy(update={"simd_lanes": 16})
AVX2 = CPU_LIMITS.model_copy(update={"simd_lanes": 8})
CHECK = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)


def workload(c: int, h: int, k: int, n: int = 1) -> Workload:
    return Workload(template=WINOGRAD_CPU, args=[
        ["TENSOR", [n, c, h, h], "float32"], ["TENSOR", [k, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])


# (C, H, K): the Winograd layers of ResNet-50, VGG-19 and DenseNet-121, then odd shapes
# (K without a factor 16, fewer tiles than a register block, a batch)
LAYERS = [(64, 56, 64), (128, 28, 128), (256, 14, 256), (512, 7, 512),
          (64, 224, 64), (64, 112, 128), (128, 112, 128), (128, 56, 256), (256, 56, 256),
          (256, 28, 512), (512, 28, 512), (512, 14, 512),
          (128, 56, 32), (128, 28, 32), (128, 14, 32), (128, 7, 32),
          (24, 9, 12), (16, 3, 48), (16, 5, 96), (40, 4, 20)]


def knobs(wl: Workload, limits: DeviceLimits | None) -> dict[str, object]:
    """The default's knobs but ``wide_tile``, which no default takes (F(6x6) pays on
    large images only: a tuning chooses it)."""
    values = TEMPLATE.decode(wl, TEMPLATE.default_config(wl, limits))
    assert values.pop("wide_tile") is False
    return values


@pytest.mark.parametrize("layer", LAYERS)
def test_16_lane_default_fits_a_16_lane_device(layer: tuple[int, int, int]) -> None:
    wl = workload(*layer)
    assert TEMPLATE.check_limits(wl, TEMPLATE.default_config(wl, AVX512), AVX512) == []


def test_16_lane_default_differs_where_the_rule_says() -> None:
    # F(4x4), oc_bn 64 (4 zmm of weights), 4 tiles per register block, 16 lanes
    assert knobs(workload(64, 56, 64), AVX512) == {
        "tile_size": 4, "tile_oc": (1, 64), "tile_p": 4, "vec": 16, "wg": 1}
    assert knobs(workload(128, 56, 32), AVX512) == {
        "tile_size": 4, "tile_oc": (1, 32), "tile_p": 4, "vec": 16, "wg": 1}
    # at most 16 F(4x4) tiles and C * K >= 128 * 128: F(2x2)
    assert knobs(workload(256, 14, 256), AVX512) == {
        "tile_size": 2, "tile_oc": (4, 64), "tile_p": 4, "vec": 16, "wg": 1}
    assert knobs(workload(512, 7, 512), AVX512)["tile_size"] == 2
    assert knobs(workload(128, 8, 128), AVX512)["tile_size"] == 2
    # more tiles (28x28: 49), or weights that stay in cache (DenseNet's 128->32): F(4x4)
    assert knobs(workload(512, 28, 512), AVX512)["tile_size"] == 4
    assert knobs(workload(128, 14, 32), AVX512)["tile_size"] == 4
    # fewer tiles than a register block: all of them; K without a factor 64
    assert knobs(workload(16, 3, 48), AVX512) == {
        "tile_size": 4, "tile_oc": (1, 48), "tile_p": 1, "vec": 16, "wg": 1}
    assert knobs(workload(24, 9, 12), AVX512)["vec"] == 4
    for layer in LAYERS[:16]:
        wl = workload(*layer)
        assert knobs(wl, AVX512) != knobs(wl, AVX2), layer


def test_8_lane_unknown_and_no_limits_keep_the_config_of_before() -> None:
    wl = workload(64, 56, 64)
    before = {"tile_size": 4, "tile_oc": (4, 16), "tile_p": 4, "vec": 8, "wg": 1}
    for limits in (None, CPU_LIMITS, AVX2):
        assert knobs(wl, limits) == before, limits
    small = workload(8, 3, 12)
    assert knobs(small, AVX2) == {"tile_size": 4, "tile_oc": (1, 12), "tile_p": 1, "vec": 4,
                                  "wg": 1}
    for layer in LAYERS:
        assert knobs(workload(*layer), AVX2) == knobs(workload(*layer), None), layer


@pytest.mark.parametrize("layer", [(16, 12, 64), (32, 7, 32), (128, 8, 128)])
def test_16_lane_default_kernel_matches_numpy(device: Device,
                                              layer: tuple[int, int, int]) -> None:
    wl = workload(*layer)
    cfg = TEMPLATE.default_config(wl, AVX512)
    io = IOLayout(16, TEMPLATE.out_block(wl, cfg))  # as a build chains CPU convs
    got, want = run_blocked(device, TEMPLATE, wl, cfg, Epilogue(("bias", "relu")), io)
    ok, why = max_abs_error_ok(got, want, CHECK)
    assert ok, f"{TEMPLATE.decode(wl, cfg)}: {why}"

"""Vectorised cost-model features and device-limit checks of every template.

``feature_matrix`` / ``valid_mask`` serve the cost model and the explorer in bulk;
``features`` / ``check_limits`` serve single configs. Both are one definition per
template, so these tests pin the bulk and the single forms to each other, keep the
column names the same across workloads (one model is trained across them), and check
that the columns carry information. No device needed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from compiler.templates import Template, get_template
from schemas import DeviceLimits, Workload
from conftest import (
    CONV,
    CONV_CPU,
    DENSE_LARGE,
    DENSE_SMALL,
    conv_workload,
    dense_workload,
    nchwc_workload,
)

PACK = "dense_pack.x86"
WINOGRAD_CPU = "conv2d_NCHWc_winograd.x86"
CONV1X1_CPU = "conv2d_NCHWc_1x1.x86"
GEMM_CPU = "conv2d_NCHWc_gemm.x86"

# ResNet-50 / VGG-16 layers; per template at least two whose args differ in shape (a 1x1
# and a 3x3 conv, a dense with and without bias, a 3-arg dense log entry).
WORKLOADS: dict[str, list[Workload]] = {
    CONV: [
        conv_workload(1, 64, 56, 64, 3, 1, 1),      # resnet50 res2 3x3
        conv_workload(1, 3, 224, 64, 7, 2, 3),      # resnet50 stem 7x7/2
        conv_workload(1, 256, 56, 128, 1, 2, 0),    # resnet50 res3 1x1/2 downsample
        conv_workload(1, 512, 14, 512, 3, 1, 1),    # vgg16 conv5
    ],
    CONV_CPU: [
        nchwc_workload(1, 64, 56, 64, 3, 1, 1),
        nchwc_workload(1, 2048, 7, 512, 1, 1, 0),   # 1x1: tile_oh instead of unroll_kw
        nchwc_workload(1, 3, 224, 64, 7, 2, 3),
        nchwc_workload(1, 64, 1, 64, 1, 1, 0),      # one output row: tile_oh is (1,)
    ],
    DENSE_SMALL: [
        dense_workload(DENSE_SMALL, 1, 2048, 1000),
        dense_workload(DENSE_SMALL, 4, 25088, 4096, bias=True),  # vgg16 fc6
        Workload(template=DENSE_SMALL, args=[["TENSOR", [16, 4096], "float32"],
                                             ["TENSOR", [4096, 4096], "float32"], "float32"]),
    ],
    DENSE_LARGE: [
        dense_workload(DENSE_LARGE, 32, 2048, 1000),
        dense_workload(DENSE_LARGE, 64, 4096, 4096, bias=True),
    ],
    PACK: [
        dense_workload(PACK, 1, 2048, 1000),
        dense_workload(PACK, 32, 25088, 4096, bias=True),
    ],
    WINOGRAD_CPU: [
        Workload(template=WINOGRAD_CPU, args=nchwc_workload(1, 64, 56, 64, 3, 1, 1).args),
        Workload(template=WINOGRAD_CPU, args=nchwc_workload(1, 512, 7, 512, 3, 1, 1).args),
    ],
    CONV1X1_CPU: [
        Workload(template=CONV1X1_CPU, args=nchwc_workload(1, 2048, 7, 512, 1, 1, 0).args),
        Workload(template=CONV1X1_CPU, args=nchwc_workload(1, 256, 56, 512, 1, 2, 0).args),
    ],
    GEMM_CPU: [
        Workload(template=GEMM_CPU, args=nchwc_workload(1, 512, 14, 512, 3, 2, 1).args),
        Workload(template=GEMM_CPU, args=nchwc_workload(1, 3, 224, 64, 7, 2, 3).args),
    ],
}
TEMPLATES = list(WORKLOADS)

# Tight enough that every template has configs on both sides of some limit.
TIGHT = DeviceLimits(max_threads_per_block=128, max_thread_x=64, max_thread_y=64,
                     max_thread_z=16, max_shared_memory_per_block=8192,
                     max_local_elements=128)


def _indices(template: Template, wl: Workload, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, len(template.space(wl)), n)


@pytest.mark.parametrize("name", TEMPLATES)
def test_matrix_rows_are_the_features_of_the_same_configs(name: str) -> None:
    template = get_template(name)
    for seed, wl in enumerate(WORKLOADS[name]):
        space = template.space(wl)
        indices = _indices(template, wl, 25, seed)
        matrix = template.feature_matrix(wl, indices)
        names = template.feature_names(wl)
        assert matrix.dtype == np.float32 and matrix.shape == (len(indices), len(names))
        assert len(set(names)) == len(names)
        for row, index in zip(matrix, indices):
            feats = template.features(wl, space.get(int(index)))
            assert list(feats) == names
            np.testing.assert_array_equal(np.array(list(feats.values()), np.float32), row)


@pytest.mark.parametrize("name", TEMPLATES)
def test_features_follow_the_entity_not_a_stale_index(name: str) -> None:
    """Legacy TopHub logs may carry an index that disagrees with their entity."""
    template = get_template(name)
    wl = WORKLOADS[name][0]
    space = template.space(wl)
    a, b = (int(i) for i in _indices(template, wl, 2, 7))
    stale = space.get(a).model_copy(update={"index": b})
    row = template.feature_matrix(wl, np.array([a]))[0]
    np.testing.assert_array_equal(np.array(list(template.features(wl, stale).values()),
                                           np.float32), row)


@pytest.mark.parametrize("name", TEMPLATES)
def test_feature_names_are_the_same_for_every_workload(name: str) -> None:
    template = get_template(name)
    first, *others = WORKLOADS[name]
    names = template.feature_names(first)
    assert any(n.startswith("wl.") for n in names) and "wl.log_flops" in names
    for wl in others:
        assert template.feature_names(wl) == names, wl.args
    # the workload columns tell the workloads apart
    wl_cols = [j for j, n in enumerate(names) if n.startswith("wl.")]
    rows = [template.feature_matrix(wl, np.zeros(1, np.int64))[0, wl_cols]
            for wl in WORKLOADS[name]]
    assert len({tuple(r) for r in rows}) == len(rows)


@pytest.mark.parametrize("name", TEMPLATES)
def test_features_are_finite_and_vary_between_configs(name: str) -> None:
    template = get_template(name)
    for seed, wl in enumerate(WORKLOADS[name]):
        names = template.feature_names(wl)
        matrix = template.feature_matrix(wl, _indices(template, wl, 500, seed))
        assert np.isfinite(matrix).all(), [n for n, ok in zip(names, np.isfinite(matrix).all(0))
                                           if not ok]
        config_cols = [j for j, n in enumerate(names) if not n.startswith("wl.")]
        sample = matrix[:200, config_cols]
        varying = (sample.max(0) > sample.min(0)).sum()
        assert varying >= len(config_cols) / 2, (wl.args, varying, len(config_cols))
        # workload columns are constant within a workload
        wl_cols = [j for j, n in enumerate(names) if n.startswith("wl.")]
        assert (matrix[:, wl_cols] == matrix[0, wl_cols]).all()


@pytest.mark.parametrize("name", TEMPLATES)
def test_valid_mask_agrees_with_check_limits(name: str) -> None:
    template = get_template(name)
    for seed, wl in enumerate(WORKLOADS[name]):
        space = template.space(wl)
        indices = _indices(template, wl, 500, 100 + seed)
        mask = template.valid_mask(wl, indices, TIGHT)
        assert mask.dtype == bool and mask.shape == indices.shape
        expected = [template.check_limits(wl, space.get(int(i)), TIGHT) == [] for i in indices]
        np.testing.assert_array_equal(mask, expected)
        if len(space) >= 10:
            assert mask.any() and not mask.all(), (wl.args, mask.mean())
    # over all of the template's workloads, both outcomes occur
    outcomes = {bool(v) for wl in WORKLOADS[name]
                for v in template.valid_mask(wl, _indices(template, wl, 500, 1), TIGHT)}
    assert outcomes == {True, False}


def test_limit_messages_name_the_resource_once_per_axis() -> None:
    """One rule set for every template: GPU templates speak of threads per block,
    CPU-class ones of work-items per group, each axis on its own."""
    small = get_template(DENSE_SMALL)
    wl = WORKLOADS[DENSE_SMALL][0]
    config = small.space(wl).to_config({"tile_k": (32, 64)})
    limits = DeviceLimits(max_threads_per_block=32, max_thread_x=16,
                          max_shared_memory_per_block=64)
    assert small.check_limits(wl, config, limits) == [
        "64 threads per block > 32", "64 threads in x > 16", "256 bytes of local memory > 64"]
    pack = get_template(PACK)
    wl = WORKLOADS[PACK][1]
    config = pack.space(wl).to_config({"tile_y": (1, 1, 32), "tile_x": (1, 128, 32),
                                       "tile_k": (25088, 1)})
    assert pack.check_limits(wl, config, TIGHT) == [
        "128 work-items in x > 64", "1024 accumulators per work-item > 128"]
    indices = np.array([pack.space(wl).index_of(pack.decode(wl, config))])
    assert not pack.valid_mask(wl, indices, TIGHT)[0]


def test_check_limits_reports_a_config_outside_the_space() -> None:
    template = get_template(CONV)
    wl = WORKLOADS[CONV][0]
    config = template.space(wl).get(0)
    entity = tuple(e.model_copy(update={"value": [-1, 5, 1, 1]}) if e.name == "tile_f" else e
                   for e in config.entity)
    (why,) = template.check_limits(wl, config.model_copy(update={"entity": entity}), TIGHT)
    assert "tile_f" in why


@pytest.mark.parametrize("name", [CONV, CONV_CPU])
def test_feature_matrix_of_100k_configs_is_bulk_fast(name: str) -> None:
    """The cost model featurises 100,000 candidates per round: the bulk path must stay
    far ahead of a per-config loop (~0.75 ms a config, over a minute for 100,000). Both
    are timed side by side, so a busy machine slows both and the ratio holds."""
    template = get_template(name)
    wl = WORKLOADS[name][0]
    space = template.space(wl)
    indices = _indices(template, wl, 100_000, 0)
    template.feature_matrix(wl, indices[:10])
    start = time.perf_counter()
    matrix = template.feature_matrix(wl, indices)
    mask = template.valid_mask(wl, indices, TIGHT)
    bulk = (time.perf_counter() - start) / len(indices)
    assert matrix.shape[0] == mask.shape[0] == 100_000
    start = time.perf_counter()
    for index in indices[:200]:
        config = space.get(int(index))
        template.features(wl, config)
        template.check_limits(wl, config, TIGHT)
    one_by_one = (time.perf_counter() - start) / 200
    assert one_by_one > 50 * bulk, (one_by_one, bulk)

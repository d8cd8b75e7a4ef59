"""The random tuner: every config it proposes is new, valid and within the batch size."""

from __future__ import annotations

from compiler.templates import get_template
from schemas import DeviceLimits, Workload
from tuner_server.search import make_tuner

CONV = Workload(template="conv2d_nchw.cuda", args=[
    ["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
    [1, 1], [1, 1, 1, 1], [1, 1], "float32"])
DENSE = Workload(template="dense_small_batch.gpu", args=[
    ["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"], None, "float32"])


def test_random_never_repeats_and_exhausts_a_small_space() -> None:
    template = get_template(DENSE.template)
    tuner = make_tuner("random", template=template, workload=DENSE, seed=3)
    seen: set[int] = set()
    while batch := tuner.next_batch(4, seen):
        assert len(batch) <= 4
        indices = {c.index for c in batch}
        assert len(indices) == len(batch) and not indices & seen
        seen |= indices
    assert seen == set(range(len(template.space(DENSE))))


def test_random_proposes_only_configs_within_the_limits() -> None:
    template = get_template(CONV.template)
    limits = DeviceLimits(max_threads_per_block=256, max_shared_memory_per_block=16 * 1024,
                          max_local_elements=32)
    tuner = make_tuner("random", template=template, workload=CONV, limits=limits, seed=5)
    batch = tuner.next_batch(64, set())
    assert len(batch) == 64 and len({c.index for c in batch}) == 64
    assert all(not template.check_limits(CONV, c, limits) for c in batch)


def test_unknown_tuner_is_named() -> None:
    try:
        make_tuner("xgb", template=get_template(DENSE.template), workload=DENSE)
    except ValueError as err:
        assert "xgb" in str(err) and "random" in str(err)
    else:
        raise AssertionError("an unknown tuner was accepted")

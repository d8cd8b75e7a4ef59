"""Tuners: every config proposed is new, valid and within the batch size; the cost
model and its explorer find good configs; transfer warm-starts a task."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from compiler.templates import get_template
from schemas import Config, DeviceLimits, MeasureErrorNo, MeasureResult, Workload
from tuner_server.search import DEFAULT_TUNER, TUNERS, Measured, Visited, make_tuner
from tuner_server.search.base import perf_of
from tuner_server.search.cost_model import LABELS, MAX_GROUP, CostModel, relevance
from tuner_server.search.lgbm import LGBMTuner, diverse_pick
from tuner_server.search.sa import PoolWalk, SimulatedAnnealing, SpaceWalk
from tuner_server.search.transfer import GlobalModels, fit_global


def conv(c: int, h: int) -> Workload:
    return Workload(template="conv2d_nchw.cuda", args=[
        ["TENSOR", [1, c, h, h], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "float32"])


CONV = conv(64, 56)
DENSE = Workload(template="dense_small_batch.gpu", args=[
    ["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"], None, "float32"])
TIGHT = DeviceLimits(max_threads_per_block=256, max_shared_memory_per_block=16 * 1024,
                     max_local_elements=32)


def synthetic(workload: Workload) -> Callable[[int], float]:
    """A made-up throughput, smooth in the knob positions: each knob has a best relative
    position; a quarter of the knob combinations fail (throughput 0)."""
    space = get_template(workload.template).space(workload)
    radices = space.radices

    def perf(index: int) -> float:
        pos = space.positions(np.array([index]))[0] / np.maximum(radices - 1, 1)
        if (pos[0] > 0.9) and (pos[-1] > 0.5):
            return 0.0
        return float(np.exp(-4 * np.sum((pos - np.linspace(0.2, 0.8, len(pos))) ** 2)))
    return perf


def result(p: float) -> MeasureResult:
    if p <= 0:
        return MeasureResult.failure(MeasureErrorNo.WRONG_ANSWER, "synthetic failure")
    return MeasureResult(costs=(1.0 / p,), error_no=MeasureErrorNo.NO_ERROR)


def drive(name: str, workload: Workload, trials: int, batch: int, seed: int = 0,
          limits: DeviceLimits | None = None, pool: np.ndarray | None = None,
          goal: float | None = None, **kwargs: object) -> list[Config]:
    """Runs a tuner as the scheduler does (one tuner object per task, what was planned and
    measured appended to) and checks the interface's promises on every batch."""
    template = get_template(workload.template)
    space = template.space(workload)
    perf = synthetic(workload)
    visited = Visited()
    measured = Measured()
    proposed: list[Config] = []
    tuner = make_tuner(name, template=template, workload=workload, limits=limits, seed=seed,
                       pool=pool, **kwargs)
    while len(proposed) < trials:
        got = tuner.propose(min(batch, trials - len(proposed)), visited, measured)
        if not len(got):
            break
        assert got.dtype == np.int64 and len(got) <= batch
        indices = got.tolist()
        assert len(set(indices)) == len(indices), f"{name} proposed a config twice in a batch"
        assert not visited.contains(got).any(), f"{name} proposed a visited config again"
        configs = [space.get(i) for i in indices]
        if limits is not None:
            assert all(not template.check_limits(workload, c, limits) for c in configs), (
                f"{name} proposed a config over the limits")
        if pool is not None:
            assert set(indices) <= set(pool.tolist())
        visited.add(got)
        measured.add(got, [perf_of(result(perf(i))) for i in indices])
        proposed += configs
        if goal is not None and measured.perf.max() >= goal:
            break
    return proposed


@pytest.mark.parametrize("name", sorted(TUNERS))
def test_tuner_exhausts_a_small_space_without_repeats(name: str) -> None:
    size = len(get_template(DENSE.template).space(DENSE))
    got = drive(name, DENSE, trials=size + 10, batch=4, seed=3)
    assert sorted(c.index for c in got) == list(range(size))


@pytest.mark.parametrize("name", sorted(TUNERS))
def test_tuner_proposes_only_new_configs_within_the_limits_and_the_budget(name: str) -> None:
    got = drive(name, CONV, trials=40, batch=16, seed=5, limits=TIGHT)
    assert len(got) == 40


@pytest.mark.parametrize("name", sorted(TUNERS))
def test_tuner_stays_in_its_pool(name: str) -> None:
    rng = np.random.default_rng(1)
    pool = rng.choice(len(get_template(CONV.template).space(CONV)), size=120, replace=False)
    got = drive(name, CONV, trials=200, batch=8, pool=pool)
    assert sorted(c.index for c in got) == sorted(pool.tolist())


def test_unknown_tuner_is_named() -> None:
    with pytest.raises(ValueError, match="xgb") as err:
        make_tuner("xgb", template=get_template(DENSE.template), workload=DENSE)
    assert "lgbm" in str(err.value) and "random" in str(err.value)


def test_lgbm_is_the_default() -> None:
    assert DEFAULT_TUNER == "lgbm"


def trials_to_best(name: str, pool: np.ndarray, seed: int, **kwargs: object) -> int:
    perf = synthetic(CONV)
    goal = 0.95 * max(perf(int(i)) for i in pool)
    got = drive(name, CONV, trials=len(pool), batch=8, seed=seed, pool=pool, goal=goal,
                **kwargs)
    for t, c in enumerate(got, 1):
        if perf(c.index) >= goal:
            return t
    raise AssertionError(f"{name} never reached 95% of the pool's best")


def test_lgbm_needs_far_fewer_trials_than_random() -> None:
    rng = np.random.default_rng(7)
    pool = rng.choice(len(get_template(CONV.template).space(CONV)), size=600, replace=False)
    lgbm = [trials_to_best("lgbm", pool, s) for s in range(3)]
    rand = [trials_to_best("random", pool, s) for s in range(3)]
    assert np.mean(lgbm) < 0.5 * np.mean(rand), (lgbm, rand)


def test_transfer_guides_the_first_plan() -> None:
    """A global model fitted on two other workloads (same synthetic landscape) makes the
    very first plan better than random's: nothing of the task was measured yet."""
    rng = np.random.default_rng(11)
    examples = []
    for other in (conv(128, 28), conv(256, 14)):
        perf = synthetic(other)
        space_size = len(get_template(other.template).space(other))
        for index in rng.choice(space_size, size=800, replace=False).tolist():
            config = get_template(other.template).space(other).get(index)
            examples.append((other, config, perf(index), "synthetic"))
    prior = fit_global(get_template(CONV.template), examples)
    assert prior is not None and prior.n_workloads == 2
    perf = synthetic(CONV)
    pool = rng.choice(len(get_template(CONV.template).space(CONV)), size=2000, replace=False)
    warm, cold = [], []
    for seed in range(5):
        first = drive("lgbm", CONV, trials=8, batch=8, seed=seed, pool=pool, prior=prior)
        warm.append(max(perf(c.index) for c in first))
        first = drive("random", CONV, trials=8, batch=8, seed=seed, pool=pool)
        cold.append(max(perf(c.index) for c in first))
    assert np.mean(warm) > np.mean(cold), (warm, cold)


def test_prior_weight_decays_with_the_tasks_own_records() -> None:
    template = get_template(CONV.template)
    tuner = LGBMTuner(template, CONV, prior=object(), decay=32)  # type: ignore[arg-type]
    assert tuner.prior_weight(0, has_local=False) == 1.0
    weights = [tuner.prior_weight(n, has_local=True) for n in (8, 32, 128, 1024)]
    assert weights == sorted(weights, reverse=True) and weights[1] == 0.5
    assert LGBMTuner(template, CONV).prior_weight(100, has_local=True) == 0.0


def test_global_models_refit_only_when_records_grew() -> None:
    template = get_template(CONV.template)
    perf = synthetic(CONV)
    space = template.space(CONV)
    examples = [(CONV, space.get(i), perf(i), "x") for i in range(0, 200_000, 997)]
    loads = []

    def load() -> list:  # type: ignore[type-arg]
        loads.append(1)
        return examples

    models = GlobalModels(refit_growth=0.2, min_new=10)
    first = models.get(template, "opencl", lambda: 200, load)
    assert models.get(template, "opencl", lambda: 205, load) is first and len(loads) == 1
    assert models.get(template, "opencl", lambda: 260, load) is not first and len(loads) == 2


def test_global_models_fit_apart_without_blocking() -> None:
    """In the background a due fit runs on its own thread: get answers the last model
    at once (None before the first), and a tuner's provider picks up the new one."""
    template = get_template(CONV.template)
    perf = synthetic(CONV)
    space = template.space(CONV)
    examples = [(CONV, space.get(i), perf(i), "x") for i in range(0, 200_000, 997)]
    release = threading.Event()

    def slow_load() -> list:  # type: ignore[type-arg]
        assert release.wait(30)
        return examples

    models = GlobalModels(refit_growth=0.2, min_new=10)
    latest = models.latest(template, "opencl")
    started = time.perf_counter()
    assert models.get(template, "opencl", lambda: 200, slow_load, background=True) is None
    assert models.get(template, "opencl", lambda: 200, slow_load, background=True) is None
    assert time.perf_counter() - started < 10.0  # neither call waited for the 30 s fit
    assert latest() is None
    release.set()
    assert models.wait(60)
    first = latest()
    assert first is not None and first.n_workloads == 1
    assert models.get(template, "opencl", lambda: 205, slow_load, background=True) is first
    # a refit that fails keeps the last model
    def broken() -> list:  # type: ignore[type-arg]
        raise RuntimeError("database gone")
    assert models.get(template, "opencl", lambda: 400, broken, background=True) is first
    assert models.wait(60) and latest() is first


def test_relevance_labels_per_group() -> None:
    perf = np.array([1.0, 2.0, 0.0, 10.0, 5.0])
    labels = relevance(perf, np.array([0, 0, 0, 1, 1]))
    assert labels.tolist() == [LABELS // 2, LABELS, 0, LABELS, LABELS // 2]


def test_cost_model_ranks_and_takes_groups_larger_than_lightgbm_allows() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((3 * MAX_GROUP, 5))
    y = x[:, 0] * 2 + x[:, 1]
    model = CostModel().fit(x, y, np.zeros(len(y), dtype=int))
    test = rng.random((1000, 5))
    truth = test[:, 0] * 2 + test[:, 1]
    top = np.argsort(-model.predict(test))[:20]  # what a plan takes: the top of the ranking
    assert np.quantile(truth, 0.9) < truth[top].mean(), (truth[top].mean(), truth.max())


def test_annealing_finds_the_top_of_a_known_landscape_and_stops_early() -> None:
    space = get_template(CONV.template).space(CONV)
    target = space.radices // 2

    def score(idx: np.ndarray) -> np.ndarray:
        return -np.abs(space.positions(idx) - target).sum(axis=1).astype(float)

    best_index = int(space.indices(target[None, :])[0])
    rng = np.random.default_rng(0)
    sa = SimulatedAnnealing(SpaceWalk(space), n_chains=32, max_steps=400, early_stop=40)
    start = rng.integers(0, len(space), size=32)
    excluded = best_index
    found, scores = sa.explore(score, 8, start, lambda idx: idx == excluded, rng)
    assert len(found) == 8 and excluded not in found.tolist()
    assert scores.max() >= -3, scores  # within three knob steps of the optimum (90M configs)
    evaluated = 32 * (sa.steps_run + 1)
    assert scores.max() > score(rng.integers(0, len(space), size=evaluated)).max(), (
        "annealing did no better than as many random draws")
    assert list(scores) == sorted(scores, reverse=True)
    assert sa.steps_run < 400, "early stopping never triggered"
    assert sa.points is not None and len(sa.points) == 32  # chains persist for the next plan


def test_pool_walk_moves_inside_the_pool() -> None:
    space = get_template(CONV.template).space(CONV)
    pool = np.random.default_rng(2).choice(len(space), size=300, replace=False)
    walk = PoolWalk(space, pool)
    moved = walk.move(pool[:50], np.random.default_rng(0))
    assert set(moved.tolist()) <= set(pool.tolist()) and (moved != pool[:50]).all()


def test_diverse_pick_spreads_the_plan() -> None:
    # ten top candidates that differ in one knob only, ten slightly worse different ones
    same = np.tile([1, 1, 1], (10, 1))
    same[:, 2] = np.arange(10)
    other = np.arange(30).reshape(10, 3) + 2
    positions = np.concatenate([same, other])
    indices = np.arange(20)
    scores = np.linspace(1.0, 0.8, 20)
    picked = diverse_pick(positions, indices, scores, 6)
    assert picked[0] == 0 and sum(i < 10 for i in picked) == 1, picked
    assert diverse_pick(positions, indices, scores, 6, score_weight=100.0) == list(range(6))


def test_lgbm_annealing_chains_continue_across_plans() -> None:
    template = get_template(CONV.template)
    perf = synthetic(CONV)
    tuner = LGBMTuner(template, CONV, limits=TIGHT, seed=4)
    starts: list[np.ndarray] = []
    explore = tuner.annealer.explore

    def spy(score, n_best, start, exclude, rng):  # type: ignore[no-untyped-def]
        starts.append(start.copy())
        return explore(score, n_best, start, exclude, rng)

    tuner.annealer.explore = spy  # type: ignore[method-assign]
    visited = Visited()
    measured = Measured()
    ends = []
    for _ in range(3):
        got = tuner.propose(16, visited, measured)
        visited.add(got)
        measured.add(got, [perf(i) for i in got.tolist()])
        if tuner.annealer.points is not None:
            ends.append(tuner.annealer.points.copy())
    assert len(starts) == 2 and len(ends) == 2  # the first plan is random: no model yet
    assert set(ends[0].tolist()) <= set(starts[1].tolist()), "the chains restarted"

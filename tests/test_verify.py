"""Builds are never fooled by noise (issue 17, point 5): when a task's search ends, its
best configs and the template's default are measured again, interleaved, and the one
ApplyHistoryBest rule ranks a device's verified configs by their median before any
unverified record. On SQLite and PostgreSQL: the verification's plan and lease order,
its measure options, counters and states; the rule over stored rows (records/best,
the pretuned log, a build reading the database); the migration from 0005; and an
embedded `tuner tune` on PoCL whose `tuner records best` is the verified winner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from server_fixtures import BACKENDS, empty_database, migrated_sessions, opencl_target
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from compiler.records import Candidate, choose_one
from compiler.templates import get_template
from compiler.templates.history import THIS_DEVICE, Stored, device_order, rank
from schemas import (
    DeviceLimits,
    MeasureErrorNo,
    MeasureOptions,
    MeasureResult,
    Record,
    Target,
    Workload,
)
from schemas.api import JobRequest
from schemas.record import COLD_INFO
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow
from tuner_server.queue.sql import SqlQueue
from tuner_server.services import dispatch, jobs
from tuner_server.services import records as svc
from tuner_server.services.scheduler import (
    VERIFY_MARGIN,
    VERIFY_MIN_ROUNDS,
    VERIFY_ROUNDS,
    SearchState,
    _turned,
    plan_once,
)

TARGET = "opencl -model=pocl-cpu"
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs, the default is index 6
WORKLOAD = Workload(template=DENSE, args=DENSE_ARGS)
DEFAULT = get_template(DENSE).default_config(WORKLOAD).index
MEASURE = MeasureOptions(number=1, repeat=3, min_repeat_ms=20.0)


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


def _submit(session: Session, verify_top: int, n_trial: int = 6,
            early_stopping: int | None = None) -> int:
    return jobs.submit(session, JobRequest(
        target=Target.parse(TARGET), tasks=[WORKLOAD], n_trial=n_trial, plan_size=n_trial,
        tuner="random", measure=MEASURE, verify_top=verify_top,
        early_stopping=early_stopping))


def _plan(sessions: sessionmaker[Session], state: SearchState) -> list[int]:
    with sessions.begin() as session:
        _stats, new, _requeued = plan_once(session, SqlQueue(), state)
        return [t.id for t in new]


def _measure(sessions: sessionmaker[Session], worker_id: int,
             cost: dict[tuple[int, int], float | None],
             count: int = 100) -> list[tuple[int, int, dict[str, Any]]]:
    """Lease what is queued (up to ``count``) as the worker and report ``cost[(round,
    config index)]`` (None: error 4); returns (round, config index, measure options) in
    lease order."""
    with sessions.begin() as session:
        worker = dispatch.get_worker(session, worker_id)
        assert worker is not None
        leased, failed = dispatch.lease(session, SqlQueue(), worker, count, 60.0)
        assert not failed
        rows = {t.id: t for t in session.scalars(select(TrialRow).where(
            TrialRow.id.in_([x.trial_id for x in leased])))}
        order = [(rows[x.trial_id].verify_round, rows[x.trial_id].config_index, x.measure)
                 for x in leased]
        results = []
        for x, (round_, index, _) in zip(leased, order, strict=True):
            value = cost[(round_, index)]
            result = (MeasureResult(costs=(value,) * 3, error_no=MeasureErrorNo.NO_ERROR,
                                    all_cost=0.1, timestamp=time.time())
                      if value is not None else
                      MeasureResult.failure(MeasureErrorNo.RUNTIME_DEVICE, "broken"))
            results.append((x.trial_id, result, None))
        dispatch.report(session, worker, results)
    return order


def _worker(sessions: sessionmaker[Session], target: str = TARGET) -> int:
    with sessions.begin() as session:
        return dispatch.register(session, "w", Target.parse(target), DeviceLimits(), None,
                                 60.0).id


def _searched(sessions: sessionmaker[Session], state: SearchState, n_trial: int
              ) -> tuple[int, list[int]]:
    """A job of ``n_trial`` trials verifying its top 3, planned: (its id, the config
    indices of its search in plan order, the default first)."""
    with sessions.begin() as session:
        job_id = _submit(session, verify_top=3, n_trial=n_trial)
    _plan(sessions, state)
    with sessions() as session:
        indices = list(session.scalars(select(TrialRow.config_index).order_by(TrialRow.id)))
    assert indices[0] == DEFAULT
    return job_id, indices


def _state(session: Session, job_id: int) -> tuple[str, str, int]:
    job = session.get(JobRow, job_id)
    task = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)).one()
    assert job is not None
    return job.status, task.status, task.trials_done


def test_a_task_ends_by_verifying_its_best_configs_and_the_default_interleaved(
        sessions: sessionmaker[Session]) -> None:
    """At its budget a task plans VERIFY_MIN_ROUNDS rounds of its 3 cheapest configs
    other than the default, then the default, leased in that interleaved order turned by
    one a round (c1, c2, c3, d, then c2, c3, d, c1) with twice the repeats; a config failing a round makes one round more (VERIFY_ROUNDS in
    all); they count in no counter, the job runs until they are in, and then the
    config whose verified median is lowest wins records/best, the pretuned log, the
    dashboard's search and a build reading the database, although its search record was
    not the cheapest."""
    state = SearchState()
    worker = _worker(sessions)
    with sessions.begin() as session:
        job_id = _submit(session, verify_top=3)
    assert len(_plan(sessions, state)) == 6
    with sessions() as session:
        searched = [t.config_index for t in session.scalars(
            select(TrialRow).order_by(TrialRow.id))]
    assert searched[0] == DEFAULT and len(set(searched)) == 6
    others = searched[1:]
    # search costs: the default 5 ms, the others 1, 2, 3, 4, 6 ms in plan order
    search_cost = {DEFAULT: 5e-3, **{i: c * 1e-3 for i, c in zip(others, (1, 2, 3, 4, 6))}}
    order = _measure(sessions, worker, {(0, i): c for i, c in search_cost.items()})
    assert [i for _, i, _ in order] == searched and all(m == MEASURE.model_dump()
                                                        for *_, m in order)
    planned = _plan(sessions, state)
    assert len(planned) == 4 * VERIFY_MIN_ROUNDS and VERIFY_ROUNDS == 3
    with sessions() as session:
        assert _state(session, job_id) == ("running", "verifying", 6)
        job = jobs.describe(session, job_id, lease_s=60.0)
        assert job is not None and job.tasks[0].status == "verifying"
        assert job.trials_done == 6 and len(job.tasks[0].curve or []) == 2
        page = jobs.task_trials(session, job_id, job.tasks[0].id)
        assert page is not None and len(page.items) == 6  # the search's trials only
    top = others[:3]  # the three cheapest that are not the default
    # verified: the search's cheapest (1 ms) is really 3 ms; the second 2 ms; the third
    # fails twice; the default 2.5 ms
    verified = {top[0]: (3e-3, 2.9e-3, 3.1e-3), top[1]: (2.1e-3, 1.9e-3, 2.0e-3),
                top[2]: (1e-4, None, None), DEFAULT: (2.5e-3, 2.5e-3, 2.5e-3)}
    expected = []
    for rounds in (range(1, VERIFY_MIN_ROUNDS + 1), [VERIFY_ROUNDS]):
        if expected:  # the third config failed its second round: the winner is in doubt
            assert len(_plan(sessions, state)) == 4
        now = [(r, i) for r in rounds for i in _turned([*top, DEFAULT], r)]
        order = _measure(sessions, worker, {(r, i): verified[i][r - 1] for r, i in now})
        assert [(r, i) for r, i, _ in order] == now
        assert all(m["repeat"] == 6 and m["min_repeat_ms"] == 100.0 and m["number"] == 1
                   for *_, m in order)
        expected += now
    with sessions() as session:
        assert _state(session, job_id) == ("running", "verifying", 6)
        task = session.scalars(select(TaskRow)).one()
        assert task.best_cost == pytest.approx(1e-3)  # the search's, untouched
        job = jobs.describe(session, job_id, lease_s=60.0)  # 0.1 ms verified: no new point
        assert job is not None and len(job.tasks[0].curve or []) == 2
        page = jobs.task_trials(session, job_id, task.id)
        assert page is not None and len(page.items) == 6
        marks = session.execute(select(RecordRow.verified_config, TrialRow.verify_round)
                                .join(TrialRow, TrialRow.id == RecordRow.trial_id)).all()
        assert sorted(marks, key=str) == sorted(
            [(None, 0)] * 6 + [(i, r) for r, i in expected], key=str)
    assert _plan(sessions, state) == []
    with sessions() as session:
        assert _state(session, job_id) == ("done", "done", 6)
        [answer] = svc.best(session, [WORKLOAD], Target.parse(TARGET))
        assert answer.rule == "model" and answer.record is not None
        assert answer.record.config.index == top[1]
        assert answer.record.result.mean_cost == pytest.approx(2.0e-3)  # its median
        lines, _etag = svc.pretuned_log(session, Target.parse(TARGET))
        assert [json.loads(line)["config"]["index"] for line in lines] == [top[1]]
        _total, [shown] = svc.search(session, Target.parse(TARGET))  # the dashboard's best
        assert (shown.config["index"], shown.cost) == (top[1], pytest.approx(2.0e-3))
        candidates = [Candidate(r, "db", measured, verified)
                      for r, measured, verified in svc.stored_of(session, [WORKLOAD])]
    choice = choose_one(WORKLOAD, candidates, Target.parse(TARGET), DeviceLimits())
    assert choice.source == THIS_DEVICE and choice.record == answer.record


def test_the_verified_default_is_the_one_the_task_planned(
        sessions: sessionmaker[Session]) -> None:
    """The default a task verifies is the one it stored when it planned it (sized for
    its devices' lanes), not the template's default worked out again at the end (which a
    worker registering meanwhile could change)."""
    state = SearchState()
    worker = _worker(sessions)
    with sessions.begin() as session:
        job_id = _submit(session, verify_top=3)
    _plan(sessions, state)
    with sessions.begin() as session:
        searched = [t.config_index for t in session.scalars(
            select(TrialRow).order_by(TrialRow.id))]
        task = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)).one()
        assert task.default_index == searched[0] == DEFAULT
        planned_default = searched[5]  # as if the fleet's lanes had picked another
        task.default_index = planned_default
    costs = dict(zip(searched, (5e-3, 1e-3, 2e-3, 3e-3, 4e-3, 6e-3)))
    _measure(sessions, worker, {(0, i): c for i, c in costs.items()})
    _plan(sessions, state)
    with sessions() as session:
        verifying = [(t.verify_round, t.config_index) for t in session.scalars(
            select(TrialRow).where(TrialRow.verify_round > 0).order_by(TrialRow.id))]
    assert verifying == [(r, i) for r in range(1, VERIFY_MIN_ROUNDS + 1)
                         for i in _turned([*searched[1:4], planned_default], r)]


def test_verify_top_zero_ends_the_task_at_its_budget(sessions: sessionmaker[Session]) -> None:
    """verify_top=0: no verification; the task and job end as soon as the budget is in,
    and the cheapest search record wins as before."""
    state = SearchState()
    worker = _worker(sessions)
    with sessions.begin() as session:
        job_id = _submit(session, verify_top=0, n_trial=3)
    _plan(sessions, state)
    with sessions() as session:
        indices = list(session.scalars(select(TrialRow.config_index).order_by(TrialRow.id)))
    _measure(sessions, worker, {(0, i): c for i, c in zip(indices, (3e-3, 1e-3, 2e-3))})
    assert _plan(sessions, state) == []
    with sessions() as session:
        assert _state(session, job_id) == ("done", "done", 3)
        assert session.scalar(select(sa.func.count()).select_from(TrialRow)) == 3
        [answer] = svc.best(session, [WORKLOAD], Target.parse(TARGET))
        assert answer.record is not None and answer.record.config.index == indices[1]


def test_a_task_with_one_working_config_has_nothing_to_verify(
        sessions: sessionmaker[Session]) -> None:
    """Only the default worked (the other config failed): with one candidate there is
    nothing to compare, so the task ends at its budget without a verification."""
    state = SearchState()
    worker = _worker(sessions)
    job_id, indices = _searched(sessions, state, n_trial=2)
    _measure(sessions, worker, {(0, DEFAULT): 1e-3, (0, indices[1]): None})
    assert _plan(sessions, state) == []
    with sessions() as session:
        assert _state(session, job_id) == ("done", "done", 2)


def test_an_early_stop_verifies_after_its_leased_trials_are_in(
        sessions: sessionmaker[Session]) -> None:
    """Early stopping with a search trial still leased: the queued rest is withdrawn,
    the verification waits for the leased result (it may be among the best) and then
    takes it in; verify_top larger than the configs measured takes them all."""
    state = SearchState()
    worker = _worker(sessions)
    with sessions.begin() as session:
        job_id = _submit(session, verify_top=8, n_trial=8, early_stopping=1)
    _plan(sessions, state)
    with sessions.begin() as session:
        db_worker = dispatch.get_worker(session, worker)
        assert db_worker is not None
        first, second = dispatch.lease(session, SqlQueue(), db_worker, 2, 60.0)[0]
        ok = MeasureResult(costs=(1e-3,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                           timestamp=time.time())
        worse = ok.model_copy(update={"costs": (2e-3,)})
        dispatch.report(session, db_worker, [(first.trial_id, ok, None)])
        dispatch.report(session, db_worker, [(second.trial_id, worse, None)])
        third = dispatch.lease(session, SqlQueue(), db_worker, 1, 60.0)[0][0]
    assert _plan(sessions, state) == []  # stopped early; waiting for the third
    with sessions() as session:
        statuses = [t.status for t in session.scalars(select(TrialRow).order_by(TrialRow.id))]
        assert statuses == ["done", "done", "leased"] + ["cancelled"] * 5
        assert _state(session, job_id) == ("running", "running", 2)
    with sessions.begin() as session:
        db_worker = dispatch.get_worker(session, worker)
        assert db_worker is not None
        dispatch.report(session, db_worker, [(third.trial_id, worse, None)])
    assert len(_plan(sessions, state)) == 3 * VERIFY_MIN_ROUNDS
    with sessions() as session:
        assert _state(session, job_id)[1] == "verifying"


CLEAR = {"c1": (1.0, 1.0), "c2": (1.2, 1.06), "c3": (1.5, 1.4), "d": (2.0, 2.0)}


@pytest.mark.parametrize(("case", "costs", "more"), [
    ("ahead by the margin in both rounds", CLEAR, False),
    ("ahead in one round only", {**CLEAR, "c2": (1.2, 0.99)}, True),
    ("ahead by less than the margin once", {**CLEAR, "c2": (1.2, VERIFY_MARGIN - 0.01)}, True),
    ("a slower config failed a round", {**CLEAR, "d": (2.0, None)}, True),
])
def test_a_third_round_only_while_the_winner_is_in_doubt(
        sessions: sessionmaker[Session], case: str,
        costs: dict[str, tuple[float | None, ...]], more: bool) -> None:
    """After VERIFY_MIN_ROUNDS rounds the task ends when one config led every other by
    VERIFY_MARGIN in each round and every config was measured each time; otherwise one
    more round of the same configs, the first round's order turned by two, and then it
    ends whatever they say. The winner is the rule's either way (lowest upper median)."""
    state = SearchState()
    worker = _worker(sessions)
    job_id, searched = _searched(sessions, state, n_trial=4)
    _measure(sessions, worker, {(0, i): c for i, c in zip(searched, (9e-3, 1e-3, 2e-3, 3e-3))})
    name = dict(zip([*searched[1:], DEFAULT], ("c1", "c2", "c3", "d")))
    third = {n: (1.0 if n == "c1" else 1.5) for n in name.values()}
    table = {(r, i): (None if costs[n][r - 1] is None else costs[n][r - 1] * 1e-3)
             for i, n in name.items() for r in range(1, VERIFY_MIN_ROUNDS + 1)}
    table |= {(VERIFY_ROUNDS, i): third[n] * 1e-3 for i, n in name.items()}
    assert len(_plan(sessions, state)) == 4 * VERIFY_MIN_ROUNDS
    _measure(sessions, worker, table)
    again = _plan(sessions, state)
    assert len(again) == (4 if more else 0), case
    if more:
        order = _measure(sessions, worker, table)
        assert [(r, name[i]) for r, i, _ in order] == [
            (VERIFY_ROUNDS, n) for n in ("c3", "d", "c1", "c2")]
        assert _plan(sessions, state) == []
    with sessions() as session:
        assert _state(session, job_id) == ("done", "done", 4)
        rounds = session.scalars(select(TrialRow.verify_round).where(
            TrialRow.verify_round > 0).distinct()).all()
        assert sorted(rounds) == list(range(1, (VERIFY_ROUNDS if more else
                                                VERIFY_MIN_ROUNDS) + 1))
        [answer] = svc.best(session, [WORKLOAD], Target.parse(TARGET))
    assert answer.record is not None and name[answer.record.config.index] == "c1"


def test_rounds_measured_on_two_device_models_take_the_third(
        sessions: sessionmaker[Session]) -> None:
    """A job for a bare target: its first round measured on one model, its second on
    another. The rule ranks each model's records apart, so however clear the costs look
    across them, the third round is planned."""
    state = SearchState()
    one, two = _worker(sessions, TARGET), _worker(sessions, "opencl -model=other-cpu")
    with sessions.begin() as session:
        jobs.submit(session, JobRequest(
            target=Target.parse("opencl"), tasks=[WORKLOAD], n_trial=4, plan_size=4,
            tuner="random", measure=MEASURE, verify_top=3))
    _plan(sessions, state)
    with sessions() as session:
        searched = list(session.scalars(select(TrialRow.config_index).order_by(TrialRow.id)))
    clear = dict(zip(searched, (4e-3, 1e-3, 2e-3, 3e-3)))  # the same order in every round
    table = {(r, i): c for i, c in clear.items() for r in range(VERIFY_ROUNDS + 1)}
    _measure(sessions, one, table)
    assert len(_plan(sessions, state)) == 4 * VERIFY_MIN_ROUNDS
    assert [r for r, *_ in _measure(sessions, one, table, count=4)] == [1] * 4
    assert [r for r, *_ in _measure(sessions, two, table, count=4)] == [2] * 4
    assert len(_plan(sessions, state)) == 4


# --------------------------------------------------------------------------- the rule

CPU = Target.parse(TARGET)
OTHER = Target.parse("opencl -model=other-cpu")


def _entry(name: str, cost: float, verifies: int | None = None, error_no: int = 0,
           target: Target = CPU, measured: bool = True, cold: bool = False) -> Stored[str]:
    return Stored(name, target, cost, error_no, measured, verifies, cold)


def test_verified_configs_rank_by_median_before_every_unverified_record() -> None:
    """A config whose search record was cheapest but whose verification was slower loses;
    each verified config is tried as its median measurement; a config that failed half
    its rounds (upper median) cannot win; the device's unverified records follow."""
    entries = [
        _entry("search a", 1e-3), _entry("search b", 2e-3), _entry("import", 5e-4,
                                                                   measured=False),
        _entry("a1", 3e-3, 1), _entry("b1", 2.2e-3, 2), _entry("c1", 1e-4, 3),  # c: 1 of 2
        _entry("a2", 2.8e-3, 1), _entry("b2", 1.8e-3, 2), _entry("c2", 0.0, 3, error_no=4),
        _entry("a3", 3.2e-3, 1), _entry("b3", 2.0e-3, 2),
        _entry("d1", 4e-3, 4), _entry("d2", 5e-3, 4), _entry("d3", 0.0, 4, error_no=4),
        _entry("d4", 6e-3, 4),  # 4, 5, 6 ms and a failure: the upper median, 6 ms
        _entry("e1", 1e-4, 5), _entry("e2", 0.0, 5, error_no=7),  # half failed: out
        _entry("elsewhere", 1e-5, target=OTHER, measured=True),
    ]
    assert [e.item for e in device_order(entries[:-1])] == [
        "b3", "a1", "d4", "search a", "search b", "import"]
    ranked = rank(entries, Target.parse("opencl -model=pocl-cpu"))
    assert [(r.source, r.item) for r in ranked][:6] == [
        (THIS_DEVICE, "b3"), (THIS_DEVICE, "a1"), (THIS_DEVICE, "d4"),
        (THIS_DEVICE, "search a"), (THIS_DEVICE, "search b"), (THIS_DEVICE, "import")]
    # this device's other verified measurements never come back as another device's
    assert [r.item for r in ranked[6:]] == ["elsewhere"]


def test_ties_of_medians_go_to_the_config_first_stored_and_without_verified_nothing_changes(
        ) -> None:
    entries = [_entry("x1", 2e-3, 7), _entry("y1", 2e-3, 8), _entry("s", 1e-3)]
    assert [e.item for e in device_order(entries)] == ["x1", "y1", "s"]
    plain = [_entry("s2", 2e-3), _entry("imp", 1e-3, measured=False), _entry("s1", 1e-3)]
    assert [e.item for e in device_order(plain)] == ["s1", "s2", "imp"]


def test_records_timed_cold_rank_before_those_timed_warm() -> None:
    """A warm cost is too low where the weight is large, so cold and warm records do not
    compete: the device's cold ones first (verified, measured, imported), then its warm
    ones in the same order; a config verified both ways is ranked in each by its own
    rounds; other devices' records keep their cost order."""
    entries = [
        _entry("warm search", 1e-3), _entry("cold search", 3e-3, cold=True),
        _entry("warm import", 1e-4, measured=False),
        _entry("cold import", 2e-3, measured=False, cold=True),
        _entry("warm a1", 1.5e-3, 1), _entry("warm a2", 1.4e-3, 1),
        _entry("cold a1", 4e-3, 1, cold=True), _entry("cold b1", 5e-3, 2, cold=True),
        _entry("cold search 2", 2.5e-3, cold=True),
        _entry("elsewhere warm", 1e-5, target=OTHER), _entry("elsewhere cold", 2e-5,
                                                             target=OTHER, cold=True),
    ]
    assert [e.item for e in device_order(entries[:-2])] == [
        "cold a1", "cold b1", "cold search 2", "cold search", "cold import",
        "warm a1", "warm search", "warm import"]
    ranked = rank(entries, CPU)
    assert [r.item for r in ranked][-2:] == ["elsewhere warm", "elsewhere cold"]
    # nothing timed cold: the order is the one before
    warm = [e for e in entries[:-2] if not e.cold]
    assert [e.item for e in device_order(warm)] == [
        "warm a1", "warm search", "warm import"]


def _stored_record(config_index: int, cost: float, cold: bool) -> Record:
    space = get_template(DENSE).space(WORKLOAD)
    return Record(target=CPU, workload=WORKLOAD, config=space.get(config_index),
                  result=MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR,
                                       all_cost=0.1, timestamp=1.7e9),
                  info={COLD_INFO: True} if cold else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_records_best_and_the_pretuned_log_take_the_cold_record(backend: str,
                                                                 tmp_path: Path) -> None:
    """A job timed cold (``tuner tune``) and one timed warm (the wire's default) on one
    database: records/best, the pretuned log, the dashboard's search and a build reading
    the database all take the cold job's best, though the warm job's records cost less."""
    cold = _stored_record(1, 2e-3, cold=True)
    # three warm records cheaper than every cold one: a lookup that read this device's
    # first LEADING + 1 by cost alone would never see the cold ones
    records = [_stored_record(2, 1e-3, cold=False), cold, _stored_record(5, 1.5e-3, cold=False),
               _stored_record(3, 2.5e-3, cold=True), _stored_record(4, 5e-4, cold=False)]
    assert svc.LEADING + 1 == 3
    with migrated_sessions(backend, tmp_path) as sessions:
        with sessions.begin() as session:
            svc.add_records(session, records)
            assert sorted(session.scalars(select(RecordRow.cold))) == [False] * 3 + [True] * 2
        with sessions() as session:
            [answer] = svc.best(session, [WORKLOAD], CPU)
            assert answer.record == cold
            lines, _etag = svc.pretuned_log(session, CPU)
            assert [json.loads(line) for line in lines] == [cold.to_json()]
            _total, [shown] = svc.search(session, CPU)  # the dashboard's best
            assert (shown.config, shown.cost) == (cold.config.to_json(), 2e-3)
            stored = svc.stored_of(session, [WORKLOAD])
        choice = choose_one(WORKLOAD, [Candidate(r, "db", measured, verified)
                                       for r, measured, verified in stored], CPU, None)
        assert choice.record == cold


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_to_0009_marks_the_records_timed_cold(backend: str, tmp_path: Path) -> None:
    """Rows stored before the column read their info: a line that says
    ``cpu_cache_flush`` is cold, any other (no info, other info, false) is not; the
    downgrade drops the column and keeps the rows."""
    from tuner_server.db.session import make_engine

    records_t = sa.table("records", *(sa.column(c) for c in (
        "target", "target_kind", "target_model", "target_keys", "template", "workload_key",
        "mean_cost", "error_no", "timestamp", "source", "created_at", "line_hash")),
        sa.column("line", sa.JSON))
    infos: list[dict[str, Any] | None] = [
        {COLD_INFO: True, "device": "pocl"}, None, {"device": "pocl"}, {COLD_INFO: False},
        {COLD_INFO: 1}]  # JSON true only, as ``timed_cold`` reads it
    with empty_database(backend, tmp_path) as url:
        _alembic(url, "0008")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                for i, info in enumerate(infos):
                    line = _stored_record(i, 1e-3, cold=False).to_json()
                    if info is not None:
                        line["info"] = info
                    conn.execute(sa.insert(records_t).values(
                        target=TARGET, target_kind="opencl", target_model="pocl-cpu",
                        target_keys=",opencl,cpu,", template=DENSE, workload_key=WORKLOAD.key,
                        mean_cost=1e-3, error_no=0, timestamp=1.0, source="measured",
                        created_at=datetime.now(UTC), line_hash=f"{i}" * 64, line=line))
            _alembic(url, "head")
            with engine.connect() as conn:
                assert [bool(c) for c in conn.execute(sa.text(
                    "SELECT cold FROM records ORDER BY id")).scalars()] == [
                    True, False, False, False, False]
            _alembic(url, "0008", down=True)
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT count(*) FROM records")).scalar() == 5
        finally:
            engine.dispose()


# --------------------------------------------------------------------------- migration

def _alembic(url: str, revision: str, down: bool = False) -> None:
    from alembic import command
    from alembic.config import Config as AlembicConfig

    import migrations
    from tuner_server.db.session import make_engine

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, revision)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_from_0005_keeps_jobs_trials_and_records(backend: str, tmp_path: Path) -> None:
    """Rows stored under 0005 read as before: jobs verify nothing (verify_top 0), trials
    are search trials (round 0), records are not verifications; a config may then be
    measured again in a verification round but not twice in one round."""
    from tuner_server.db.session import make_engine

    jobs_t = sa.table("jobs", *(sa.column(c) for c in (
        "id", "target", "status", "tuner", "n_trial", "plan_size", "created_at")),
        sa.column("measure", sa.JSON))
    tasks_t = sa.table("tasks", *(sa.column(c) for c in (
        "id", "job_id", "template", "status", "trials_planned", "trials_done")),
        sa.column("args", sa.JSON))
    def trials_table(*extra: str) -> sa.TableClause:
        return sa.table("trials", *(sa.column(c) for c in (
            "id", "task_id", "queue", "config_index", "status", "attempts", *extra)),
            sa.column("config", sa.JSON))

    trials_t = trials_table()
    records_t = sa.table("records", *(sa.column(c) for c in (
        "target", "target_kind", "target_model", "target_keys", "template", "workload_key",
        "mean_cost", "error_no", "timestamp", "source", "created_at", "trial_id",
        "line_hash")), sa.column("line", sa.JSON))
    config = get_template(DENSE).default_config(WORKLOAD)
    with empty_database(backend, tmp_path) as url:
        _alembic(url, "0005")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.insert(jobs_t).values(
                    id=1, target=TARGET, status="running", tuner="random", n_trial=4,
                    plan_size=4, measure={}, created_at=datetime.now(UTC)))
                conn.execute(sa.insert(tasks_t).values(
                    id=1, job_id=1, template=DENSE, args=DENSE_ARGS, status="running",
                    trials_planned=1, trials_done=1))
                conn.execute(sa.insert(trials_t).values(
                    id=1, task_id=1, queue="opencl", config_index=config.index,
                    status="done", attempts=1, config=config.to_json()))
                conn.execute(sa.insert(records_t).values(
                    target=TARGET, target_kind="opencl", target_model="pocl-cpu",
                    target_keys=",opencl,cpu,", template=DENSE, workload_key=WORKLOAD.key,
                    mean_cost=1e-3, error_no=0, timestamp=1.0, source="measured",
                    created_at=datetime.now(UTC), trial_id=1, line_hash="h" * 64,
                    line={"input": []}))
            _alembic(url, "head")
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT verify_top FROM jobs")).all() == [(0,)]
                assert conn.execute(sa.text("SELECT verify_round FROM trials")).all() == [(0,)]
                assert conn.execute(sa.text(
                    "SELECT verified_config FROM records")).all() == [(None,)]
            again = trials_table("verify_round")
            with engine.begin() as conn:
                conn.execute(sa.insert(again).values(
                    id=2, task_id=1, queue="opencl", config_index=config.index,
                    status="queued", attempts=0, config=config.to_json(), verify_round=1))
                conn.execute(sa.text("UPDATE tasks SET status = 'verifying'"))
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(sa.insert(trials_t).values(
                    id=3, task_id=1, queue="opencl", config_index=config.index,
                    status="queued", attempts=0, config=config.to_json()))
            _alembic(url, "0005", down=True)  # the verification round goes with it
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT id FROM trials")).all() == [(1,)]
                # a status the older code cannot read: its search had ended, so done
                assert conn.execute(sa.text("SELECT status FROM tasks")).all() == [("done",)]
        finally:
            engine.dispose()


# --------------------------------------------------------------------------- end to end

LOCAL, WHY = opencl_target()
TUNER = Path(sys.executable).with_name("tuner")


@pytest.mark.timeout(600)
@pytest.mark.skipif(LOCAL != TARGET, reason=WHY or f"the OpenCL device is {LOCAL}")
@pytest.mark.skipif(not TUNER.exists(), reason="the tuner script is not installed")
def test_embedded_tune_ends_verified_and_records_best_is_the_verified_winner(
        tmp_path: Path) -> None:
    """`tuner tune` (embedded, PoCL) of a small conv: the job ends done after its
    verification; the database holds VERIFY_MIN_ROUNDS to VERIFY_ROUNDS rounds of
    verified measurements of the best configs and the default, interleaved; `tuner
    records best` answers the config whose verified median is lowest, with its median
    measurement."""
    from tuner_server.db.session import make_engine

    url = f"sqlite:///{tmp_path / 'tune.db'}"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    conv = ["--template", "conv2d_nchw.cuda", "--args", json.dumps(
        [["TENSOR", [1, 8, 8, 8], "float32"], ["TENSOR", [8, 8, 3, 3], "float32"],
         [1, 1], [1, 1, 1, 1], [1, 1], "float32"])]
    common = ["--target", TARGET, "--database-url", url]
    proc = subprocess.run(
        [str(TUNER), "tune", *conv, *common, "--trials", "6", "--tuner", "random",
         "--number", "1", "--repeat", "1", "--min-repeat-ms", "0", "--device", "opencl:0"],
        capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "job 1 done: 6 trials" in proc.stdout
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT verified_config, mean_cost, error_no FROM records "
                "WHERE verified_config IS NOT NULL ORDER BY id")).all()
    finally:
        engine.dispose()
    configs = list(dict.fromkeys(r[0] for r in rows))
    rounds = len(rows) // 4
    assert len(configs) == 4 and VERIFY_MIN_ROUNDS <= rounds <= VERIFY_ROUNDS
    # measured interleaved, each round's order the first's turned by one
    assert [r[0] for r in rows] == [i for r in range(1, rounds + 1) for i in _turned(configs, r)]
    workload = Workload(template="conv2d_nchw.cuda", args=json.loads(conv[3]))
    assert get_template(workload.template).default_config(workload).index in configs
    medians = {}
    for index in configs:
        costs = sorted(c if e == 0 else float("inf") for i, c, e in rows if i == index)
        medians[index] = costs[len(costs) // 2]
    winner = min(configs, key=lambda i: (medians[i], configs.index(i)))
    proc = subprocess.run(
        [str(TUNER), "records", "best", *conv, *common], capture_output=True, text=True,
        timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = json.loads(next(s for s in proc.stdout.splitlines() if s.startswith("{")))
    assert line["config"]["index"] == winner
    assert sum(line["result"][0]) / len(line["result"][0]) == pytest.approx(medians[winner])


def _report(sessions: sessionmaker[Session], worker: int, trials: list[Any],
            failing: frozenset[int] = frozenset()) -> None:
    """Report leased trials as ``worker``: those in ``failing`` as error 4, the others at
    1 ms + 1 ms a trial id."""
    with sessions.begin() as session:
        db_worker = dispatch.get_worker(session, worker)
        assert db_worker is not None
        dispatch.report(session, db_worker, [(
            t.trial_id, MeasureResult.failure(MeasureErrorNo.RUNTIME_DEVICE, "broken")
            if t.trial_id in failing else
            MeasureResult(costs=(1e-3 * (1 + t.trial_id),), error_no=MeasureErrorNo.NO_ERROR,
                          all_cost=0.1, timestamp=time.time()), None) for t in trials])


def _layer_job(sessions: sessionmaker[Session], state: SearchState, n_trial: int,
               *more: Workload) -> tuple[int, list[int], list[Any]]:
    """A job of two templates' tasks of one layer (dense_small_batch, dense_pack) and
    ``more``, planned and its search leased: (the worker, the task ids, the trials)."""
    worker = _worker(sessions)
    with sessions.begin() as session:
        job_id = jobs.submit(session, JobRequest(
            target=Target.parse(TARGET), n_trial=n_trial, plan_size=n_trial, tuner="random",
            tasks=[WORKLOAD, Workload(template="dense_pack.x86", args=DENSE_ARGS), *more],
            measure=MEASURE, verify_top=3))
    _plan(sessions, state)
    with sessions.begin() as session:
        tasks = list(session.scalars(select(TaskRow.id).where(TaskRow.job_id == job_id)
                                     .order_by(TaskRow.id)))
        db_worker = dispatch.get_worker(session, worker)
        assert db_worker is not None
        leased = dispatch.lease(session, SqlQueue(), db_worker, n_trial * len(tasks), 60.0)[0]
    return worker, tasks, leased


def _statuses(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        return [t.status for t in session.scalars(select(TaskRow).order_by(TaskRow.id))]


def test_a_layers_templates_verify_together_once_each_has_searched(
        sessions: sessionmaker[Session]) -> None:
    """Two templates' tasks of one layer, and a task of another layer: the layer's task
    whose search ends first waits (verifying, nothing queued) until the other's is in;
    then both verify, their rounds in turn and each round's configs in turn across the
    tasks (each task's own order kept), so a worker's batch holds the candidates the
    build compares. The other layer's task verifies at once, on its own."""
    state = SearchState()
    other = Workload(template=DENSE, args=[["TENSOR", [1, 128], "float32"],
                                           ["TENSOR", [64, 128], "float32"], None, "float32"])
    worker, (a, b, c), leased = _layer_job(sessions, state, 3, other)
    assert len(leased) == 9

    def verification(*task_ids: int) -> list[tuple[int, int, int]]:
        with sessions() as session:
            return [(t.task_id, t.verify_round, t.config_index) for t in session.scalars(
                select(TrialRow).where(TrialRow.verify_round > 0,
                                       TrialRow.task_id.in_(task_ids)).order_by(TrialRow.id))]

    _report(sessions, worker, [t for t in leased if t.task_id != b])
    assert len(_plan(sessions, state)) == 3 * VERIFY_MIN_ROUNDS  # the other layer's task
    assert {task for task, _, _ in verification(a, b, c)} == {c}
    assert _statuses(sessions) == ["verifying", "running", "verifying"]
    assert _plan(sessions, state) == []  # a still waits for b
    _report(sessions, worker, [t for t in leased if t.task_id == b])
    assert len(_plan(sessions, state)) == 6 * VERIFY_MIN_ROUNDS
    both = verification(a, b)
    assert [(task, r) for task, r, _ in both] == [
        (task, r) for r in range(1, VERIFY_MIN_ROUNDS + 1) for _ in range(3)
        for task in (a, b)]
    for task in (a, b):
        configs = [i for t, r, i in both if t == task and r == 1]
        assert [i for t, r, i in both if t == task] == [
            i for r in range(1, VERIFY_MIN_ROUNDS + 1) for i in _turned(configs, r)]


def test_a_layers_task_with_nothing_to_verify_ends_at_once_and_keeps_none_waiting(
        sessions: sessionmaker[Session]) -> None:
    state = SearchState()
    worker, (a, b), leased = _layer_job(sessions, state, 2)
    b_trials = [t for t in leased if t.task_id == b]
    _report(sessions, worker, b_trials, failing=frozenset({b_trials[1].trial_id}))
    assert _plan(sessions, state) == []  # b had one working config
    assert _statuses(sessions) == ["running", "done"]
    _report(sessions, worker, [t for t in leased if t.task_id == a])
    assert len(_plan(sessions, state)) == 2 * VERIFY_MIN_ROUNDS  # a, without waiting
    assert _statuses(sessions) == ["verifying", "done"]


def test_a_layers_task_whose_verification_cannot_be_planned_fails_alone(
        sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner_server.services import scheduler

    state = SearchState()
    worker, (a, b), leased = _layer_job(sessions, state, 3)
    _report(sessions, worker, [t for t in leased if t.task_id == a])
    assert _plan(sessions, state) == []
    assert _statuses(sessions) == ["verifying", "running"]  # a waits for b
    planned = scheduler._verification

    def broken(session: Session, job: JobRow, task: TaskRow) -> list[TrialRow]:
        if task.id == a:
            raise RuntimeError("a's plan is broken")
        return planned(session, job, task)

    monkeypatch.setattr(scheduler, "_verification", broken)
    _report(sessions, worker, [t for t in leased if t.task_id == b])
    assert len(_plan(sessions, state)) == 3 * VERIFY_MIN_ROUNDS  # b's, alone
    assert _statuses(sessions) == ["failed", "verifying"]
    with sessions() as session:
        task = session.get(TaskRow, a)
        assert task is not None and "a's plan is broken" in (task.error or "")

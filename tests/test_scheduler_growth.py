"""Planning in bulk, with work that does not grow with a job's age: tuners answer arrays
of config indices checked by one vectorised ``valid_mask`` (the template's rules even
before a worker registered); a plan's trials are one INSERT of configs built without a
pydantic object each; the scheduler keeps each task's search state between passes and
reads only the trials that ended since; grid search keeps a cursor. The state is read
again whole whenever it may be stale: another planner, a pass that did not commit."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import nchwc_workload
from scheduler_sim import CONV, TARGET, fake_result, run_job
from server_fixtures import BACKENDS, migrated_sessions
from sqlalchemy import insert, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from compiler.templates import get_template
from schemas import Config, DeviceLimits, Workload
from schemas.api import JobRequest
from tuner_server.db.models import TaskRow, TrialRow
from tuner_server.queue.sql import SqlQueue
from tuner_server.search import Measured, Visited, make_tuner
from tuner_server.search.grid import GridTuner
from tuner_server.search.lgbm import LGBMTuner
from tuner_server.services import dispatch, jobs, scheduler
from tuner_server.services.scheduler import SearchState, plan_once

TIGHT = DeviceLimits(max_threads_per_block=256, max_shared_memory_per_block=16 * 1024,
                     max_local_elements=32)
# conv2d_NCHWc.x86 has rules of its own (oc_bn a multiple of vec, ...): ~40% of its
# 129,600 configs break one whatever the device
NCHWC = nchwc_workload(1, 256, 14, 256, 3, 1, 1)
DENSE = Workload(template="dense_small_batch.gpu", args=[
    ["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"], None, "float32"])


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


@pytest.fixture
def sqlite_sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions("sqlite", tmp_path) as made:
        yield made


@pytest.mark.parametrize("workload", [CONV, NCHWC, DENSE], ids=lambda w: w.template)
def test_configs_json_is_each_configs_json(workload: Workload) -> None:
    space = get_template(workload.template).space(workload)
    indices = np.random.default_rng(0).integers(0, len(space), size=300)
    got = space.configs_json(indices)
    assert got == [space.get(int(i)).to_json() for i in indices]
    assert [Config.model_validate(c) for c in got] == [space.get(int(i)) for i in indices]


def test_visited_and_measured_agree_with_plain_python() -> None:
    rng = np.random.default_rng(1)
    visited, plain = Visited(), set()
    measured, rows = Measured(), []
    for _ in range(40):
        batch = rng.integers(0, 5000, size=rng.integers(0, 200))
        visited.add(batch)
        plain |= set(batch.tolist())
        perf = rng.random(len(batch))
        measured.add(batch, perf)
        rows += list(zip(batch.tolist(), perf.tolist()))
        probe = rng.integers(0, 6000, size=500)
        assert visited.contains(probe).tolist() == [int(i) in plain for i in probe]
    assert len(visited) == len(plain)
    assert measured.indices.tolist() == [i for i, _ in rows]
    assert measured.perf.tolist() == [p for _, p in rows]
    best = measured.best(7)
    assert measured.perf[best].tolist() == sorted((p for _, p in rows), reverse=True)[:7]
    for indices, perf in [([1, 2], [0.5]), ([1, 2], 0.5), (3, 0.5), ([[1]], [[0.5]])]:
        with pytest.raises(ValueError, match="indices of shape"):
            measured.add(indices, perf)
    assert len(measured) == len(rows)


@pytest.mark.parametrize("name", ["random", "grid", "ga", "lgbm"])
def test_template_rules_hold_before_any_worker_registered(name: str) -> None:
    """No limits known yet (no worker): the template's own rules still filter, so a job
    submitted before its workers does not plan configs that fail with error 1."""
    template = get_template(NCHWC.template)
    space = template.space(NCHWC)
    roomy = DeviceLimits(max_threads_per_block=1 << 30, max_thread_x=1 << 30,
                         max_thread_y=1 << 30, max_thread_z=1 << 30,
                         max_shared_memory_per_block=1 << 30, max_local_elements=1 << 30)
    tuner = make_tuner(name, template=template, workload=NCHWC, limits=None, seed=2)
    visited, measured = Visited(), Measured()
    for _ in range(4):
        got = tuner.propose(32, visited, measured)
        assert len(got) == 32
        for index in got.tolist():
            # only a rule can fail under limits this large
            assert template.check_limits(NCHWC, space.get(index), roomy) == [], index
        visited.add(got)
        measured.add(got, [1.0 / (1 + i % 97) for i in got.tolist()])


def test_lgbm_learns_from_the_best_and_a_sample_of_a_long_history() -> None:
    tuner = LGBMTuner(get_template(CONV.template), CONV, max_fit=64)
    measured = Measured()
    rng = np.random.default_rng(3)
    measured.add(np.arange(40), rng.random(40))
    assert tuner._training_rows(measured, rng).tolist() == list(range(40))
    measured.add(np.arange(40, 1000), rng.random(960))
    rows = tuner._training_rows(measured, rng)
    assert len(rows) == len(set(rows.tolist())) == 64
    assert set(measured.best(16).tolist()) <= set(rows.tolist())
    got = tuner.propose(8, Visited(measured.indices), measured)
    assert len(got) == 8 and not np.isin(got, measured.indices).any()


def test_grid_keeps_a_cursor_and_a_restart_derives_it() -> None:
    """Grid plans in index order; a late plan scans on from where the last one stopped,
    where a tuner that has lost its cursor (a restart) scans from 0 past what was
    visited, once, to the same plan."""
    template = get_template(CONV.template)
    tuner = GridTuner(template, CONV, limits=TIGHT)
    visited = Visited()
    planned: list[int] = []
    while tuner.cursor < 20_000:
        got = tuner.propose(16, visited, Measured())
        assert len(got) == 16
        visited.add(got)
        planned += got.tolist()
    assert planned == sorted(planned)
    every = np.arange(planned[-1] + 1)
    assert planned == every[template.valid_mask(CONV, every, TIGHT)].tolist()

    def scanned(grid: GridTuner) -> tuple[list[int], int]:
        rows = []
        valid = grid.valid

        def spy(indices: np.ndarray) -> np.ndarray:
            rows.append(len(indices))
            return valid(indices)
        grid.valid = spy  # type: ignore[method-assign]
        got = grid.propose(16, visited, Measured()).tolist()
        return got, sum(rows)

    restarted = GridTuner(template, CONV, limits=TIGHT)
    with_cursor, rows = scanned(tuner)
    after_restart, rows_from_zero = scanned(restarted)
    assert with_cursor == after_restart and with_cursor[0] > planned[-1]
    assert rows_from_zero > 20_000 and rows * 10 < rows_from_zero
    assert restarted.cursor == tuner.cursor


@pytest.mark.serial
def test_pass_time_does_not_grow_with_the_job(sqlite_sessions: sessionmaker[Session]) -> None:
    """A GA job of 3,000 trials (it learns from every record): the median pass at its end
    is within 2x of the median at its start, and what a pass reads of the database to
    search is bounded by the plan, not by what the task measured so far."""
    plan_size = 100
    state = SearchState()
    run = run_job(sqlite_sessions, n_trial=3000, plan_size=plan_size, tuner="ga", state=state)
    planning = [p for p in run.planning if p.stats.planned]
    assert len(planning) == 30 and planning[-1].done_before == 2900
    assert state.tasks_read == 1  # the task was read whole once, at its first plan
    assert planning[0].stats.tasks_read == 1
    for p in planning[1:]:
        assert p.stats.tasks_read == 0
        assert p.stats.search_rows <= 2 * plan_size, p
    assert all(p.stats.search_rows == 0 for p in run.idle)
    start = statistics.median(p.seconds for p in planning[1:9])
    end = statistics.median(p.seconds for p in planning[-8:])
    assert end <= 2 * start, (start, end)
    with sqlite_sessions() as session:
        indices = session.scalars(select(TrialRow.config_index)).all()
    assert len(indices) == len(set(indices)) == 3000


def _job(session: Session, tuner: str, n_trial: int = 400, plan_size: int = 8) -> int:
    return jobs.submit(session, JobRequest(target=TARGET, tasks=[CONV], n_trial=n_trial,
                                           plan_size=plan_size, tuner=tuner, verify_top=0))


def _measure_all(sessions: sessionmaker[Session], worker_id: int) -> None:
    with sessions.begin() as session:
        worker = dispatch.get_worker(session, worker_id)
        assert worker is not None
        leased, _ = dispatch.lease(session, SqlQueue(), worker, 10_000, 600)
        dispatch.report(session, worker, [
            (t.trial_id, fake_result(int(t.config["index"])), None) for t in leased])


def test_another_planner_is_noticed(sessions: sessionmaker[Session]) -> None:
    """Two schedulers (two server processes; one plans at a time) take turns on a GA
    job: each notices the other's plans by the task's planned count and reads the task
    again, so no config is planned twice and each learns every record."""
    with sessions.begin() as session:
        job_id = _job(session, "ga")
        worker_id = dispatch.register(session, "w", TARGET, DeviceLimits(), None, 600).id
    states = [SearchState(), SearchState()]
    for turn in range(12):
        state = states[turn % 2]
        with sessions.begin() as session:
            stats, new, _ = plan_once(session, SqlQueue(), state)
        # the other planned since this one last did (or this one never did)
        assert stats.planned == 8 and stats.tasks_read == 1, turn
        _measure_all(sessions, worker_id)
    with sessions() as session:
        [task] = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id))
        indices = session.scalars(select(TrialRow.config_index)).all()
    assert task.status == "running" and task.trials_planned == 96
    assert len(set(indices)) == 96
    assert [s.tasks[task.id].planned for s in states] == [88, 96]
    # the one that planned last learnt every record but those of its own plan
    last = states[1].tasks[task.id]
    assert last.measured is not None and len(last.measured) == 88
    assert len(last.pending) == 8


def test_a_pass_that_did_not_commit_is_forgotten(sessions: sessionmaker[Session]) -> None:
    """A pass whose transaction rolls back leaves the scheduler holding configs the
    database never stored; should another planner then store as many others, the counts
    agree again. The state is dropped anyway (no commit confirmed it) and read again."""
    with sessions.begin() as session:
        job_id = _job(session, "random")
    state = SearchState()
    with sessions() as session:
        session.begin()
        assert plan_once(session, SqlQueue(), state)[0].planned == 8
        session.rollback()
    with sessions.begin() as session:  # another planner stores 8 other configs
        [task] = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id))
        session.execute(insert(TrialRow), [
            {"task_id": task.id, "queue": "cuda -model=h200", "config_index": index,
             "config": get_template(CONV.template).space(CONV).get(index).to_json(),
             "status": "done", "attempts": 1} for index in range(1000, 1008)])
        session.execute(update(TaskRow).where(TaskRow.id == task.id).values(trials_planned=8))
    with sessions.begin() as session:
        stats, _, _ = plan_once(session, SqlQueue(), state)
    assert stats.planned == 8 and stats.tasks_read == 1
    with sessions() as session:
        stored = np.array(session.scalars(select(TrialRow.config_index)).all())
    assert len(set(stored.tolist())) == 16
    assert state.tasks[task.id].visited.contains(stored).all()


def test_grid_plans_again_what_a_pass_that_did_not_commit_planned(
        sessions: sessionmaker[Session]) -> None:
    """Grid's cursor moves past what it proposes: a pass that rolls back must take the
    tuner with the task's state, or the next plan skips the configs never stored (on a
    small space the task would end as exhausted with configs never measured)."""
    with sessions.begin() as session:
        _job(session, "grid")
    state = SearchState()
    with sessions() as session:
        session.begin()
        assert plan_once(session, SqlQueue(), state)[0].planned == 8
        rolled_back = sorted(session.scalars(select(TrialRow.config_index)).all())
        session.rollback()
    with sessions.begin() as session:
        assert plan_once(session, SqlQueue(), state)[0].planned == 8
    with sessions() as session:
        stored = sorted(session.scalars(select(TrialRow.config_index)).all())
    assert stored == rolled_back


def _tasks_job(session: Session, n_tasks: int) -> tuple[int, int]:
    """A random-search job of ``n_tasks`` tasks and a worker for it."""
    job_id = jobs.submit(session, JobRequest(target=TARGET, tasks=[CONV] * n_tasks,
                                             n_trial=400, plan_size=8, tuner="random",
                                             verify_top=0))
    return job_id, dispatch.register(session, "w", TARGET, DeviceLimits(), None, 600).id


def test_task_states_have_a_cap_of_their_own(sqlite_sessions: sessionmaker[Session],
                                              caplog: pytest.LogCaptureFixture) -> None:
    """More running tasks than tuners kept: each task's state is still kept between
    passes (the tasks are visited in the same order every pass, so a shared LRU cap
    would find none); a state dropped for want of room is logged; the states (and
    tuners) of tasks that stopped running are dropped at the end of a pass."""
    sessions = sqlite_sessions
    with sessions.begin() as session:
        job_id, worker_id = _tasks_job(session, 3)
    state = SearchState(max_tuners=2)
    for turn in range(3):
        with sessions.begin() as session:
            stats, _, _ = plan_once(session, SqlQueue(), state)
        assert stats.planned == 24 and stats.tasks_read == (3 if turn == 0 else 0), turn
        _measure_all(sessions, worker_id)
    assert len(state.tasks) == 3 and len(state.tuners) == 2

    tight = SearchState(max_tasks=2)
    with caplog.at_level("WARNING", logger="tuner.scheduler"):
        for _ in range(2):
            with sessions.begin() as session:
                assert plan_once(session, SqlQueue(), tight)[0].tasks_read == 3
            _measure_all(sessions, worker_id)
    assert len(tight.tasks) == 2
    assert [r for r in caplog.records if "max_tasks=2" in r.getMessage()]

    with sessions.begin() as session:
        jobs.cancel(session, job_id)
    with sessions.begin() as session:
        plan_once(session, SqlQueue(), state)
    assert not state.tasks and not state.tuners


def test_a_tuner_that_slips_does_not_fail_its_task(sessions: sessionmaker[Session],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuner that proposes a config twice, or one already planned, would break the
    trials' unique key and fail the task: the plan is cleared of both before the
    INSERT, in the order proposed."""
    propose = GridTuner.propose

    def slipping(self: GridTuner, n: int, visited: Visited, measured: Measured) -> np.ndarray:
        got = propose(self, n, visited, measured)
        planned = visited.contains(np.arange(1_000_000))
        again = np.flatnonzero(planned)[:1]
        return np.concatenate([got[:2], got[:1], again, got[2:], got[-1:]])
    monkeypatch.setattr(GridTuner, "propose", slipping)
    with sessions.begin() as session:
        job_id = _job(session, "grid")
        worker_id = dispatch.register(session, "w", TARGET, DeviceLimits(), None, 600).id
    state = SearchState()
    for _ in range(3):
        with sessions.begin() as session:
            stats, new, _ = plan_once(session, SqlQueue(), state)
        assert stats.planned == 8
        _measure_all(sessions, worker_id)
    with sessions() as session:
        [task] = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id))
        stored = session.scalars(select(TrialRow.config_index).order_by(TrialRow.id)).all()
    assert task.status == "running" and task.trials_planned == 24
    template = get_template(CONV.template)
    every = np.arange(10_000)
    grid = every[template.valid_mask(CONV, every, DeviceLimits())].tolist()
    assert stored == [template.default_config(CONV).index] + grid[:23]


def test_a_pass_listens_for_its_commit_once(sqlite_sessions: sessionmaker[Session]) -> None:
    """Passes run again and again in one session leave one commit listener on it, not
    one per pass; and a commit still confirms the pass that ran in it."""
    state = SearchState()
    with sqlite_sessions.begin() as session:
        _job(session, "random")
    with sqlite_sessions() as session:
        for _ in range(5):
            session.begin()
            plan_once(session, SqlQueue(), state)
            session.commit()
            assert not state.unconfirmed
        assert len(session.dispatch.after_commit) == 1


def _index_entries_read(session: Session) -> int:
    """Index entries a bitmap scan of the outstanding-trials count reads (live or dead
    but not yet marked dead), from its plan's actual rows."""
    session.execute(text("SET LOCAL enable_seqscan = off"))
    session.execute(text("SET LOCAL enable_indexscan = off"))
    [plan] = session.execute(text(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT task_id, count(*) FROM trials "
        "WHERE status IN ('queued', 'leased') GROUP BY task_id")).scalar_one()

    def read(node: dict[str, Any]) -> int:
        own = node["Actual Rows"] if node["Node Type"] == "Bitmap Index Scan" else 0
        return own + sum(read(child) for child in node.get("Plans", []))

    return read(plan["Plan"])


@pytest.mark.serial  # beside another worker it read 700 entries (alone: <= 10)
def test_the_outstanding_count_does_not_walk_dead_entries(tmp_path: Path) -> None:
    """PostgreSQL without a vacuum: each trial leaves dead entries for its queued and
    leased versions in the status indexes. The pass's count of outstanding trials marks
    those it meets dead (an index scan), so the next count reads only the live ones; a
    bitmap scan alone would read every trial's dead entries every pass, growing with the
    job's age."""
    with migrated_sessions("postgresql", tmp_path) as sessions:
        run_job(sessions, 1_500, 100)  # a pass after every plan's reports
        with sessions.begin() as session:
            assert scheduler._outstanding(session) == {}  # the job is done
        with sessions.begin() as session:
            # not the 3,000 dead entries of the 1,500 trials' queued and leased versions
            assert _index_entries_read(session) <= 10
            assert session.scalar(text("SHOW enable_bitmapscan")) == "on"  # as it was

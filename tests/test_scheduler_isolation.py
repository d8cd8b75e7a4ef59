"""No one row stops the scheduler: corrupt jobs, tasks and workers stored straight in the
database (as an old server, a bad import or a hand edit leaves them) are failed or
skipped with a reason while good jobs are planned, on SQLite and PostgreSQL. A task whose
trials all failed ends failed with its error counts, and so does a job whose tasks all
failed; a job no live worker serves says so. With Redis, the database is the truth:
trials stored while Redis was down, and tickets a lease read but never committed, are
queued again by the resync."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import (
    BACKENDS,
    REDIS_UNREACHABLE,
    REDIS_URL,
    free_port,
    migrated_sessions,
)
from sqlalchemy import insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from schemas import (
    Config,
    DeviceLimits,
    MeasureErrorNo,
    MeasureInput,
    MeasureResult,
    Record,
    Target,
    Workload,
)
from schemas.api import JobRequest
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow
from tuner_server.queue.base import DispatchQueue
from tuner_server.queue.sql import SqlQueue
from tuner_server.services import jobs, scheduler
from tuner_server.services.records import record_row
from tuner_server.services.scheduler import Scheduler, SearchState, plan_once

TARGET = "opencl -model=pocl-cpu"
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs
needs_redis = pytest.mark.skipif(REDIS_UNREACHABLE is not None, reason=str(REDIS_UNREACHABLE))


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """Sessions on a fresh migrated database of each backend."""
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


@pytest.fixture
def sqlite_sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions("sqlite", tmp_path) as made:
        yield made


def _submit(session: Session, n_trial: int = 4, plan_size: int = 4,
            tasks: int = 1) -> int:
    return jobs.submit(session, JobRequest(
        target=Target.parse(TARGET), tasks=[Workload(template=DENSE, args=DENSE_ARGS)] * tasks,
        n_trial=n_trial, plan_size=plan_size, verify_top=0))  # tests/test_verify.py's


def _worker(session: Session, target: str = TARGET, last_seen: float | None = None,
            stopped_at: float | None = None) -> int:
    row = WorkerRow(name=f"w-{secrets.token_hex(3)}", target=target,
                    limits=DeviceLimits().model_dump(),
                    last_seen=time.time() if last_seen is None else last_seen,
                    stopped_at=stopped_at)
    session.add(row)
    session.flush()
    return row.id


def _tasks(session: Session, job_id: int) -> list[TaskRow]:
    return list(session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)
                                .order_by(TaskRow.id)))


def _trials(session: Session, task_id: int) -> list[TrialRow]:
    return list(session.scalars(select(TrialRow).where(TrialRow.task_id == task_id)
                                .order_by(TrialRow.id)))


def test_corrupt_rows_fail_alone_and_good_jobs_are_planned(
        sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    """A job whose stored target no longer parses, a worker with a garbage target, a task
    whose args do not parse and one whose template is unknown, next to good work: the
    good trials are planned, the bad rows are failed with their reasons, every pass."""
    with sessions.begin() as session:
        good = _submit(session)
        mixed = _submit(session, tasks=3)  # a good task and two corrupted below
        _worker(session)
        _worker(session, target="garbage!! not a target")
        bad_job = JobRow(target="opencl -model=a b", status="queued", tuner="random",
                         n_trial=4, early_stopping=None, plan_size=4, measure={})
        session.add(bad_job)
        session.flush()
        session.add(TaskRow(job_id=bad_job.id, template=DENSE, args=DENSE_ARGS,
                            status="queued", trials_planned=0, trials_done=0))
        _ok, bad_args, bad_template = _tasks(session, mixed)
        bad_args.args = [["TENSOR", "not a shape", "float32"]]
        bad_template.template = "no_such_template.gpu"
        bad_job_id = bad_job.id
    run = Scheduler(sessions, SqlQueue())
    with caplog.at_level(logging.WARNING, logger="tuner"):
        first = run.run_pass()
        second = run.run_pass()
    assert first.planned == 8 and second.planned == 0
    with sessions() as session:
        [task] = _tasks(session, good)
        assert task.status == "running" and len(_trials(session, task.id)) == 4
        ok, bad_args, bad_template = _tasks(session, mixed)
        assert ok.status == "running" and len(_trials(session, ok.id)) == 4
        assert bad_args.status == "failed" and bad_args.error
        assert bad_template.status == "failed"
        assert "unknown template 'no_such_template.gpu'" in (bad_template.error or "")
        job = session.get(JobRow, mixed)
        assert job is not None and job.status == "running"  # its good task goes on
        job = session.get(JobRow, bad_job_id)
        assert job is not None and job.status == "failed"
        assert "job target 'opencl -model=a b' does not parse" in (job.error or "")
        [orphan] = _tasks(session, bad_job_id)
        assert orphan.status == "failed" and orphan.error == job.error
        assert not _trials(session, orphan.id) and not _trials(session, bad_args.id)
    messages = [r.getMessage() for r in caplog.records]
    assert any("garbage!! not a target" in m for m in messages), messages
    # each bad task is logged once, when it fails, not on every pass
    assert sum(f"task {bad_args.id} failed" in m for m in messages) == 1


def test_a_failing_reclaim_does_not_stop_planning(
        sqlite_sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    with sqlite_sessions.begin() as session:
        job_id = _submit(session)

    def broken(_session: Session) -> Any:
        raise RuntimeError("reclaim broke")

    monkeypatch.setattr(scheduler.dispatch, "reclaim_expired", broken)
    stats = Scheduler(sqlite_sessions, SqlQueue()).run_pass()
    assert (stats.planned, stats.requeued, stats.given_up) == (4, 0, 0)
    with sqlite_sessions() as session:
        assert session.get(JobRow, job_id).status == "running"  # type: ignore[union-attr]


def test_a_reason_with_nul_and_surrogates_is_stored_and_the_pass_goes_on(
        sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL refuses a NUL in TEXT: a task whose error says one must still end
    failed (the message cleaned), and the job beside it be planned."""
    with sessions.begin() as session:
        bad, good = _submit(session), _submit(session)
    real = scheduler._plan_task

    def plan(session: Session, job: JobRow, task: TaskRow, *rest: Any) -> Any:
        if job.id == bad:
            raise ValueError("bad \x00 byte and \ud800 surrogate")
        return real(session, job, task, *rest)

    monkeypatch.setattr(scheduler, "_plan_task", plan)
    stats = Scheduler(sessions, SqlQueue()).run_pass()
    assert stats.planned == 4
    with sessions() as session:
        [task] = session.scalars(select(TaskRow).where(TaskRow.job_id == bad))
        assert (task.status, task.error) == ("failed", "bad byte and surrogate")
        assert session.get(JobRow, good).status == "running"  # type: ignore[union-attr]


def test_a_database_outage_fails_the_pass_not_the_tasks(
        sqlite_sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """The database failing is no task's fault: the pass fails (and is retried), no task
    is marked failed."""
    with sqlite_sessions.begin() as session:
        job_id = _submit(session)

    def down(*_args: Any) -> Any:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    monkeypatch.setattr(scheduler, "_plan_task", down)
    with pytest.raises(OperationalError):
        Scheduler(sqlite_sessions, SqlQueue()).run_pass()
    monkeypatch.undo()
    with sqlite_sessions() as session:
        assert [t.status for t in _tasks(session, job_id)] == ["queued"]
    assert Scheduler(sqlite_sessions, SqlQueue()).run_pass().planned == 4


def _measure(session: Session, trials: list[TrialRow], errors: list[int]) -> None:
    """Store a result for each trial as a worker's report would: one record, the trial
    done, the task's count up."""
    for trial, error_no in zip(trials, errors, strict=True):
        task = session.get(TaskRow, trial.task_id)
        assert task is not None
        result = (MeasureResult(costs=(1e-5,), error_no=MeasureErrorNo.NO_ERROR,
                                all_cost=0.1, timestamp=time.time()) if error_no == 0
                  else MeasureResult.failure(MeasureErrorNo(error_no), "broken"))
        record = Record.from_measure(MeasureInput(
            target=Target.parse(TARGET), workload=Workload(template=task.template,
                                                           args=task.args),
            config=Config.model_validate(trial.config)), result)
        session.execute(insert(RecordRow), [dict(record_row(record), trial_id=trial.id)])
        trial.status, trial.error_no = "done", error_no
        task.trials_done += 1
        if error_no == 0:
            task.best_cost, task.best_trial = 1e-5, task.trials_done


def test_tasks_and_jobs_whose_trials_all_failed_end_failed_with_counts(
        sessions: sessionmaker[Session]) -> None:
    """A task with no successful trial ends failed with its error counts; a job ends
    failed when all its tasks failed (its error the same counts), else done."""
    with sessions.begin() as session:
        half = _submit(session, n_trial=3, plan_size=3, tasks=2)
        lost = _submit(session, n_trial=3, plan_size=3, tasks=2)
        single = _submit(session, n_trial=3, plan_size=3)
    run = Scheduler(sessions, SqlQueue())
    run.run_pass()
    plan = {half: [[4, 4, 7], [4, 0, 7]], lost: [[4, 4, 7], [7, 8, 4]], single: [[5, 5, 5]]}
    with sessions.begin() as session:
        for job_id, per_task in plan.items():
            for task, errors in zip(_tasks(session, job_id), per_task, strict=True):
                _measure(session, _trials(session, task.id), errors)
    run.run_pass()
    with sessions() as session:
        first, second = _tasks(session, half)
        assert (first.status, first.error) == (
            "failed", ("all 3 trials failed: 2 x error 4 (RUNTIME_DEVICE), "
                      "1 x error 7 (RUN_TIMEOUT)"))
        assert (second.status, second.error) == ("done", None)
        job = session.get(JobRow, half)
        assert job is not None and (job.status, job.error) == ("done", None)
        job = session.get(JobRow, lost)
        assert job is not None and (job.status, job.error) == (
            "failed", ("all 2 tasks failed: all 6 trials failed: 3 x error 4 "
                      "(RUNTIME_DEVICE), 2 x error 7 (RUN_TIMEOUT), 1 x error 8 (UNKNOWN_ERROR)"))
        job = session.get(JobRow, single)
        assert job is not None and (job.status, job.error) == (
            "failed", "all 3 trials failed: 3 x error 5 (WRONG_ANSWER)")
        shown = jobs.describe(session, half, lease_s=120.0)
        assert shown is not None
        assert [t.error for t in shown.tasks] == [first.error, None]
        assert jobs.describe(session, single, lease_s=120.0).error == job.error  # type: ignore[union-attr]


def test_a_job_no_live_worker_serves_says_so(sessions: sessionmaker[Session]) -> None:
    """waiting_for_worker and a note while no worker seen within the lease, and not
    deregistered, serves the job's target; a worker whose target does not parse serves
    nothing; a finished job waits for nobody."""
    now = time.time()
    with sessions.begin() as session:
        job_id = _submit(session)
        _worker(session, target="garbage!! not a target")
        _worker(session, last_seen=now - 300)  # lost
        _worker(session, stopped_at=now)  # deregistered
        _worker(session, target="cuda -model=h200")  # another device

    def shown(lease_s: float = 120.0) -> dict[str, Any]:
        with sessions() as session:
            listed = {j.id: j.model_dump(mode="json")
                      for j in jobs.list_jobs(session, lease_s=lease_s)}
            view = jobs.describe(session, job_id, lease_s=lease_s)
            assert view is not None
            item = view.model_dump(mode="json")
            assert {k: listed[job_id][k] for k in ("waiting_for_worker", "note")} == \
                {k: item[k] for k in ("waiting_for_worker", "note")}
            return item

    item = shown()
    assert item["waiting_for_worker"] is True
    assert item["note"] == (f"no live worker serves '{TARGET}'; start one: tuner worker "
                            "--server <this server> --token TOKEN")
    assert shown(lease_s=600)["waiting_for_worker"] is False  # the lost one counts again
    with sessions.begin() as session:
        _worker(session, target=f"{TARGET} -arch=x")  # serves "opencl -model=pocl-cpu"
    item = shown()
    assert (item["waiting_for_worker"], item["note"]) == (False, None)
    with sessions.begin() as session:
        jobs.cancel(session, job_id)
        for worker in session.scalars(select(WorkerRow)):
            worker.stopped_at = now
    assert shown()["waiting_for_worker"] is False


# ------------------------------------------------------------------------------------
# Redis: a hint; the trials table is the truth.

@pytest.fixture
def redis_prefix() -> Iterator[str]:
    if REDIS_UNREACHABLE:
        pytest.skip(REDIS_UNREACHABLE)
    import redis

    prefix = f"tunertest-{secrets.token_hex(6)}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _lease(sessions: sessionmaker[Session], queue: DispatchQueue, worker_id: int,
           commit: bool = True) -> list[int]:
    with sessions() as session:
        trials = queue.lease(session, worker_id, [TARGET], 100, 120.0, time.time())
        ids = [t.id for t in trials]
        if commit:
            session.commit()
        else:
            session.rollback()
    return ids


def _planned_without_tickets(sessions: sessionmaker[Session]) -> tuple[int, list[int]]:
    """A job planned and committed, its trials never pushed (Redis was down)."""
    with sessions.begin() as session:
        _submit(session)
        worker_id = _worker(session)
    with sessions.begin() as session:
        _stats, new, _requeued = plan_once(session, SqlQueue(), SearchState())
        ids = sorted(t.id for t in new)
    assert len(ids) == 4
    return worker_id, ids


@needs_redis
def test_trials_stored_without_a_ticket_get_one_and_are_leased(
        sqlite_sessions: sessionmaker[Session], redis_prefix: str) -> None:
    from tuner_server.queue.redis import RedisQueue

    queue = RedisQueue(REDIS_URL, redis_prefix)
    worker_id, ids = _planned_without_tickets(sqlite_sessions)
    assert _lease(sqlite_sessions, queue, worker_id) == []  # no ticket: invisible
    with sqlite_sessions.begin() as session:
        assert queue.resync(session, time.time()) == 4
    with sqlite_sessions.begin() as session:
        assert queue.resync(session, time.time()) == 0  # every one has a live ticket now
    assert _lease(sqlite_sessions, queue, worker_id) == ids


@needs_redis
def test_a_ticket_an_uncommitted_lease_took_comes_back_after_the_grace(
        sqlite_sessions: sessionmaker[Session], redis_prefix: str) -> None:
    """The server killed between XREADGROUP and COMMIT: the ticket sits in the group's
    pending list while its trial is queued; past the grace the resync queues it again,
    not a full lease (120 s) later."""
    from tuner_server.queue.redis import RedisQueue

    queue = RedisQueue(REDIS_URL, redis_prefix, stale_read_s=1.0)
    worker_id, ids = _planned_without_tickets(sqlite_sessions)
    with sqlite_sessions.begin() as session:
        assert queue.resync(session, time.time()) == 4
    assert _lease(sqlite_sessions, queue, worker_id, commit=False) == ids  # never committed
    assert _lease(sqlite_sessions, queue, worker_id) == []
    with sqlite_sessions.begin() as session:
        assert queue.resync(session, time.time()) == 0  # within the grace: a lease in flight
    time.sleep(1.2)
    with sqlite_sessions.begin() as session:
        assert queue.resync(session, time.time()) == 4
    assert _lease(sqlite_sessions, queue, worker_id) == ids
    with sqlite_sessions.begin() as session:  # leased trials are not the resync's business
        assert queue.resync(session, time.time()) == 0


@needs_redis
def test_redis_down_at_push_does_not_fail_the_pass_and_resync_queues_later(
        sqlite_sessions: sessionmaker[Session], redis_prefix: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A push to a Redis that does not answer is logged, the pass stands; a scheduler
    started later (a restart, Redis back) queues the trials at its first pass."""
    from tuner_server.queue.redis import RedisQueue

    with sqlite_sessions.begin() as session:
        _submit(session)
        worker_id = _worker(session)
    down = RedisQueue(f"redis://127.0.0.1:{free_port()}/0", redis_prefix)
    with caplog.at_level(logging.WARNING, logger="tuner"):
        stats = Scheduler(sqlite_sessions, down).run_pass()
    assert stats.planned == 4 and stats.resynced == 0
    assert any("resync repairs" in r.getMessage() for r in caplog.records), caplog.text
    assert any("queue resync failed" in r.getMessage() for r in caplog.records), caplog.text
    queue = RedisQueue(REDIS_URL, redis_prefix)
    stats = Scheduler(sqlite_sessions, queue).run_pass()
    assert stats.resynced == 4
    assert len(_lease(sqlite_sessions, queue, worker_id)) == 4


@needs_redis
def test_redis_that_lost_its_data_is_refilled_by_the_resync(
        sqlite_sessions: sessionmaker[Session], redis_prefix: str) -> None:
    """Redis restarted empty (its streams, groups and ticket map gone) under a running
    server: leases answer empty instead of failing, and the resync queues every queued
    trial again."""
    import redis

    from tuner_server.queue.redis import RedisQueue

    queue = RedisQueue(REDIS_URL, redis_prefix)
    with sqlite_sessions.begin() as session:
        _submit(session, n_trial=8, plan_size=8)
        worker_id = _worker(session)
    Scheduler(sqlite_sessions, queue).run_pass()
    assert len(_lease(sqlite_sessions, queue, worker_id)) == 8  # all had tickets
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(*client.scan_iter(match=f"{redis_prefix}:*"))
    with sqlite_sessions.begin() as session:  # the leases are given back, as on expiry
        for trial in session.scalars(select(TrialRow)):
            trial.status, trial.worker_id, trial.lease_deadline = "queued", None, None
    assert _lease(sqlite_sessions, queue, worker_id) == []  # the group is made again
    with sqlite_sessions.begin() as session:
        assert queue.resync(session, time.time()) == 8
    assert len(_lease(sqlite_sessions, queue, worker_id)) == 8


def test_no_pass_runs_while_a_kernel_is_timed_beside_the_scheduler(
        sqlite_sessions: sessionmaker[Session]) -> None:
    """The embedded fleet's worker holds ``quiet`` while it times a kernel on the CPU
    the server shares: the scheduler's background passes wait for it, then plan."""
    with sqlite_sessions.begin() as session:
        job_id = _submit(session)
        _worker(session)
    quiet = threading.Lock()
    passes: list[float] = []
    run = Scheduler(sqlite_sessions, SqlQueue(), interval=0.05,
                    on_pass=lambda _stats: passes.append(time.time()), quiet=quiet)
    quiet.acquire()  # a kernel is being timed
    try:
        run.start()
        time.sleep(0.5)
        assert passes == []
    finally:
        released = time.time()
        quiet.release()
    try:
        deadline = time.time() + 10
        while not passes and time.time() < deadline:
            time.sleep(0.02)
    finally:
        run.stop()
    assert passes and passes[0] >= released
    with sqlite_sessions() as session:
        [task] = _tasks(session, job_id)
        assert len(_trials(session, task.id)) == 4

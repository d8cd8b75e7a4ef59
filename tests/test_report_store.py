"""What a results call leaves behind (``dispatch.report``, which writes lines from their
parts and updates rows with a statement per error number and one per task): each
record's line is the line a Record of it writes, each trial is done with its result's
error number, and each task's counters are what trial-by-trial updates gave (the first
of equal costs is the best)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from scheduler_sim import CONV, TARGET, fake_result, run_job
from server_fixtures import BACKENDS, migrated_sessions
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from schemas import DeviceLimits, Record
from schemas.api import JobRequest, TrialStatus
from tuner_server.db.models import RecordRow, TaskRow, TrialRow, record_hash
from tuner_server.queue.sql import SqlQueue
from tuner_server.services import dispatch, jobs
from tuner_server.services.scheduler import SearchState, plan_once


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


def test_reported_rows(sessions: sessionmaker[Session]) -> None:
    run_job(sessions, n_trial=150, plan_size=40, tasks=2)
    with sessions() as session:
        records = session.scalars(select(RecordRow).order_by(RecordRow.id)).all()
        trials = {t.id: t for t in session.scalars(select(TrialRow))}
        tasks = session.scalars(select(TaskRow).order_by(TaskRow.id)).all()
    assert len(records) == 300
    assert {r.error_no for r in records} > {0}  # a tenth of the configs fail
    for row in records:
        record = Record.from_json(row.line)
        assert record.to_json() == row.line
        # the columns beside the line (PostgreSQL reads them from one JSON string)
        assert (row.line_hash, row.target, row.target_kind, row.template, row.source) == (
            record_hash(row.line), str(record.target), record.target.kind,
            record.workload.template, "measured")
        assert row.created_at is not None and row.timestamp == record.result.timestamp
        assert row.mean_cost == record.result.mean_cost  # floats as they were sent
        trial = trials[row.trial_id]
        assert (trial.status, trial.error_no, trial.lease_deadline) == (
            TrialStatus.DONE, row.error_no, None)
        assert row.line["config"]["index"] == trial.config_index
    for task in tasks:
        mine = [r for r in records if trials[r.trial_id].task_id == task.id]
        assert task.trials_done == len(mine) == 150
        costs = [r.mean_cost if r.error_no == 0 else math.inf for r in mine]
        best = min(costs)
        assert task.best_cost == best
        assert task.best_trial == costs.index(best) + 1


def test_the_postgresql_insert_names_every_column_but_the_id() -> None:
    """The json_to_recordset INSERT lists its columns itself: one added to the table must be added
    there too (else PostgreSQL stores it NULL where SQLite stores its default)."""
    from tuner_server.services.records import _TRIAL_COLUMNS

    assert sorted(name for name, _ in _TRIAL_COLUMNS) == sorted(
        c.name for c in RecordRow.__table__.columns if c.name != "id")


def test_a_trial_whose_record_was_stored_first_is_a_duplicate(
        sessions: sessionmaker[Session]) -> None:
    """A report racing a store of one of its trials (its record committed by another
    transaction while the trial still reads as leased here): that trial is a duplicate,
    left as the other store left it, and the rest are stored and counted once."""
    queue = SqlQueue()
    with sessions.begin() as session:
        jobs.submit(session, JobRequest(target=TARGET, tasks=[CONV], n_trial=8, plan_size=8,
                                        tuner="random", verify_top=0))
        worker_id = dispatch.register(session, "sim", TARGET, DeviceLimits(), None,
                                      lease_s=600).id
    with sessions.begin() as session:
        plan_once(session, queue, SearchState())
    with sessions.begin() as session:
        worker = dispatch.get_worker(session, worker_id)
        assert worker is not None
        leased, _failed = dispatch.lease(session, queue, worker, 8, 600)
    assert len(leased) == 8
    first = leased[0].trial_id
    with sessions.begin() as session:  # the other store: its record and its counters
        trial = session.get(TrialRow, first)
        assert trial is not None
        assert dispatch._store(session, [(trial, fake_result(0), str(TARGET), None)]) == {first}
        trial.status, trial.worker_id = TrialStatus.LEASED, worker_id  # as this report reads it
    with sessions.begin() as session:
        worker = dispatch.seen_worker(session, worker_id)
        assert worker is not None
        counts = dispatch.report(session, worker, [
            (t.trial_id, fake_result(int(t.config["index"])), None) for t in leased])
    assert (counts.accepted, counts.duplicates) == (7, 1)
    with sessions() as session:
        records = session.scalars(select(RecordRow)).all()
        task = session.scalars(select(TaskRow)).one()
    assert sorted(r.trial_id for r in records) == sorted(t.trial_id for t in leased)
    assert task.trials_done == 8
    # the other store's record is the one kept (only the report's name the worker)
    assert [r.trial_id for r in records if "worker" not in r.line.get("info", {})] == [first]
    assert trial_status(sessions, first) == TrialStatus.LEASED  # the report left it alone


def trial_status(sessions: sessionmaker[Session], trial_id: int) -> str:
    with sessions() as session:
        trial = session.get(TrialRow, trial_id)
        assert trial is not None
        return str(trial.status)

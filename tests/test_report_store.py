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
from scheduler_sim import run_job
from server_fixtures import BACKENDS, migrated_sessions
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from schemas import Record
from schemas.api import TrialStatus
from tuner_server.db.models import RecordRow, TaskRow, TrialRow


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
        assert Record.from_json(row.line).to_json() == row.line
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

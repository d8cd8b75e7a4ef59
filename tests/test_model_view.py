"""The model view kept per job between calls (tuner_server.services.model_view.ModelViews)
against a full read of the job's results: the same view after results arrive in batches,
after a result commits below the highest id already read (a rebuild), after a task joins
the job (a rebuild), and once the job ends."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import BACKENDS, migrated_sessions
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from compiler.templates import get_template
from schemas import Workload
from schemas.api import ModelView
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow
from tuner_server.services.model_view import ModelViews, model_view

TARGET = "opencl -model=pocl-cpu"
DENSE = "dense_small_batch.gpu"
ARGS: list[list[Any]] = [
    [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"], None, "float32"],
    [["TENSOR", [1, 128], "float32"], ["TENSOR", [64, 128], "float32"], None, "float32"],
    [["TENSOR", [1, 512], "float32"], ["TENSOR", [32, 512], "float32"], None, "float32"],
]
LAYERS = [["fc1", "fc3"], ["fc2"], ["fc4"]]
START = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
NOW = START.timestamp() + 3600.0


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


class Job:
    """A model's job in the database, its results written by explicit record id (so a test
    can store a lower id after a higher one), each with a reproducible cost."""

    def __init__(self, sessions: sessionmaker[Session], n_tasks: int) -> None:
        self.sessions = sessions
        self.rng = random.Random(19)
        self.trials: dict[int, int] = {}  # task id -> trials made
        with sessions.begin() as session:
            job = JobRow(target=TARGET, status="running", tuner="random", n_trial=100,
                         plan_size=8, measure={}, model="net.onnx", created_at=START)
            session.add(job)
            session.flush()
            self.id = int(job.id)
        self.tasks: list[int] = []
        for k in range(n_tasks):
            self.add_task(k)

    def add_task(self, k: int) -> int:
        with self.sessions.begin() as session:
            task = TaskRow(job_id=self.id, template=DENSE, args=ARGS[k], status="running",
                           trials_planned=100, trials_done=0, layers=LAYERS[k])
            session.add(task)
            session.flush()
            self.tasks.append(int(task.id))
            self.trials[int(task.id)] = 0
            return int(task.id)

    def store(self, record_ids: list[int], tasks: list[int] | None = None,
              cost: float | None = None, verify: bool = False) -> None:
        """One transaction: a trial and its result per id, round-robin over ``tasks`` (all
        of the job's); each task's first its default config, every 7th a failure. Its
        tasks' ``trials_done`` raised as a report does (not for a ``verify`` trial's)."""
        tasks = tasks or self.tasks
        with self.sessions.begin() as session:
            for n, record_id in enumerate(record_ids):
                task_id = tasks[n % len(tasks)]
                k = self.tasks.index(task_id)
                i = self.trials[task_id]
                self.trials[task_id] += not verify
                default = get_template(DENSE).default_config(
                    Workload(template=DENSE, args=ARGS[k])).index
                index = default if i == 0 else default + i
                failed = i % 7 == 6
                value = cost or 1e-5 * (1 + k) * (1 + self.rng.random())
                trial_id = session.execute(insert(TrialRow).values(
                    task_id=task_id, queue=TARGET, config={"index": index}, config_index=index,
                    status="done", attempts=1, error_no=4 if failed else 0,
                    verify_round=int(verify))).inserted_primary_key[0]
                line = {"input": [TARGET, DENSE, ARGS[k], {}],
                        "config": {"index": index, "code_hash": None, "entity": []},
                        "result": [[1e9 if failed else value], 4 if failed else 0, 0.1,
                                   float(record_id)],
                        "version": 0.2, "tvm_version": "0.19.dev0"}
                session.execute(insert(RecordRow).values(
                    id=record_id, target=TARGET, target_kind="opencl", target_model="pocl-cpu",
                    target_keys=",opencl,gpu,", template=DENSE,
                    workload_key=Workload(template=DENSE, args=ARGS[k]).key, line=line,
                    mean_cost=1e9 if failed else value, error_no=4 if failed else 0,
                    timestamp=float(record_id), trial_id=trial_id,
                    created_at=START + timedelta(seconds=record_id)))
            for task_id in tasks:
                session.execute(update(TaskRow).where(TaskRow.id == task_id)
                                .values(trials_done=self.trials[task_id]))

    def end(self) -> None:
        with self.sessions.begin() as session:
            session.execute(update(JobRow).where(JobRow.id == self.id).values(status="done"))
            session.execute(update(TaskRow).where(TaskRow.job_id == self.id)
                            .values(status="done"))


def compare(sessions: sessionmaker[Session], views: ModelViews, job_id: int) -> ModelView:
    """The kept view, checked equal to a full read of the job's results; returns it."""
    with sessions() as session:
        kept = model_view(session, job_id, now=NOW, views=views)
    with sessions() as session:
        full = model_view(session, job_id, now=NOW)
    assert kept is not None and full is not None
    assert kept.model_dump() == full.model_dump()
    return kept


def test_kept_view_equals_a_full_read(sessions: sessionmaker[Session]) -> None:
    """Batches fold in without a rebuild; a result committed below the highest id read,
    and a new task, each rebuild once; every view equals a full read; the job's end."""
    job = Job(sessions, 2)
    views = ModelViews()
    view = compare(sessions, views, job.id)  # no results yet
    assert (view.trials_done, view.curve, views.rebuilds) == (0, [], 1)
    job.store(list(range(10, 40)))
    job.store(list(range(60, 90)))  # ids 40-59 left free: a transaction still open
    view = compare(sessions, views, job.id)
    assert (view.trials_done, views.rebuilds) == (60, 1)  # extended, not rebuilt
    assert view.latency_s is not None and view.default_latency_s is not None
    assert len(view.curve) >= 2 and view.curve[0].trial == 2
    view = compare(sessions, views, job.id)  # nothing new: the count check passes
    assert (view.trials_done, views.rebuilds) == (60, 1)
    # the open transaction commits: ids below the last read, one a new best of task 1
    [first, _] = job.tasks
    best = min(t.best_cost or 1.0 for t in view.tasks if t.id == first)
    job.store([41], tasks=[first], cost=best / 2)
    job.store([42, 43, 44] + list(range(90, 100)))
    view = compare(sessions, views, job.id)
    assert (view.trials_done, views.rebuilds) == (74, 2)
    assert next(t for t in view.tasks if t.id == first).best_cost == pytest.approx(best / 2)
    job.store(list(range(100, 130)))
    job.store([130, 131], verify=True)  # a verification's: in the view, not trials_done
    view = compare(sessions, views, job.id)
    assert (view.trials_done, views.rebuilds) == (106, 2)
    # a task joins the job: no estimate until it works, then one from its first result
    third = job.add_task(2)
    view = compare(sessions, views, job.id)
    assert (view.tasks_measured, view.latency_s, views.rebuilds) == (2, None, 3)
    job.store(list(range(132, 140)), tasks=[third])
    job.store(list(range(140, 170)))
    view = compare(sessions, views, job.id)
    assert (view.trials_done, view.tasks_measured, views.rebuilds) == (144, 3, 3)
    assert view.latency_s is not None and [t.id for t in view.tasks if t.id == third]
    job.end()
    view = compare(sessions, views, job.id)
    assert view.status == "done" and views.rebuilds == 3
    assert view.elapsed_s == pytest.approx(169.0)  # to the last result stored


def test_views_keep_the_most_recently_viewed_jobs(sessions: sessionmaker[Session]) -> None:
    """Beyond ``max_jobs`` the least recently viewed job's fold is dropped (and rebuilt
    when viewed again); an unknown job has no view."""
    a, b = Job(sessions, 1), Job(sessions, 2)
    a.store(list(range(1, 21)))
    b.store(list(range(21, 41)))
    views = ModelViews(max_jobs=1)
    compare(sessions, views, a.id)
    compare(sessions, views, a.id)
    assert views.rebuilds == 1
    compare(sessions, views, b.id)
    compare(sessions, views, a.id)
    assert views.rebuilds == 3
    with sessions() as session:
        assert model_view(session, 999, views=views) is None


def test_a_late_verification_result_is_folded_in(sessions: sessionmaker[Session]) -> None:
    """A verification result (which ``trials_done`` does not count) committed below the
    highest id read rebuilds the fold, so it is in the view: here a new best."""
    job = Job(sessions, 1)
    views = ModelViews()
    job.store(list(range(10, 20)))
    job.store(list(range(30, 39)))  # 19 results: the next is not one of Job's failures
    view = compare(sessions, views, job.id)
    assert (view.trials_done, views.rebuilds) == (19, 1)
    job.store([25], verify=True, cost=1e-9)
    view = compare(sessions, views, job.id)
    assert (view.trials_done, view.tasks[0].best_cost, views.rebuilds) == (20, 1e-9, 2)
    view = compare(sessions, views, job.id)  # folded now: the check passes
    assert views.rebuilds == 2


def test_the_default_is_the_one_the_scheduler_planned(sessions: sessionmaker[Session]) -> None:
    """A task's ``default_index`` (the default planned for its devices' lanes) is the
    default the view prices, not the template's default without device limits; a task
    without one (stored before it was kept) falls back to the latter."""
    job = Job(sessions, 1)
    (task_id,) = job.tasks
    job.store([1, 2])  # the template's default config, then default + 1
    template_default = get_template(DENSE).default_config(
        Workload(template=DENSE, args=ARGS[0])).index
    with sessions() as session:
        costs = {int(i): float(c) for i, c in session.execute(
            select(TrialRow.config_index, RecordRow.mean_cost)
            .join(RecordRow, RecordRow.trial_id == TrialRow.id))}
    assert costs[template_default] != costs[template_default + 1]
    with sessions() as session:
        view = model_view(session, job.id, now=NOW)
    assert view is not None and view.tasks[0].default_cost == costs[template_default]
    with sessions.begin() as session:
        session.execute(update(TaskRow).where(TaskRow.id == task_id)
                        .values(default_index=template_default + 1))
    with sessions() as session:
        view = model_view(session, job.id, now=NOW)
    assert view is not None and view.tasks[0].default_cost == costs[template_default + 1]

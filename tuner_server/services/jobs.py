"""Jobs: submit tasks to tune, follow their progress, cancel them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, null, select, update
from sqlalchemy.orm import Session

from compiler.templates import get_template
from schemas import MeasureErrorNo, Target
from schemas.api import (
    ACTIVE,
    FINAL,
    CurvePoint,
    JobRequest,
    JobStatus,
    JobView,
    TaskStatus,
    TaskView,
    TrialPage,
    TrialPoint,
    TrialStatus,
)
from schemas.measure import FAILED_COST
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow
from tuner_server.queue.base import queue_matches, queue_name
from tuner_server.search import TUNERS
from tuner_server.services.fleet import alive_clause
from tuner_server.services.records import workload_flops

log = logging.getLogger("tuner.jobs")


class JobError(ValueError):
    """A submission that cannot become a job; the message names the field."""


def submit(session: Session, spec: JobRequest) -> int:
    if spec.tuner not in TUNERS:
        raise JobError(f"tuner: unknown tuner {spec.tuner!r}; known: {', '.join(sorted(TUNERS))}")
    for i, workload in enumerate(spec.tasks):
        try:
            get_template(workload.template).space(workload)
        except (KeyError, ValueError) as err:
            raise JobError(f"tasks[{i}]: {err}") from None
    job = JobRow(target=str(spec.target), status=JobStatus.QUEUED, tuner=spec.tuner,
                 n_trial=spec.n_trial, early_stopping=spec.early_stopping,
                 plan_size=spec.plan_size, measure=spec.measure.model_dump(),
                 model=spec.model, verify_top=spec.verify_top)
    session.add(job)
    session.flush()
    for i, workload in enumerate(spec.tasks):
        session.add(TaskRow(job_id=job.id, template=workload.template,
                            args=workload.args_json(), status=TaskStatus.QUEUED,
                            trials_planned=0, trials_done=0,
                            layers=spec.layers[i] if spec.layers else None))
    session.flush()
    return job.id


def cancel(session: Session, job_id: int) -> JobStatus | None:
    """Cancel a job that has not ended; returns its status after (None: no such job)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    if job.status not in FINAL:
        job.status = JobStatus.CANCELLED
        task_ids = select(TaskRow.id).where(TaskRow.job_id == job_id)
        session.execute(update(TaskRow).where(TaskRow.job_id == job_id,
                                              TaskRow.status.not_in(FINAL))
                        .values(status=TaskStatus.CANCELLED))
        withdraw_queued(session, task_ids)
    return JobStatus(job.status)


def withdraw_queued(session: Session, task_ids: Any) -> None:
    """Queued trials of these tasks (ids or a subquery) are no longer wanted."""
    session.execute(update(TrialRow).where(TrialRow.task_id.in_(task_ids),
                                           TrialRow.status == TrialStatus.QUEUED)
                    .values(status=TrialStatus.CANCELLED))


def error_counts(session: Session, task_ids: Iterable[int]) -> dict[int, int]:
    """error_no -> how many of these tasks' trials were recorded with it."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    rows = session.execute(
        select(RecordRow.error_no, func.count()).select_from(RecordRow)
        .join(TrialRow, TrialRow.id == RecordRow.trial_id)
        .where(TrialRow.task_id.in_(ids)).group_by(RecordRow.error_no))
    return {int(error_no): int(n) for error_no, n in rows}


def _error_name(error_no: int) -> str:
    try:
        return f"error {error_no} ({MeasureErrorNo(error_no).name})"
    except ValueError:
        return f"error {error_no}"


def all_failed(counts: dict[int, int]) -> str | None:
    """Why trials with these error counts make a failure ("all 16 trials failed: 12 x
    error 4 (RUNTIME_DEVICE), 4 x error 7 (RUN_TIMEOUT)"); None when one succeeded or
    none was recorded."""
    total = sum(counts.values())
    if not total or counts.get(int(MeasureErrorNo.NO_ERROR)):
        return None
    parts = [f"{n} x {_error_name(e)}"
             for e, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return f"all {total} trials failed: {', '.join(parts)}"


def served_queues(session: Session, lease_s: float, now: float) -> set[str]:
    """Queues some live worker (:func:`alive_clause`) serves. A worker whose stored
    target does not parse serves nothing."""
    served: set[str] = set()
    for worker_id, target in session.execute(
            select(WorkerRow.id, WorkerRow.target).where(alive_clause(now, lease_s))):
        try:
            served.update(queue_matches(Target.parse(target)))
        except ValueError:
            log.debug("worker %s: target %r does not parse; it serves nothing",
                      worker_id, target)
    return served


def _waiting_for_worker(job: JobRow, served: set[str]) -> bool:
    if job.status not in ACTIVE:
        return False
    try:
        return queue_name(Target.parse(job.target)) not in served
    except ValueError:
        return True  # no worker serves a target that does not parse


def _curve(session: Session, task_id: int) -> list[tuple[int, float]]:
    """(trial number, best cost so far) at each improvement, in order of arrival; the
    search's trials only (a verification measures its configs again)."""
    costs = session.scalars(
        select(RecordRow.mean_cost).join(TrialRow, TrialRow.id == RecordRow.trial_id)
        .where(TrialRow.task_id == task_id, TrialRow.verify_round == 0)
        .order_by(RecordRow.id)).all()
    curve, best = [], None
    for number, cost in enumerate(costs, start=1):
        if cost < FAILED_COST and (best is None or cost < best):
            best = cost
            curve.append((number, cost))
    return curve


# "Recent" for rates and ETAs: long enough to smooth a slow template's trials, short
# enough that an ETA follows a fleet that grew or shrank.
RATE_WINDOW_S = 600.0
# A task page: what one request returns at most (a client pages on with ``after``).
MAX_TRIAL_PAGE = 100_000


def _epoch(value: datetime | None) -> float | None:
    """Unix seconds of a stored time; SQLite hands it back naive (it was stored as UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def _recent(session: Session, job_ids: Sequence[int], now: float
            ) -> dict[int, tuple[int, float | None]]:
    """Job id -> (results stored in the last ``RATE_WINDOW_S``, when the first of them
    was), in one aggregate query that reads only the newest records' index range."""
    if not job_ids:
        return {}
    cutoff = datetime.fromtimestamp(now - RATE_WINDOW_S, timezone.utc)
    rows = session.execute(
        select(TaskRow.job_id, func.count(RecordRow.id), func.min(RecordRow.created_at))
        .select_from(RecordRow)
        .join(TrialRow, TrialRow.id == RecordRow.trial_id)
        .join(TaskRow, TaskRow.id == TrialRow.task_id)
        # ``job_id + 0``: SQLite would otherwise start from the jobs' tasks and walk every
        # trial they ever ran, not the recent records' index range
        .where((TaskRow.job_id + 0).in_(list(job_ids)), RecordRow.created_at >= cutoff)
        .group_by(TaskRow.job_id))
    return {job_id: (int(n), _epoch(first)) for job_id, n, first in rows}


def _eta(job: JobRow, remaining: int, recent: tuple[int, float | None], now: float
         ) -> float | None:
    """Seconds left at the rate of the last ``RATE_WINDOW_S``: (n - 1) intervals between
    n results, stretched to now so a stalled fleet's ETA grows. None when unknown."""
    if job.status == JobStatus.DONE or (job.status not in FINAL and remaining == 0):
        return 0.0
    if job.status in FINAL:
        return None
    count, first = recent
    if count < 2 or first is None or now <= first:
        return None
    return remaining * (now - first) / (count - 1)


def _task_item(job: JobRow, task: TaskRow) -> TaskView:
    flops = workload_flops(task.template, task.args)
    return TaskView(
        id=task.id, template=task.template, args=task.args, status=TaskStatus(task.status),
        trials_done=task.trials_done, trials_planned=task.trials_planned,
        n_trial=job.n_trial, best_cost=task.best_cost,
        best_gflops=flops / task.best_cost / 1e9 if flops and task.best_cost else None,
        error=task.error, layers=task.layers)


def _job_item(job: JobRow, tasks: list[TaskRow], recent: tuple[int, float | None],
              now: float, served: set[str]) -> JobView:
    """A job with its tasks and the figures a dashboard row shows: progress (a task that
    ended early, by early stopping or an exhausted space, counts as complete), ETA and
    the best GFLOP/s of any task; and whether it waits for a worker (none alive serves
    its target), with a note saying what to do."""
    items = [_task_item(job, t) for t in tasks]
    total = job.n_trial * len(tasks)
    counted = sum(job.n_trial if t.status == TaskStatus.DONE else min(t.trials_done, job.n_trial)
                  for t in tasks)
    remaining = sum(max(job.n_trial - t.trials_done, 0) for t in tasks
                    if t.status not in FINAL)
    bests = [i.best_gflops for i in items if i.best_gflops is not None]
    waiting = _waiting_for_worker(job, served)
    return JobView(
        id=job.id, target=job.target, status=JobStatus(job.status), tuner=job.tuner,
        n_trial=job.n_trial, early_stopping=job.early_stopping, error=job.error,
        created_at=job.created_at.isoformat() if job.created_at else None,
        trials_done=sum(t.trials_done for t in tasks), trials_total=total,
        progress=counted / total if total else 0.0,
        eta_s=_eta(job, remaining, recent, now),
        best_gflops=max(bests) if bests else None,
        waiting_for_worker=waiting,
        note=(f"no live worker serves '{job.target}'; start one: tuner worker "
              f"--server <this server> --token TOKEN") if waiting else None,
        tasks=items, model=job.model)


def _describe_many(session: Session, jobs: Sequence[JobRow],
                   lease_s: float) -> list[JobView]:
    """Jobs as ``describe`` shows them, in four queries whatever their number."""
    ids = [j.id for j in jobs]
    per_job: dict[int, list[TaskRow]] = {i: [] for i in ids}
    if ids:
        for task in session.scalars(select(TaskRow).where(TaskRow.job_id.in_(ids))
                                    .order_by(TaskRow.id)):
            per_job[task.job_id].append(task)
    now = time.time()
    recent = _recent(session, ids, now)
    active = any(j.status in ACTIVE for j in jobs)
    served = served_queues(session, lease_s, now) if active else set()
    return [_job_item(j, per_job[j.id], recent.get(j.id, (0, None)), now, served)
            for j in jobs]


def describe(session: Session, job_id: int, with_curves: bool = True, *, lease_s: float
             ) -> JobView | None:
    """A job, its tasks (with their tuning curves) and whether it waits for a worker:
    ``lease_s`` is the server's lease, within which a worker counts as alive. Without
    ``with_curves`` the tasks' ``curve`` stays unset (left out of the JSON)."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    [item] = _describe_many(session, [job], lease_s)
    if with_curves:
        for task in item.tasks:
            flops = workload_flops(task.template, task.args)
            task.curve = [CurvePoint(trial=n, best_cost=c,
                                     best_gflops=flops / c / 1e9 if flops and c else None)
                          for n, c in _curve(session, task.id)]
    return item


def list_jobs(session: Session, limit: int = 100, offset: int = 0, *,
              lease_s: float) -> list[JobView]:
    jobs = session.scalars(select(JobRow).order_by(JobRow.id.desc())
                           .limit(limit).offset(offset)).all()
    return _describe_many(session, jobs, lease_s)


def task_trials(session: Session, job_id: int, task_id: int, after: int | None = None,
                limit: int = MAX_TRIAL_PAGE, with_records: bool = True) -> TrialPage | None:
    """A task's measured search trials in the order their results were stored, numbered
    from 1 (a verification's measurements are records, not trials of the search);
    ``after`` (a trial id of this task) returns only those stored after it, numbered on,
    so a tuning curve is extended without fetching it again. None: no such task in job.
    Without ``with_records`` a point's ``record`` stays unset (a chart needs none of the
    lines, which are most of the page's bytes and time).

    Reads the task's trials through ``ix_trials_task_id`` and their records through the
    unique ``trial_id`` index: cost grows with the task, not with the records table."""
    task = session.get(TaskRow, task_id)
    if task is None or task.job_id != job_id:
        return None
    line_column = RecordRow.line if with_records else null()
    measured = (select(RecordRow.id, TrialRow.id, RecordRow.error_no, RecordRow.mean_cost,
                       line_column)
                .join(TrialRow, TrialRow.id == RecordRow.trial_id)
                .where(TrialRow.task_id == task_id, TrialRow.verify_round == 0))
    start = 0
    if after is not None:
        mark = session.scalar(select(RecordRow.id).join(TrialRow, TrialRow.id == RecordRow.trial_id)
                              .where(RecordRow.trial_id == after, TrialRow.task_id == task_id,
                                     TrialRow.verify_round == 0))
        if mark is None:
            raise JobError(f"after: trial {after} is not a measured trial of task {task_id}")
        start = session.scalar(select(func.count()).select_from(
            measured.where(RecordRow.id <= mark).subquery())) or 0
        measured = measured.where(RecordRow.id > mark)
    flops = workload_flops(task.template, task.args)
    items = []
    for number, (_rid, trial_id, error_no, cost, line) in enumerate(
            session.execute(measured.order_by(RecordRow.id).limit(limit)), start=start + 1):
        ok = error_no == 0 and cost is not None and 0 < cost < FAILED_COST
        point = TrialPoint(trial=number, id=trial_id, error_no=error_no,
                           cost=cost if ok else None,
                           gflops=flops / cost / 1e9 if ok and flops else None)
        if with_records:
            point.record = line if isinstance(line, dict) else None
        items.append(point)
    return TrialPage(task_id=task.id, status=TaskStatus(task.status), trials_done=task.trials_done,
                     items=items)

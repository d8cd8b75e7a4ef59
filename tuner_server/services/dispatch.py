"""Workers and their leases: register, lease, heartbeat, report, release, reclaim."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

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
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow
from tuner_server.queue.base import DispatchQueue, queue_matches
from tuner_server.services.records import record_row

MAX_ATTEMPTS = 3


@dataclass
class ReportCounts:
    accepted: int = 0
    duplicates: int = 0
    unknown: list[int] = field(default_factory=list)


def register(session: Session, name: str, target: Target, limits: DeviceLimits,
             device: str | None = None) -> int:
    worker = WorkerRow(name=name, target=str(target), limits=limits.model_dump(),
                       last_seen=time.time(), device=device)
    session.add(worker)
    session.flush()
    return worker.id


def get_worker(session: Session, worker_id: int) -> WorkerRow | None:
    return session.get(WorkerRow, worker_id)


def lease(session: Session, queue: DispatchQueue, worker: WorkerRow, limit: int,
          lease_s: float) -> list[dict[str, Any]]:
    """Lease up to ``limit`` trials for the worker's target; caller commits."""
    now = time.time()
    worker.last_seen = now
    trials = queue.lease(session, worker.id, queue_matches(Target.parse(worker.target)),
                         limit, lease_s, now)
    out = []
    for trial in trials:
        task = session.get(TaskRow, trial.task_id)
        assert task is not None
        job = session.get(JobRow, task.job_id)
        assert job is not None
        out.append({"trial_id": trial.id, "task_id": task.id, "template": task.template,
                    "args": task.args, "config": trial.config, "target": job.target,
                    "measure": job.measure, "lease_deadline": trial.lease_deadline})
    return out


def heartbeat(session: Session, worker: WorkerRow, trial_ids: list[int],
              lease_s: float) -> int:
    now = time.time()
    worker.last_seen = now
    if not trial_ids:
        return 0
    result = session.execute(
        update(TrialRow)
        .where(TrialRow.id.in_(trial_ids), TrialRow.worker_id == worker.id,
               TrialRow.status == "leased")
        .values(lease_deadline=now + lease_s))
    return result.rowcount  # type: ignore[attr-defined,no-any-return]


def release(session: Session, worker: WorkerRow, trial_ids: list[int]) -> list[TrialRow]:
    """Give trials back unmeasured (a worker shutting down): not a failed attempt."""
    trials = list(session.scalars(select(TrialRow).where(
        TrialRow.id.in_(trial_ids), TrialRow.worker_id == worker.id,
        TrialRow.status == "leased")))
    for trial in trials:
        trial.status, trial.worker_id, trial.lease_deadline = "queued", None, None
        trial.attempts = max(trial.attempts - 1, 0)
    return trials


Outcome = tuple[TrialRow, MeasureResult, str, dict[str, Any] | None]  # + device target


def _store(session: Session, outcomes: list[Outcome]) -> bool:
    """Record these trials' results and update their tasks, all or nothing.

    False (and nothing stored) when another report already recorded one of them. A
    record carries the measuring device's target (``opencl -model=pocl-cpu``), not the
    job's (which may be a bare ``opencl``). Task counters end as one-at-a-time updates
    would leave them: the first of equal costs is the best."""
    tasks = {t.id: t for t in session.scalars(
        select(TaskRow).where(TaskRow.id.in_(sorted({t.task_id for t, *_ in outcomes}))))}
    rows = [dict(record_row(Record.from_measure(
        MeasureInput(target=Target.parse(target),
                     workload=Workload(template=tasks[trial.task_id].template,
                                       args=tasks[trial.task_id].args),
                     config=Config.model_validate(trial.config)),
        result, info=info or None)), trial_id=trial.id)
        for trial, result, target, info in outcomes]
    try:
        with session.begin_nested():
            session.execute(insert(RecordRow), rows)
    except IntegrityError:
        return False
    per_task: dict[int, list[Any]] = {}  # task id -> [count, best cost, its position]
    for trial, result, _target, _info in outcomes:
        trial.status, trial.error_no, trial.lease_deadline = "done", int(result.error_no), None
        entry = per_task.setdefault(trial.task_id, [0, None, None])
        entry[0] += 1
        if result.ok and (entry[1] is None or result.mean_cost < entry[1]):
            entry[1], entry[2] = result.mean_cost, entry[0]
    for task_id in sorted(per_task):
        done, cost, position = per_task[task_id]
        session.execute(update(TaskRow).where(TaskRow.id == task_id)
                        .values(trials_done=TaskRow.trials_done + done))
        if cost is not None:
            session.execute(
                update(TaskRow)
                .where(TaskRow.id == task_id,
                       (TaskRow.best_cost.is_(None)) | (TaskRow.best_cost > cost))
                .values(best_cost=cost, best_trial=TaskRow.trials_done - done + position))
    return True


def report(session: Session, worker: WorkerRow,
           results: list[tuple[int, MeasureResult, dict[str, Any] | None]]) -> ReportCounts:
    """Accept each trial's result once; a repeat is a no-op, not a second record.

    The trials are locked in one SELECT (id order) and stored as one batch; should the
    batch hit a record another report stored first, it goes again trial by trial."""
    worker.last_seen = time.time()
    counts = ReportCounts()
    ids = sorted({trial_id for trial_id, _result, _info in results})
    trials = {t.id: t for t in session.scalars(
        select(TrialRow).where(TrialRow.id.in_(ids)).order_by(TrialRow.id)
        .with_for_update().execution_options(populate_existing=True))} if ids else {}
    fresh: list[Outcome] = []
    taken: set[int] = set()
    for trial_id, result, info in results:
        trial = trials.get(trial_id)
        if trial is None:
            counts.unknown.append(trial_id)
        elif trial.status in ("done", "cancelled") or trial_id in taken:
            counts.duplicates += 1
        else:
            taken.add(trial_id)
            fresh.append((trial, result, worker.target, dict(info or {}, worker=worker.name)))
    if not fresh:
        return counts
    if _store(session, fresh):
        counts.accepted += len(fresh)
        return counts
    for outcome in fresh:  # a concurrent report won some of them
        if _store(session, [outcome]):
            counts.accepted += 1
        else:
            counts.duplicates += 1
    return counts


def reclaim_expired(session: Session, now: float | None = None) -> tuple[list[TrialRow], int]:
    """Expired leases go back to the queue; the third expiry is recorded as a failure.

    Returns (trials requeued, trials given up)."""
    now = time.time() if now is None else now
    expired = list(session.scalars(select(TrialRow).where(
        TrialRow.status == "leased", TrialRow.lease_deadline < now).with_for_update()))
    requeued, failed = [], 0
    for trial in expired:
        if trial.attempts >= MAX_ATTEMPTS:
            result = MeasureResult.failure(
                MeasureErrorNo.UNKNOWN_ERROR,
                f"lease expired {trial.attempts} times: the worker measuring it was lost")
            lost = session.get(WorkerRow, trial.worker_id) if trial.worker_id else None
            task = session.get(TaskRow, trial.task_id)
            job = session.get(JobRow, task.job_id) if task else None
            target = lost.target if lost else (job.target if job else "unknown")
            if _store(session, [(trial, result, target, None)]):
                failed += 1
        else:
            trial.status, trial.worker_id, trial.lease_deadline = "queued", None, None
            requeued.append(trial)
    return requeued, failed


def workers_alive(session: Session, within_s: float = 60.0) -> int:
    cutoff = time.time() - within_s
    return len(session.scalars(select(WorkerRow.id).where(WorkerRow.last_seen >= cutoff)).all())

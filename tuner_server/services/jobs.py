"""Jobs: submit tasks to tune, follow their progress, cancel them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from compiler.templates import get_template
from schemas import MeasureOptions, Target, Workload
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow
from tuner_server.search import DEFAULT_TUNER, TUNERS

FINAL = ("done", "cancelled", "failed")


class JobError(ValueError):
    """A submission that cannot become a job; the message names the field."""


@dataclass(frozen=True)
class JobSpec:
    target: Target
    workloads: list[Workload]
    n_trial: int
    tuner: str = DEFAULT_TUNER
    early_stopping: int | None = None
    plan_size: int = 16
    measure: MeasureOptions = MeasureOptions()


def submit(session: Session, spec: JobSpec) -> int:
    if spec.tuner not in TUNERS:
        raise JobError(f"tuner: unknown tuner {spec.tuner!r}; known: {', '.join(sorted(TUNERS))}")
    for i, workload in enumerate(spec.workloads):
        try:
            get_template(workload.template).space(workload)
        except (KeyError, ValueError) as err:
            raise JobError(f"tasks[{i}]: {err}") from None
    job = JobRow(target=str(spec.target), status="queued", tuner=spec.tuner,
                 n_trial=spec.n_trial, early_stopping=spec.early_stopping,
                 plan_size=spec.plan_size, measure=spec.measure.model_dump())
    session.add(job)
    session.flush()
    for workload in spec.workloads:
        session.add(TaskRow(job_id=job.id, template=workload.template,
                            args=workload.args_json(), status="queued",
                            trials_planned=0, trials_done=0))
    session.flush()
    return job.id


def cancel(session: Session, job_id: int) -> bool:
    job = session.get(JobRow, job_id)
    if job is None:
        return False
    if job.status not in FINAL:
        job.status = "cancelled"
        task_ids = select(TaskRow.id).where(TaskRow.job_id == job_id)
        session.execute(update(TaskRow).where(TaskRow.job_id == job_id,
                                              TaskRow.status.not_in(FINAL))
                        .values(status="cancelled"))
        withdraw_queued(session, task_ids)
    return True


def withdraw_queued(session: Session, task_ids: Any) -> None:
    """Queued trials of these tasks (ids or a subquery) are no longer wanted."""
    session.execute(update(TrialRow).where(TrialRow.task_id.in_(task_ids),
                                           TrialRow.status == "queued")
                    .values(status="cancelled"))


def _curve(session: Session, task_id: int) -> list[tuple[int, float]]:
    """(trial number, best cost so far) at each improvement, in order of arrival."""
    costs = session.scalars(
        select(RecordRow.mean_cost).join(TrialRow, TrialRow.id == RecordRow.trial_id)
        .where(TrialRow.task_id == task_id).order_by(RecordRow.id)).all()
    curve, best = [], None
    for number, cost in enumerate(costs, start=1):
        if cost < 1e9 and (best is None or cost < best):
            best = cost
            curve.append((number, cost))
    return curve


def describe(session: Session, job_id: int, with_curves: bool = True) -> dict[str, Any] | None:
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    tasks = []
    for task in session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)
                                .order_by(TaskRow.id)):
        workload = Workload(template=task.template, args=task.args)
        flops = get_template(task.template).flops(workload)
        item: dict[str, Any] = {
            "id": task.id, "template": task.template, "args": task.args,
            "status": task.status, "trials_done": task.trials_done,
            "trials_planned": task.trials_planned, "n_trial": job.n_trial,
            "best_cost": task.best_cost,
            "best_gflops": flops / task.best_cost / 1e9 if task.best_cost else None,
        }
        if with_curves:
            item["curve"] = [{"trial": n, "best_cost": c,
                              "best_gflops": flops / c / 1e9 if c else None}
                             for n, c in _curve(session, task.id)]
        tasks.append(item)
    return {"id": job.id, "target": job.target, "status": job.status, "tuner": job.tuner,
            "n_trial": job.n_trial, "early_stopping": job.early_stopping, "error": job.error,
            "created_at": job.created_at.isoformat() if job.created_at else None,
            "tasks": tasks}


def list_jobs(session: Session, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    ids = session.scalars(select(JobRow.id).order_by(JobRow.id.desc())
                          .limit(limit).offset(offset)).all()
    return [d for d in (describe(session, i, with_curves=False) for i in ids) if d]

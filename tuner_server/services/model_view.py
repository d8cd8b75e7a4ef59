"""A job as a model's tuning (the dashboard's model view): per task the layers it serves,
its default config's cost against its best, failures and share of the model's latency;
and the model's estimated end-to-end latency as the results arrived.

The estimate is AutoTVM's way of judging a tuned model without running it: the sum over
tasks of the best measured cost times the number of layers that run the task's kernel.
It is defined once every task has a working trial; the default build's estimate (the
starting line) once every task's default config (the scheduler measures it first) has
been measured. One query reads the job's results in the order they were stored."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from compiler.templates import get_template
from schemas import Workload
from schemas.api import FINAL, CurvePoint, JobStatus, LatencyPoint, ModelTask, ModelView, TaskStatus
from schemas.measure import FAILED_COST
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow
from tuner_server.services.records import workload_flops

# SQLite's bound-parameter limit is 32,766 on current builds and 999 on old ones.
IN_CHUNK = 900
# Points a curve is thinned to (a sparkline is 120 px wide, a latency chart ~500): the
# last point of each span of trials is kept, so the step line drawn stays exact there.
SPARK_POINTS = 24
LATENCY_POINTS = 400

T = TypeVar("T")


def _thin(points: list[T], x: Callable[[T], float], limit: int) -> list[T]:
    """At most ``limit`` of ``points`` (ordered by ``x``): the first, and the last of
    each of ``limit - 1`` equal spans of ``x``."""
    if len(points) <= limit:
        return points
    x0, span = x(points[0]), (x(points[-1]) - x(points[0])) or 1.0
    kept: dict[int, T] = {}
    for point in points[1:]:
        kept[min(int((x(point) - x0) / span * (limit - 1)), limit - 2)] = point
    return [points[0], *kept.values()]


def _epoch(value: datetime | None) -> float | None:
    """Unix seconds of a stored time; SQLite hands it back naive (it was stored as UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def _default_index(task: TaskRow) -> int | None:
    """The config index an untuned build runs (the template's fallback); None when the
    template is unknown here or cannot read the workload."""
    return _default_of(task.template, json.dumps(task.args, separators=(",", ":")))


@lru_cache(maxsize=4096)
def _default_of(template: str, args_json: str) -> int | None:
    # cached: a config space takes milliseconds to build, and the view is polled
    try:
        workload = Workload(template=template, args=args_json)
        return int(get_template(template).default_config(workload).index)
    except Exception:  # noqa: BLE001 - a task the server cannot read has no default figure
        return None


@dataclass
class _TaskState:
    """What one pass over a task's results finds."""

    row: TaskRow
    weight: int
    default_index: int | None
    flops: float | None
    trials: int = 0
    best: float | None = None
    default_cost: float | None = None
    errors: Counter[int] = field(default_factory=Counter)
    curve: list[tuple[int, float]] = field(default_factory=list)


def _gflops(flops: float | None, cost: float | None) -> float | None:
    return flops / cost / 1e9 if flops and cost else None


def _item(state: _TaskState, total: float | None, n_trial: int) -> ModelTask:
    task = state.row
    share = state.best * state.weight / total if total and state.best is not None else None
    return ModelTask(
        id=task.id, template=task.template, args=task.args, status=TaskStatus(task.status),
        layers=list(task.layers or []), layer_count=state.weight,
        trials_done=task.trials_done, n_trial=n_trial,
        default_cost=state.default_cost, default_gflops=_gflops(state.flops, state.default_cost),
        best_cost=state.best, best_gflops=_gflops(state.flops, state.best),
        speedup=(state.default_cost / state.best
                 if state.default_cost is not None and state.best else None),
        errors=sum(state.errors.values()),
        error_counts={str(e): n for e, n in sorted(state.errors.items())},
        share=share,
        curve=[CurvePoint(trial=n, best_cost=c, best_gflops=_gflops(state.flops, c))
               for n, c in _thin(state.curve, lambda point: point[0], SPARK_POINTS)])


def _created(session: Session, record_ids: Sequence[int]) -> dict[int, float]:
    """Record id -> unix seconds it was stored, for these (few) records."""
    out: dict[int, float] = {}
    for start in range(0, len(record_ids), IN_CHUNK):
        chunk = record_ids[start:start + IN_CHUNK]
        for rid, at in session.execute(select(RecordRow.id, RecordRow.created_at)
                                       .where(RecordRow.id.in_(chunk))):
            out[int(rid)] = _epoch(at) or 0.0
    return out


def model_view(session: Session, job_id: int, now: float | None = None) -> ModelView | None:
    """The job as a model's tuning (see the module's doc); None: no such job."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    rows = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)
                           .order_by(TaskRow.id)).all()
    states = {t.id: _TaskState(t, len(t.layers) if t.layers else 1, _default_index(t),
                               workload_flops(t.template, t.args)) for t in rows}
    # Core rows, not ORM ones: tens of thousands of them, read on every poll
    results = session.connection().execute(
        select(RecordRow.id, TrialRow.task_id, TrialRow.config_index, RecordRow.mean_cost,
               RecordRow.error_no)
        .join(TrialRow, TrialRow.id == RecordRow.trial_id)
        .where(TrialRow.task_id.in_(list(states))).order_by(RecordRow.id)).all() if states else []
    measured = 0
    total: float | None = None
    marks: list[tuple[int, int, float]] = []  # (record id, results so far, estimate)
    count = 0
    last_id: int | None = None
    for record_id, task_id, config_index, cost, error_no in results:
        count += 1
        last_id = record_id
        state = states[task_id]
        state.trials += 1
        ok = error_no == 0 and cost is not None and 0 < cost < FAILED_COST
        if not ok:
            state.errors[int(error_no)] += 1
            continue
        if config_index == state.default_index and state.default_cost is None:
            state.default_cost = cost
        if state.best is not None and cost >= state.best:
            continue
        if state.best is None:
            measured += 1
        state.best = cost
        state.curve.append((state.trials, cost))
        if measured == len(states):
            total = sum(s.best * s.weight for s in states.values() if s.best is not None)
            marks.append((record_id, count, total))
    start = _epoch(job.created_at) or 0.0
    marks = _thin(marks, lambda mark: mark[1], LATENCY_POINTS)
    created = _created(session, [m[0] for m in marks] + ([last_id] if last_id else []))
    if job.status in FINAL:
        elapsed = max(created.get(last_id, start) - start, 0.0) if last_id else 0.0
    else:
        elapsed = max((now if now is not None else time.time()) - start, 0.0)
    defaults = [s.default_cost * s.weight for s in states.values() if s.default_cost]
    default_total = sum(defaults) if states and len(defaults) == len(states) else None
    errors: Counter[int] = Counter()
    for state in states.values():
        errors.update(state.errors)
    items = [_item(s, total, job.n_trial) for s in states.values()]
    items.sort(key=lambda t: (t.share is None, -(t.share or 0.0), t.id))
    return ModelView(
        job_id=job.id, model=job.model, target=job.target, status=JobStatus(job.status),
        elapsed_s=elapsed, trials_done=count, tasks_measured=measured,
        latency_s=total, default_latency_s=default_total,
        speedup=default_total / total if default_total and total else None,
        error_counts={str(e): n for e, n in sorted(errors.items())},
        curve=[LatencyPoint(at_s=max(created.get(rid, start) - start, 0.0), trial=n,
                            latency_s=est) for rid, n, est in marks],
        tasks=items)

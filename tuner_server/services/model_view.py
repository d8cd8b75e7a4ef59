"""A job as a model's tuning (the dashboard's model view): per task the layers it serves,
its default config's cost against its best, failures and share of the model's latency;
and the model's estimated end-to-end latency as the results arrived.

The estimate is AutoTVM's way of judging a tuned model without running it: the sum over
tasks of the best measured cost times the number of layers that run the task's kernel.
It is defined once every task has a working trial; the default build's estimate (the
starting line) once every task's default config (the scheduler measures it first) has
been measured. The view is a left fold over the job's results in the order they were
stored; :class:`ModelViews` keeps each job's fold, so a poll reads only what is new."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy import func, select
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
    """The config index an untuned build runs: the default the scheduler planned first
    (sized for the devices that served the job), or for a task from before that was kept
    the template's default without device limits; None when the template is unknown here
    or cannot read the workload."""
    if task.default_index is not None:
        return int(task.default_index)
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
class _TaskFold:
    """One task's results folded in the order stored."""

    weight: int
    default_index: int | None
    trials: int = 0
    best: float | None = None
    default_cost: float | None = None
    errors: Counter[int] = field(default_factory=Counter)
    curve: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class _JobFold:
    """A job's results folded in record-id order: everything the view needs that depends
    on the results. A left fold, so results stored after the last one folded extend it."""

    tasks: dict[int, _TaskFold]
    measured: int = 0  # tasks with a working trial
    total: float | None = None  # the estimate now
    # (record id, results so far, estimate) at each change of the estimate
    marks: list[tuple[int, int, float]] = field(default_factory=list)
    count: int = 0
    searched: int = 0  # results of search trials (not verification) among ``count``
    last_id: int | None = None
    seen: int = 0  # every result with a record id up to this, visible when read, is in
    created: dict[int, float] = field(default_factory=dict)  # record id -> stored at, as read

    def add(self, results: Sequence[Any]) -> None:
        """Fold in these rows of :func:`_results`, ordered by record id and all above
        ``last_id``."""
        for record_id, task_id, config_index, cost, error_no, verify_round in results:
            self.count += 1
            self.searched += not verify_round
            self.last_id = record_id
            state = self.tasks[task_id]
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
                self.measured += 1
            state.best = cost
            state.curve.append((state.trials, cost))
            if self.measured == len(self.tasks):
                self.total = sum(s.best * s.weight for s in self.tasks.values()
                                 if s.best is not None)
                self.marks.append((record_id, self.count, self.total))


def _gflops(flops: float | None, cost: float | None) -> float | None:
    return flops / cost / 1e9 if flops and cost else None


def _item(task: TaskRow, state: _TaskFold, flops: float | None, total: float | None,
          n_trial: int) -> ModelTask:
    share = state.best * state.weight / total if total and state.best is not None else None
    return ModelTask(
        id=task.id, template=task.template, args=task.args, status=TaskStatus(task.status),
        layers=list(task.layers or []), layer_count=state.weight,
        trials_done=task.trials_done, n_trial=n_trial,
        default_cost=state.default_cost, default_gflops=_gflops(flops, state.default_cost),
        best_cost=state.best, best_gflops=_gflops(flops, state.best),
        speedup=(state.default_cost / state.best
                 if state.default_cost is not None and state.best else None),
        errors=sum(state.errors.values()),
        error_counts={str(e): n for e, n in sorted(state.errors.items())},
        share=share,
        curve=[CurvePoint(trial=n, best_cost=c, best_gflops=_gflops(flops, c))
               for n, c in _thin(state.curve, lambda point: point[0], SPARK_POINTS)])


def _results(session: Session, task_ids: list[int], after: int | None) -> Sequence[Any]:
    """The results of these tasks stored with a record id above ``after`` (all: None), as
    (record id, task id, config index, mean cost, error_no, verify round) in id order.
    Core rows, not ORM ones: tens of thousands of them on a first read."""
    query = (select(RecordRow.id, TrialRow.task_id, TrialRow.config_index, RecordRow.mean_cost,
                    RecordRow.error_no, TrialRow.verify_round)
             .join(TrialRow, TrialRow.id == RecordRow.trial_id).order_by(RecordRow.id))
    if after is None:
        query = query.where(TrialRow.task_id.in_(task_ids))
    else:
        # ``task_id + 0``: SQLite would otherwise walk every trial of the tasks (their
        # index) rather than the few records stored since (the primary key's range)
        query = query.where(RecordRow.id > after, (TrialRow.task_id + 0).in_(task_ids))
    return session.connection().execute(query).all() if task_ids else []


def _top(session: Session) -> int:
    """The highest record id stored (any job's): results read later above it are new."""
    return int(session.scalar(select(func.max(RecordRow.id))) or 0)


def _stored(session: Session, task_ids: list[int]) -> tuple[int, int]:
    """The tasks' (search, verification) results stored. Search ones are the tasks'
    ``trials_done``, which a report raises in the transaction that stores its records;
    verification ones (not in ``trials_done``) are counted from the records: the tasks'
    trials walked in an index (``uq_trials_task_config_round``, no table rows), the
    records of the few verification trials among them looked up by ``trial_id``."""
    searched = session.scalar(select(func.sum(TaskRow.trials_done))
                              .where(TaskRow.id.in_(task_ids)))
    verified = session.scalar(select(func.count(RecordRow.id))
                              .join(TrialRow, TrialRow.id == RecordRow.trial_id)
                              .where(TrialRow.task_id.in_(task_ids), TrialRow.verify_round > 0))
    return int(searched or 0), int(verified or 0)


def _created(session: Session, fold: _JobFold, record_ids: Sequence[int]) -> dict[int, float]:
    """Record id -> unix seconds it was stored, for these (few) records; those read on an
    earlier call come from ``fold``, which keeps only these afterwards."""
    known = {rid: fold.created[rid] for rid in record_ids if rid in fold.created}
    missing = [rid for rid in record_ids if rid not in known]
    for start in range(0, len(missing), IN_CHUNK):
        chunk = missing[start:start + IN_CHUNK]
        for rid, at in session.execute(select(RecordRow.id, RecordRow.created_at)
                                       .where(RecordRow.id.in_(chunk))):
            known[int(rid)] = _epoch(at) or 0.0
    fold.created = known
    return known


def _new_fold(tasks: Sequence[TaskRow]) -> _JobFold:
    return _JobFold({t.id: _TaskFold(len(t.layers) if t.layers else 1, _default_index(t))
                     for t in tasks})


def _signature(fold: _JobFold) -> list[tuple[int, int, int | None]]:
    """What a fold was started from: each task's id, layer count and default config."""
    return [(task_id, s.weight, s.default_index) for task_id, s in fold.tasks.items()]


@dataclass
class _Slot:
    """One job's place in :class:`ModelViews`: its fold, and the lock a call holds while it
    extends the fold and reads the view from it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    fold: _JobFold | None = None


class ModelViews:
    """Each job's fold kept between calls, one per server process (``app.state``): a call
    reads only the results stored since the last one it folded, through the records'
    primary key, instead of all of the job's (28,000 for a model's 28 tasks at 1,000
    trials each).

    Results are folded in record-id order, and a transaction may commit a lower id after
    a higher one was read. So each call then compares the search results folded with the
    tasks' ``trials_done`` (which the storing transaction raises), and the verification
    results folded with those stored (which no counter covers): a difference that
    another read of what is new does not settle (a result stored meanwhile) means a
    result committed below those read, and the fold starts again from the job's tasks,
    as it does when the tasks change (a database whose counters disagree with its records
    is so read in full on every call, as without this). Least recently viewed jobs beyond
    ``max_jobs`` are dropped."""

    def __init__(self, max_jobs: int = 64) -> None:
        self.max_jobs = max_jobs
        self.rebuilds = 0  # folds started from scratch (a first view, or a check failed)
        self._lock = threading.Lock()
        self._slots: OrderedDict[int, _Slot] = OrderedDict()

    def slot(self, job_id: int) -> _Slot:
        """The job's slot (made on first use), marked most recently used."""
        with self._lock:
            slot = self._slots.get(job_id)
            if slot is None:
                slot = self._slots[job_id] = _Slot()
                while len(self._slots) > self.max_jobs:
                    self._slots.popitem(last=False)
            self._slots.move_to_end(job_id)
            return slot

    def update(self, session: Session, slot: _Slot, tasks: Sequence[TaskRow]) -> _JobFold:
        """The slot's fold brought up to the results stored now (the caller holds
        ``slot.lock``)."""
        fold = slot.fold
        if fold is not None and _signature(fold) == _signature(_new_fold(tasks)):
            task_ids = list(fold.tasks)
            for _ in range(2):
                _extend(session, fold, task_ids)
                # read after the results: equal means every one stored by then is folded
                if _stored(session, task_ids) == (fold.searched, fold.count - fold.searched):
                    return fold
        with self._lock:  # calls for other jobs may rebuild at the same time
            self.rebuilds += 1
        slot.fold = fold = _new_fold(tasks)
        _extend(session, fold, list(fold.tasks))
        return fold


def _extend(session: Session, fold: _JobFold, task_ids: list[int]) -> None:
    """Fold in the results stored above ``fold.seen`` (all, for a new fold)."""
    top = _top(session)  # before the read: whatever it finds up to here was visible
    fold.add(_results(session, task_ids, fold.seen if fold.count else None))
    fold.seen = max(top, fold.seen, fold.last_id or 0)


def model_view(session: Session, job_id: int, now: float | None = None,
               views: ModelViews | None = None) -> ModelView | None:
    """The job as a model's tuning (see the module's doc); None: no such job. With
    ``views``, the job's fold kept there is extended; without, every result is read."""
    job = session.get(JobRow, job_id)
    if job is None:
        return None
    rows = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)
                           .order_by(TaskRow.id)).all()
    if views is None:
        fold = _new_fold(rows)
        _extend(session, fold, list(fold.tasks))
        return _view(session, job, rows, fold, now)
    slot = views.slot(job_id)
    with slot.lock:
        return _view(session, job, rows, views.update(session, slot, rows), now)


def _view(session: Session, job: JobRow, rows: Sequence[TaskRow], fold: _JobFold,
          now: float | None) -> ModelView:
    """The view read from a fold of the job's results and its task rows as they are."""
    start = _epoch(job.created_at) or 0.0
    marks = _thin(fold.marks, lambda mark: mark[1], LATENCY_POINTS)
    last_id = fold.last_id
    created = _created(session, fold, [m[0] for m in marks] + ([last_id] if last_id else []))
    if job.status in FINAL:
        elapsed = max(created.get(last_id, start) - start, 0.0) if last_id else 0.0
    else:
        elapsed = max((now if now is not None else time.time()) - start, 0.0)
    states = fold.tasks
    defaults = [s.default_cost * s.weight for s in states.values() if s.default_cost]
    default_total = sum(defaults) if states and len(defaults) == len(states) else None
    errors: Counter[int] = Counter()
    for state in states.values():
        errors.update(state.errors)
    total = fold.total
    items = [_item(t, states[t.id], workload_flops(t.template, t.args), total, job.n_trial)
             for t in rows]
    items.sort(key=lambda t: (t.share is None, -(t.share or 0.0), t.id))
    return ModelView(
        job_id=job.id, model=job.model, target=job.target, status=JobStatus(job.status),
        elapsed_s=elapsed, trials_done=fold.count, tasks_measured=fold.measured,
        latency_s=total, default_latency_s=default_total,
        speedup=default_total / total if default_total and total else None,
        error_counts={str(e): n for e, n in sorted(errors.items())},
        curve=[LatencyPoint(at_s=max(created.get(rid, start) - start, 0.0), trial=n,
                            latency_s=est) for rid, n, est in marks],
        tasks=items)

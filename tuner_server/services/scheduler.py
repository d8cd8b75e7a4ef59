"""The scheduler: keep a plan of trials queued for every running task, finish tasks at
their budget or on early stopping, and return expired leases. All of its state is in
the database, so a restarted server resumes every job where it was."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from compiler.templates import get_template
from schemas import Config, DeviceLimits, MeasureResult, Record, Target, Workload
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow
from tuner_server.queue.base import DispatchQueue, queue_matches, queue_name
from tuner_server.search import TUNERS, Tuner, make_tuner
from tuner_server.search.base import perf_of
from tuner_server.search.transfer import Example, GlobalModels
from tuner_server.services import dispatch
from tuner_server.services.jobs import withdraw_queued

log = logging.getLogger("tuner.scheduler")
ACTIVE = ("queued", "running")


@dataclass
class PassStats:
    planned: int = 0
    requeued: int = 0
    given_up: int = 0


@dataclass
class SearchState:
    """What the scheduler keeps between passes to search faster; all of it can be lost
    (a restart rebuilds it from the database): the global cost models, and each running
    task's tuner (its annealing chains)."""

    global_models: GlobalModels = field(default_factory=GlobalModels)
    tuners: OrderedDict[tuple[int, str], Tuner] = field(default_factory=OrderedDict)
    max_tuners: int = 256

    def tuner(self, job: JobRow, task: TaskRow, limits: DeviceLimits | None,
              session: Session) -> Tuner:
        key = (task.id, repr(limits))
        tuner = self.tuners.get(key)
        if tuner is None or tuner.name != job.tuner:
            template = get_template(task.template)
            kwargs: dict[str, object] = {}
            if TUNERS[job.tuner].uses_prior:
                kind = Target.parse(job.target).kind
                kwargs["prior"] = self.global_models.get(
                    template, kind, lambda: _count_records(session, template.name, kind),
                    lambda: _examples(session, template.name, kind))
            tuner = make_tuner(job.tuner, template=template,
                               workload=Workload(template=task.template, args=task.args),
                               limits=limits, seed=job.id * 7919 + task.id, **kwargs)
            self.tuners[key] = tuner
        self.tuners.move_to_end(key)
        while len(self.tuners) > self.max_tuners:
            self.tuners.popitem(last=False)
        return tuner


def _count_records(session: Session, template: str, kind: str) -> int:
    return session.scalar(select(func.count()).select_from(RecordRow).where(
        RecordRow.template == template, RecordRow.target_kind == kind)) or 0


# The global model learns from the newest records up to this many: a fit stays near a
# second (bench/tuning.py) inside the scheduler's pass.
MAX_TRANSFER_RECORDS = 10_000


def _examples(session: Session, template: str, kind: str) -> Iterator[Example]:
    """The newest records of ``template`` on targets of ``kind``: the global model's
    data. A line that no longer parses is skipped."""
    rows = session.execute(select(RecordRow.line, RecordRow.target_model).where(
        RecordRow.template == template, RecordRow.target_kind == kind)
        .order_by(RecordRow.id.desc()).limit(MAX_TRANSFER_RECORDS))
    for line, model in rows:
        try:
            record = Record.from_json(line)
        except ValueError:
            continue
        yield record.workload, record.config, perf_of(record.result), model


def _limits_for(session: Session, job_target: Target) -> DeviceLimits | None:
    """The tightest limits among registered workers that can run this job's trials."""
    name = queue_name(job_target)
    rows = [DeviceLimits.model_validate(w.limits) for w in session.scalars(select(WorkerRow))
            if name in queue_matches(Target.parse(w.target))]
    if not rows:
        return None
    return DeviceLimits(**{f: min(getattr(r, f) for r in rows)
                           for f in DeviceLimits.model_fields})


def _history(session: Session, task_id: int) -> list[tuple[Config, MeasureResult]]:
    rows = session.execute(
        select(TrialRow.config, RecordRow.line).join(RecordRow, RecordRow.trial_id == TrialRow.id)
        .where(TrialRow.task_id == task_id).order_by(RecordRow.id)).all()
    return [(Config.model_validate(c), Record.from_json(line).result) for c, line in rows]


def _stopped_early(task: TaskRow, job: JobRow) -> bool:
    return (job.early_stopping is not None and task.best_trial is not None
            and task.trials_done - task.best_trial >= job.early_stopping)


def _plan_task(session: Session, job: JobRow, task: TaskRow,
               limits: DeviceLimits | None, state: SearchState) -> list[TrialRow]:
    outstanding = session.scalar(select(func.count()).select_from(TrialRow).where(
        TrialRow.task_id == task.id, TrialRow.status.in_(("queued", "leased")))) or 0
    if task.trials_done >= job.n_trial or _stopped_early(task, job):
        task.status = "done"
        if outstanding:  # early stop: the rest of the plan is not needed
            withdraw_queued(session, [task.id])
        return []
    want = min(job.plan_size, job.n_trial - task.trials_planned)
    if outstanding >= job.plan_size or want <= 0:
        return []
    tuner = state.tuner(job, task, limits, session)
    workload = tuner.workload
    visited = set(session.scalars(select(TrialRow.config_index)
                                  .where(TrialRow.task_id == task.id)))
    history = _history(session, task.id) if tuner.needs_history else []
    configs: list[Config] = []
    if not visited:
        # The template's fallback goes first: what an untuned build runs is then always
        # among the candidates, so a tuned build is never slower than an untuned one.
        default = tuner.template.default_config(workload)
        if tuner.fits(default):
            configs.append(default)
            visited.add(default.index)
    if want > len(configs):
        configs += tuner.next_batch(want - len(configs), visited, history)
    if not configs and outstanding == 0:
        task.status = "done"  # the valid space is exhausted
        return []
    queue = queue_name(Target.parse(job.target))
    trials = [TrialRow(task_id=task.id, queue=queue, config=c.to_json(), config_index=c.index,
                       status="queued", attempts=0) for c in configs]
    session.add_all(trials)
    task.trials_planned += len(trials)
    task.status = "running"
    return trials


def plan_once(session: Session, queue: DispatchQueue, state: SearchState | None = None
              ) -> tuple[PassStats, list[TrialRow], list[TrialRow]]:
    """One scheduling pass in the caller's transaction; returns what to tell the queue."""
    state = state or SearchState()
    stats = PassStats()
    if session.get_bind().dialect.name == "postgresql":
        # one planner at a time across API replicas
        if not session.scalar(text("SELECT pg_try_advisory_xact_lock(7355608)")):
            return stats, [], []
    requeued, stats.given_up = dispatch.reclaim_expired(session)
    stats.requeued = len(requeued)
    new: list[TrialRow] = []
    for job in session.scalars(select(JobRow).where(JobRow.status.in_(ACTIVE))):
        limits = _limits_for(session, Target.parse(job.target))
        tasks = list(session.scalars(select(TaskRow).where(TaskRow.job_id == job.id)))
        for task in tasks:
            if task.status in ACTIVE:
                try:
                    new += _plan_task(session, job, task, limits, state)
                except Exception as err:  # a broken task fails its job, not the server
                    log.exception("planning task %s failed", task.id)
                    task.status, job.status, job.error = "failed", "failed", str(err)
        if job.status in ACTIVE:
            if all(t.status == "done" for t in tasks):
                job.status = "done"
            elif any(t.status == "running" for t in tasks):
                job.status = "running"
    session.flush()
    stats.planned = len(new)
    return stats, new, requeued


class Scheduler:
    """Runs ``plan_once`` every ``interval`` seconds in a background thread."""

    def __init__(self, sessions: sessionmaker[Session], queue: DispatchQueue,
                 interval: float = 0.2, on_pass: Callable[[PassStats], None] | None = None):
        self._sessions, self._queue, self._interval = sessions, queue, interval
        self._on_pass = on_pass
        self.search = SearchState()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def run_pass(self) -> PassStats:
        with self._sessions.begin() as session:
            stats, new, requeued = plan_once(session, self._queue, self.search)
        if new:
            self._queue.pushed(new)
        if requeued:
            self._queue.returned(requeued)
        if self._on_pass:
            self._on_pass(stats)
        return stats

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.time()
            try:
                self.run_pass()
            except Exception:  # keep planning: a failed pass is retried next tick
                log.exception("scheduler pass failed")
            self._stop.wait(max(self._interval - (time.time() - start), 0.01))

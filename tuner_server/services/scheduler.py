"""The scheduler: keep a plan of trials queued for every running task, finish tasks at
their budget or on early stopping, and return expired leases. The truth is in the
database, so a restarted server resumes every job where it was; what the scheduler keeps
between passes (tuners, each task's planned and measured configs) only spares it reading
a task whole every pass, and is read again from the database whenever it may be stale.
No one row stops a pass: a job or task that cannot be planned is failed with its reason,
the others go on."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, NamedTuple, TypeVar

import numpy as np
from pydantic import ValidationError
from sqlalchemy import Select, event, func, insert, select, text, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from compiler.templates import get_template
from schemas import DeviceLimits, MeasureErrorNo, Record, Target, Workload
from schemas.api import ACTIVE, FINAL, JobStatus, TaskStatus, TrialStatus
from schemas.text import first_problem
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow
from tuner_server.queue.base import (
    DispatchQueue,
    QueuedTrial,
    queue_name,
)
from tuner_server.search import TUNERS, Tuner, make_tuner
from tuner_server.search.base import Measured, Visited, perf_of, perf_of_columns
from tuner_server.search.transfer import Example, GlobalModels
from tuner_server.services import dispatch
from tuner_server.services.fleet import Fleet, limits_for, registered_fleet
from tuner_server.services.jobs import all_failed, error_counts, withdraw_queued

log = logging.getLogger("tuner.scheduler")
# The database itself failing: the pass fails and is retried; no task is blamed for it.
OUTAGE = (OperationalError, InterfaceError, PoolTimeoutError)
# How often the queue is made to agree with the trials table (Redis: lost tickets).
RESYNC_EVERY_S = 5.0
# A failed task's or job's ``error``, at most.
MAX_REASON = 500
# A condition that persists (a worker row that does not parse) is logged this often.
WARN_EVERY_S = 60.0
# Rounds of a task's verification: each of its configs is measured once a round, and a
# config's verified cost is the median of its rounds. The first VERIFY_MIN_ROUNDS are
# planned at once; one more, up to VERIFY_ROUNDS, only while they leave the winner in
# doubt (``_decided``). Re-measuring with long repeats took 44% of a ResNet-50 tuning's
# wall time (516 of 1,204 measurements, 336 of 766 s; 43 tasks, 16 trials each), and in
# 30 of its 43 tasks one config had led every other by >= 5% in both of the first two
# rounds, the winner of all three every time (docs/BENCHMARKS.md).
VERIFY_MIN_ROUNDS = 2
VERIFY_ROUNDS = 3
VERIFY_MARGIN = 1.05
_T = TypeVar("_T")
# Trial ids in one ``IN (...)`` when a task's pending trials are looked up.
ID_CHUNK = 5000
OUTSTANDING = (TrialStatus.QUEUED, TrialStatus.LEASED)


@dataclass
class PassStats:
    planned: int = 0
    requeued: int = 0
    given_up: int = 0
    resynced: int = 0  # trials the queue's resync queued again
    # rows of trials (and their records) read to bring tasks' search state up to date:
    # what a pass reads grows with the plan, not with a task's age (tests assert it)
    search_rows: int = 0
    tasks_read: int = 0  # tasks whose search state was read whole from the database


@dataclass
class TaskSearch:
    """One task's search as the scheduler keeps it between passes, so that a pass reads
    only what changed: every config index planned, the search trials planned and not
    yet recorded (ids), and, for a tuner that learns, the throughput of each recorded
    one. ``planned`` is the task's ``trials_planned`` this accounts for: any other count
    in the row means someone else planned (another server process) and the task is read
    again whole."""

    planned: int
    visited: Visited
    measured: Measured | None  # None: the task's tuner reads no history
    pending: set[int] = field(default_factory=set)


@dataclass
class SearchState:
    """What the scheduler keeps between passes to search faster; all of it can be lost
    (a restart rebuilds it from the database): the global cost models, each running
    task's tuners (annealing chains, grid's cursor) and search state (:class:`TaskSearch`),
    and which tasks the last pass changed without its commit being seen (``unconfirmed``):
    those are forgotten whole, tuners included, when the next pass begins."""

    global_models: GlobalModels = field(default_factory=GlobalModels)
    # where a global model's fit reads its records apart from the pass (the server's
    # scheduler): the pass never waits for a fit. None: fit in the pass (tests, tools).
    sessions: sessionmaker[Session] | None = None
    tuners: OrderedDict[tuple[int, str], Tuner] = field(default_factory=OrderedDict)
    max_tuners: int = 256
    tasks: OrderedDict[int, TaskSearch] = field(default_factory=OrderedDict)
    # Task states kept, at most: a pass visits tasks in the same order, so with more
    # running tasks than this none is found and each is read whole every pass (logged).
    # Its own cap, apart from the tuners': a state is arrays of the task's planned and
    # measured configs (tens of bytes a trial), and those of tasks that stopped running
    # are dropped at the end of each pass.
    max_tasks: int = 4096
    # tasks whose state the current (or an earlier) pass changed and whose transaction
    # is not known to have committed: forgotten at the next pass unless it did
    unconfirmed: set[int] = field(default_factory=set)
    # the current pass's commit listener and its session: removed when the next begins
    listener: tuple[Session, Callable[[Session], None]] | None = None
    rows_read: int = 0  # PassStats.search_rows, summed over passes
    tasks_read: int = 0
    warned: dict[str, float] = field(default_factory=dict)  # key -> when last logged

    def warn(self, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """Log a condition that recurs every pass once per ``WARN_EVERY_S``, not 300 times
        a minute."""
        now = time.monotonic()
        if now - self.warned.get(key, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        if len(self.warned) > 10_000:
            self.warned.clear()
        self.warned[key] = now
        log.warning(msg, *args, exc_info=exc_info)

    def forget(self, task_id: int) -> None:
        """Drop a task's tuners and search state: it ended, or a failure may have left
        them half-updated."""
        for key in [k for k in self.tuners if k[0] == task_id]:
            del self.tuners[key]
        self.tasks.pop(task_id, None)

    def begin(self, session: Session) -> None:
        """A pass begins in ``session``'s transaction. Tasks changed by a pass whose
        transaction did not commit (rolled back, failed) are forgotten whole: their
        state may hold trials the database does not, and their tuners moved on past
        configs never stored (grid's cursor would skip them). This pass's changes are
        confirmed when its transaction commits."""
        for task_id in self.unconfirmed:
            self.forget(task_id)
        touched: set[int] = set()
        self.unconfirmed = touched
        if self.listener is not None:  # one listener at a time, not one more a pass
            earlier, listener = self.listener
            if event.contains(earlier, "after_commit", listener):
                event.remove(earlier, "after_commit", listener)

        def committed(session: Session) -> None:
            if not session.in_nested_transaction():  # a SAVEPOINT's release is no commit
                touched.clear()
        event.listen(session, "after_commit", committed)
        self.listener = (session, committed)

    def retain(self, running: set[int]) -> None:
        """Forget every task not in ``running`` (cancelled, ended elsewhere): what is
        kept is then only the tasks that a pass may plan again."""
        for task_id in {k[0] for k in self.tuners} | set(self.tasks):
            if task_id not in running:
                self.forget(task_id)

    def task(self, session: Session, task: TaskRow, history: bool) -> TaskSearch:
        """The task's search state, brought up to date: read whole when this process
        has none or it accounts for another count of planned trials than the row's;
        else only the pending trials that ended since are read."""
        self.unconfirmed.add(task.id)
        search = self.tasks.get(task.id)
        if (search is None or search.planned != task.trials_planned
                or (history and search.measured is None)):
            search, rows = _read_task(session, task, history)
            self.tasks[task.id] = search
            self.tasks_read += 1
        else:
            rows = _read_pending(session, search) if history else 0
        self.rows_read += rows
        self.tasks.move_to_end(task.id)
        while len(self.tasks) > self.max_tasks:
            evicted, _ = self.tasks.popitem(last=False)
            self.warn("evicted", "running task %s's search state is dropped: more than "
                      "max_tasks=%d tasks are running, so such tasks are read whole "
                      "every pass", evicted, self.max_tasks)
        return search

    def tuner(self, job: JobRow, task: TaskRow, limits: DeviceLimits | None,
              session: Session) -> Tuner:
        key = (task.id, repr(limits))
        tuner = self.tuners.get(key)
        if tuner is None or tuner.name != job.tuner:
            template = get_template(task.template)
            kwargs: dict[str, object] = {}
            if TUNERS[job.tuner].uses_prior:
                kind = Target.parse(job.target).kind
                apart = self.sessions
                load: Callable[[], Iterable[Example]] = (
                    (lambda: _examples(session, template.name, kind)) if apart is None
                    else (lambda: _examples_apart(apart, template.name, kind)))
                self.global_models.get(
                    template, kind, lambda: _count_records(session, template.name, kind),
                    load, background=apart is not None)
                kwargs["prior"] = self.global_models.latest(template, kind)
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


def _examples_apart(sessions: sessionmaker[Session], template: str,
                    kind: str) -> list[Example]:
    """``_examples`` in a session of its own, read whole (a fit on its own thread)."""
    with sessions() as session:
        return list(_examples(session, template, kind))


def _trial_rows(*where: Any) -> Select[Any]:
    """Trials (id, index, status) with their record's ``mean_cost`` and ``error_no``
    (None while unrecorded), by id: the rows ``_learn`` takes."""
    return (select(TrialRow.id, TrialRow.config_index, TrialRow.status,
                   RecordRow.mean_cost, RecordRow.error_no)
            .outerjoin(RecordRow, RecordRow.trial_id == TrialRow.id)
            .where(*where).order_by(TrialRow.id))


def _read_task(session: Session, task: TaskRow, history: bool) -> tuple[TaskSearch, int]:
    """A task's search state from the database, in one statement (one snapshot: a trial
    recorded meanwhile is either pending or measured, never neither); and the rows read."""
    if not history:
        indices = np.array(session.scalars(select(TrialRow.config_index)
                                           .where(TrialRow.task_id == task.id)).all(),
                           dtype=np.int64)
        return TaskSearch(task.trials_planned, Visited(indices), None), len(indices)
    rows = session.execute(
        _trial_rows(TrialRow.task_id == task.id, TrialRow.verify_round == 0)).all()
    search = TaskSearch(task.trials_planned, Visited(r[1] for r in rows), Measured(),
                        {r[0] for r in rows if r[3] is None and r[2] in OUTSTANDING})
    _learn(search, [r for r in rows if r[3] is not None])
    return search, len(rows)


def _read_pending(session: Session, search: TaskSearch) -> int:
    """Move the task's pending trials that ended since the last pass out of pending:
    the recorded ones into ``measured``; the rows read."""
    ids = sorted(search.pending)
    read = 0
    for start in range(0, len(ids), ID_CHUNK):
        rows = session.execute(_trial_rows(TrialRow.id.in_(ids[start:start + ID_CHUNK]),
                                           TrialRow.status.not_in(OUTSTANDING))).all()
        search.pending.difference_update(r[0] for r in rows)
        _learn(search, [r for r in rows if r[3] is not None])
        read += len(rows)
    return read


def _learn(search: TaskSearch, rows: list[Any]) -> None:
    """Append recorded trials (id, index, status, mean_cost, error_no) to ``measured``."""
    assert search.measured is not None
    if rows:
        search.measured.add([r[1] for r in rows],
                            perf_of_columns(np.array([r[3] for r in rows]),
                                            np.array([r[4] for r in rows])))


def _stopped_early(task: TaskRow, job: JobRow) -> bool:
    return (job.early_stopping is not None and task.best_trial is not None
            and task.trials_done - task.best_trial >= job.early_stopping)


def _reason(err: Exception) -> str:
    """One bounded line saying why planning failed: what a task's ``error`` stores."""
    if isinstance(err, ValidationError):
        said = first_problem(err)
    elif type(err) is KeyError and err.args:
        said = f"missing key {err.args[0]!r}"
    elif isinstance(err, (KeyError, ValueError)):
        said = str(err)
    else:
        said = f"{type(err).__name__}: {err}"
    # stored in a TEXT column: no NUL, control character or lone surrogate survives
    said = "".join(c if c.isprintable() else " " for c in said)
    return " ".join(said.split())[:MAX_REASON] or type(err).__name__


def _end_task(session: Session, task: TaskRow) -> None:
    """A task at its end is done, or failed when every trial it recorded failed."""
    reason = all_failed(error_counts(session, [task.id]))
    task.status, task.error = ((TaskStatus.FAILED, reason) if reason
                               else (TaskStatus.DONE, None))


def _trials_in(session: Session, task_id: int, *statuses: TrialStatus) -> int:
    """The task's trials in these states now (a pass's ``outstanding`` is as it began:
    a sibling's pass may have queued its verification since)."""
    return session.scalar(select(func.count()).select_from(TrialRow).where(
        TrialRow.task_id == task_id, TrialRow.status.in_(statuses))) or 0


def _verification(session: Session, job: JobRow, task: TaskRow) -> list[TrialRow]:
    """The verification of a task whose search ended, in the order a worker is to lease
    it: its ``verify_top`` best distinct configs by recorded cost, then the template's
    default config when the search ran it (the one it planned first, ``default_index``;
    a task from before that was kept: the template's default without device limits), so
    the default competes on equal terms,
    ``VERIFY_MIN_ROUNDS`` rounds of them interleaved, each round's order turned by one
    (c1, c2, c3, d, then c2, c3, d, c1): a drift in the device's speed (load, clocks,
    heat) then falls on every config alike, and no config has the same place in a batch
    every round (``_next_round`` adds a round while they leave the winner in doubt).
    Empty when fewer than two configs qualify: there is nothing to choose between."""
    default = task.default_index
    if default is None:
        workload = Workload(template=task.template, args=task.args)
        default = get_template(task.template).default_config(workload).index
    measured = session.execute(
        select(TrialRow.config_index, TrialRow.config, RecordRow.error_no)
        .join(RecordRow, RecordRow.trial_id == TrialRow.id)
        .where(TrialRow.task_id == task.id, TrialRow.verify_round == 0)
        .order_by(RecordRow.mean_cost, RecordRow.id)).all()
    # a search trial per config (the trials' unique key): no config comes twice
    configs = [(index, config) for index, config, error_no in measured
               if error_no == 0 and index != default][:job.verify_top]
    configs += [(index, config) for index, config, _ in measured if index == default]
    if len(configs) < 2:
        return []
    queue = queue_name(Target.parse(job.target))
    return [TrialRow(task_id=task.id, queue=queue, config=config, config_index=index,
                     status=TrialStatus.QUEUED, attempts=0, verify_round=round_)
            for round_ in range(1, VERIFY_MIN_ROUNDS + 1)
            for index, config in _turned(configs, round_)]


def _turned(configs: Sequence[_T], round_: int) -> list[_T]:
    """A verification round's order: the first round's, turned by one a round. Of a
    ResNet-50 tuning's rounds planned in one order, the last config of the first round
    (always the default) measured 1.16x its fastest round, the others 1.02-1.11x (medians
    over 43 tasks; docs/BENCHMARKS.md)."""
    shift = (round_ - 1) % len(configs)
    return [*configs[shift:], *configs[:shift]]


def _decided(costs: dict[int, list[float | None]]) -> bool:
    """Whether the verification's rounds so far (per config, its cost in each round;
    None: it failed or was given up) name a winner a further round is unlikely to
    change: every config measured in every round, and one ahead of each other by
    ``VERIFY_MARGIN`` in each round (compared within a round, whose configs ran back to
    back, so the device's drift between rounds cancels). The rule ranks that one first
    among this task's verified records: its upper median is below every other's."""
    measured = {index: [c for c in row if c is not None] for index, row in costs.items()}
    if any(len(row) < len(costs[index]) for index, row in measured.items()):
        return False
    lead = min(measured, key=lambda index: max(measured[index]))
    return all(cost >= led * VERIFY_MARGIN
               for index, row in measured.items() if index != lead
               for cost, led in zip(row, measured[lead], strict=True))


def _next_round(session: Session, task: TaskRow) -> list[TrialRow]:
    """One more verification round of a task whose rounds so far are all in, the same
    configs in the first round's order turned (``_turned``); none when they decide the
    winner (``_decided``, on one device: a job for a bare target may have its rounds
    measured on several models, which the rule ranks apart) or the task had
    ``VERIFY_ROUNDS``."""
    rows = session.execute(
        select(TrialRow.config_index, TrialRow.config, TrialRow.verify_round,
               TrialRow.queue, RecordRow.mean_cost, RecordRow.error_no, RecordRow.target)
        .outerjoin(RecordRow, RecordRow.trial_id == TrialRow.id)
        .where(TrialRow.task_id == task.id, TrialRow.verify_round > 0)
        .order_by(TrialRow.verify_round, TrialRow.id)).all()
    rounds = max((row.verify_round for row in rows), default=0)
    if not rows or rounds >= VERIFY_ROUNDS:
        return []
    configs: dict[int, tuple[Any, str]] = {}
    costs: dict[int, list[float | None]] = {}
    for index, config, round_, queue, cost, error_no, _ in rows:
        configs.setdefault(index, (config, queue))
        costs.setdefault(index, [None] * rounds)[round_ - 1] = (
            cost if error_no == MeasureErrorNo.NO_ERROR else None)
    devices = {row.target for row in rows if row.target is not None}
    if len(devices) <= 1 and _decided(costs):
        return []
    return [TrialRow(task_id=task.id, queue=queue, config=config, config_index=index,
                     status=TrialStatus.QUEUED, attempts=0, verify_round=rounds + 1)
            for index, (config, queue) in _turned(list(configs.items()), rounds + 1)]


def _end_search(session: Session, job: JobRow, task: TaskRow) -> Sequence[QueuedTrial]:
    """A task whose search ended (budget, early stopping, space exhausted) is verified
    once its leased search trials are in (``_verify_layer``: with its layer's other
    templates, VERIFYING meanwhile), then ends; a job without verification ends it at
    once."""
    withdraw_queued(session, [task.id])  # early stop: the rest of the plan is not needed
    if job.verify_top <= 0:
        _end_task(session, task)
        return []
    if _trials_in(session, task.id, TrialStatus.LEASED):
        return []  # their results may be among the best
    if not _verification(session, job, task):  # fewer than two configs: nothing to compare
        _end_task(session, task)
        return []
    task.status = TaskStatus.VERIFYING
    return _verify_layer(session, job, task)


def _verify_layer(session: Session, job: JobRow, task: TaskRow) -> list[TrialRow]:
    """The first rounds of the verification (``_verification``) of every task of
    ``task``'s layer (the job's tasks of its args: one a template) that waits for it,
    once none of them is still searching. The build compares the layer's templates by
    their verified costs, so they are measured side by side: the tasks' rounds in
    turn, each round's configs taken in turn across the tasks (best first, defaults
    last), in the order the queue hands them out; a worker times a batch's verification
    trials interleaved (``IsolatedMeasurer.measure_group``). A task with nothing to
    verify ends; one whose plan raises fails, alone. Empty while a task of the layer
    still searches."""
    layer = [t for t in session.scalars(select(TaskRow).where(
        TaskRow.job_id == job.id, TaskRow.status.in_(ACTIVE)).order_by(TaskRow.id))
        if t.args == task.args]
    if any(t.status != TaskStatus.VERIFYING for t in layer):
        return []
    plans: list[list[TrialRow]] = []
    for waiting in layer:
        if _verifying(session, waiting.id):
            continue
        try:
            with session.begin_nested():
                trials = _verification(session, job, waiting)
                if not trials:
                    _end_task(session, waiting)
        except OUTAGE:
            raise
        except Exception as err:  # noqa: BLE001 - this task's failure, not its layer's
            log.exception("job %s task %s failed: %s", job.id, waiting.id, _reason(err))
            _fail_tasks(session, job.id, [waiting.id], _reason(err))
            continue
        if trials:
            plans.append(trials)
    ordered = [trial for round_ in range(1, VERIFY_MIN_ROUNDS + 1)
               for rank in zip_longest(*[[t for t in plan if t.verify_round == round_]
                                         for plan in plans])
               for trial in rank if trial is not None]
    session.add_all(ordered)  # in this order: the queue hands them out by id
    return ordered


def _verifying(session: Session, task_id: int) -> bool:
    """Whether the task's verification is planned (a round queued, leased or in)."""
    return session.scalar(select(TrialRow.id).where(
        TrialRow.task_id == task_id, TrialRow.verify_round > 0).limit(1)) is not None


def _plan_task(session: Session, job: JobRow, task: TaskRow, limits: DeviceLimits | None,
               state: SearchState, outstanding: int) -> Sequence[QueuedTrial]:
    """Plan what the task lacks of a full plan, or end it. ``outstanding``: its trials
    queued or leased when the pass began."""
    if task.status == TaskStatus.VERIFYING:  # a round more while in doubt, else the end
        if outstanding:
            return []
        if not _verifying(session, task.id):  # waiting for its layer to end searching
            return _verify_layer(session, job, task)
        if _trials_in(session, task.id, *OUTSTANDING):  # queued by a sibling this pass
            return []
        again = _next_round(session, task)
        if not again:
            _end_task(session, task)
            return []
        session.add_all(again)  # in this order: the queue hands them out by id
        return again
    if task.trials_done >= job.n_trial or _stopped_early(task, job):
        return _end_search(session, job, task)
    want = min(job.plan_size, job.n_trial - task.trials_planned)
    if outstanding >= job.plan_size or want <= 0:
        return []
    tuner = state.tuner(job, task, limits, session)
    search = state.task(session, task, tuner.needs_history)
    indices = np.empty(0, dtype=np.int64)
    if not len(search.visited):
        # The template's fallback goes first: what an untuned build runs is then always
        # among the candidates, so a tuned build is never slower than an untuned one. It
        # is sized for the devices' lanes (the fewest among the queue's workers), and kept
        # on the task: the verification and the model view read it, whatever registers
        # later.
        # Its algorithm variants follow (``Template.default_variants``): where another
        # Winograd tile wins, the search has it in hand from the first plan.
        template, workload = tuner.template, tuner.workload
        default = template.default_config(workload, limits).index
        firsts = np.array([default, *(c.index for c in
                                      template.default_variants(workload, limits))])
        firsts = _fresh(firsts[tuner.valid(firsts)], search.visited)[:want]
        task.default_index = default if bool((firsts == default).any()) else None
        search.visited.add(firsts)  # the state is dropped if this plan is not stored
        indices = firsts
    if want > len(indices):
        proposed = tuner.propose(want - len(indices), search.visited,
                                 search.measured if search.measured is not None
                                 else Measured())
        fresh = _fresh(proposed, search.visited)
        if len(fresh) < len(proposed):
            state.warn(f"slip {job.tuner}", "tuner %s proposed %d of %d configs twice or "
                       "already planned (task %s); they are left out of the plan",
                       job.tuner, len(proposed) - len(fresh), len(proposed), task.id)
        search.visited.add(fresh)
        indices = np.concatenate([indices, fresh])
    if not len(indices):
        return _end_search(session, job, task) if outstanding == 0 else []
    trials = _insert_trials(session, task, queue_name(Target.parse(job.target)),
                            tuner.space.configs_json(indices), indices.tolist())
    if search.measured is not None:
        search.pending.update(t.id for t in trials)
    search.planned = task.trials_planned = task.trials_planned + len(trials)
    task.status = TaskStatus.RUNNING
    return trials


def _fresh(proposed: np.ndarray, visited: Visited) -> np.ndarray:
    """``proposed`` less repeats and configs already planned, in the order proposed: a
    tuner's slip then costs a shorter plan, not the trials' unique key (which would
    fail the task)."""
    proposed = np.asarray(proposed, dtype=np.int64)
    _, first = np.unique(proposed, return_index=True)
    once = proposed[np.sort(first)]
    return once[~visited.contains(once)]


class Planned(NamedTuple):
    """A trial a plan inserted, as the queue is told of it (an ORM row per trial would
    cost more than the insert)."""

    id: int
    queue: str


# A plan's trials on PostgreSQL: one statement of one JSON text, [[config, index], ...].
# As a multi-row VALUES, a plan of 256 is 1,800 parameters, which SQLAlchemy renders and
# psycopg parses again for every plan (6% of a server's CPU at 2,000 trials/s); as
# arrays, psycopg's dumping of 256 strings cost 4% still.
_PG_INSERT_TRIALS = text(
    "INSERT INTO trials (task_id, queue, config, config_index, status, attempts, verify_round)"
    " SELECT :task_id, :queue, r -> 0, CAST(r ->> 1 AS bigint), :status, 0, 0"
    " FROM json_array_elements(CAST(:rows AS json)) AS r"
    " RETURNING id")


def _insert_trials(session: Session, task: TaskRow, queue: str,
                   configs: list[dict[str, Any]], indices: list[int]) -> list[Planned]:
    """A plan's trials in one INSERT, RETURNING their ids (in no particular order:
    asking for the rows' order makes SQLAlchemy insert row by row on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        ids = session.execute(_PG_INSERT_TRIALS, {
            "task_id": task.id, "queue": queue, "status": str(TrialStatus.QUEUED),
            "rows": json.dumps(list(zip(configs, indices)))}).scalars().all()
    else:
        rows = [{"task_id": task.id, "queue": queue, "config": config, "config_index": index,
                 "status": TrialStatus.QUEUED, "attempts": 0, "verify_round": 0}
                for config, index in zip(configs, indices)]
        ids = session.execute(insert(TrialRow.__table__).returning(TrialRow.__table__.c.id),
                              rows).scalars().all()
    return [Planned(trial_id, queue) for trial_id in sorted(ids)]


def _fail_tasks(session: Session, job_id: int, task_ids: list[int] | None,
                reason: str) -> None:
    """Mark tasks of a job failed (None: all its unfinished tasks) and withdraw their
    queued trials, by UPDATE alone: a row that cannot even be loaded is failed too."""
    where = [TaskRow.job_id == job_id, TaskRow.status.not_in(FINAL)]
    if task_ids is not None:
        where.append(TaskRow.id.in_(task_ids))
    with _guarded(session, f"failing job {job_id}'s tasks"):
        session.execute(update(TaskRow).where(*where)
                        .values(status=TaskStatus.FAILED, error=reason)
                        .execution_options(synchronize_session="fetch"))
        withdraw_queued(session, select(TaskRow.id).where(TaskRow.job_id == job_id,
                                                          TaskRow.status == TaskStatus.FAILED))


@contextmanager
def _guarded(session: Session, what: str) -> Iterator[None]:
    """A write in its own SAVEPOINT: should even marking a failure fail, it is rolled
    back and logged, and the rest of the pass is kept (retried next pass)."""
    try:
        with session.begin_nested():
            yield
    except OUTAGE:
        raise
    except Exception:
        log.exception("%s failed; retried next pass", what)


def _job_failure(session: Session, failed: list[tuple[int, str | None]]) -> str:
    """A failed job's ``error``: its one task's, or the error counts of the tasks whose
    trials all failed and the reasons of the others."""
    if len(failed) == 1:
        return failed[0][1] or "its task failed"
    measured = [task_id for task_id, _ in failed
                if all_failed(error_counts(session, [task_id]))]
    others = [(task_id, error) for task_id, error in failed if task_id not in measured]
    parts = [all_failed(error_counts(session, measured))] if measured else []
    parts += [f"task {task_id}: {error or 'failed'}" for task_id, error in others[:3]]
    if len(others) > 3:
        parts.append(f"and {len(others) - 3} more")
    return f"all {len(failed)} tasks failed: " + "; ".join(p for p in parts if p)


def _settle(session: Session, job: JobRow) -> None:
    """A job whose tasks all ended is done, or failed when every one of them failed; a
    task still verifying keeps it running."""
    rows = session.execute(select(TaskRow.id, TaskRow.status, TaskRow.error)
                           .where(TaskRow.job_id == job.id).order_by(TaskRow.id)).all()
    statuses = [status for _, status, _ in rows]
    if all(status in FINAL for status in statuses):
        failed = [(task_id, error) for task_id, status, error in rows
                  if status == TaskStatus.FAILED]
        if rows and len(failed) == len(rows):
            job.status = JobStatus.FAILED
            job.error = _job_failure(session, failed)[:MAX_REASON]
        else:
            job.status = JobStatus.DONE
    elif TaskStatus.RUNNING in statuses or TaskStatus.VERIFYING in statuses:
        job.status = JobStatus.RUNNING


def _fail_job(session: Session, job_id: int, reason: str) -> list[QueuedTrial]:
    """A job that cannot be planned at all fails with its unfinished tasks."""
    reason = reason[:MAX_REASON]
    log.error("job %s failed: %s", job_id, reason)
    _fail_tasks(session, job_id, None, reason)
    with _guarded(session, f"failing job {job_id}"):
        session.execute(update(JobRow).where(JobRow.id == job_id)
                        .values(status=JobStatus.FAILED, error=reason)
                        .execution_options(synchronize_session="fetch"))
    return []


def _plan_job(session: Session, job_id: int, fleet: Fleet,
              state: SearchState, outstanding: dict[int, int],
              running: set[int]) -> list[QueuedTrial]:
    """Plan one job's tasks, each in a SAVEPOINT: a task that raises is rolled back,
    logged and failed with the reason; its siblings and other jobs go on. A job whose
    row or target cannot be read fails as a whole. Adds the job's running tasks (as the
    pass found them) to ``running``."""
    try:
        with session.begin_nested():
            job = session.get(JobRow, job_id)
            assert job is not None
            # one query for all of them: the loop below finds each in the session
            tasks = list(session.scalars(select(TaskRow).where(
                TaskRow.job_id == job_id, TaskRow.status.in_(ACTIVE)).order_by(TaskRow.id)))
    except OUTAGE:
        raise
    except Exception as err:  # noqa: BLE001 - a row that cannot be read fails its job only
        return _fail_job(session, job_id, f"job {job_id} cannot be read: {_reason(err)}")
    try:
        target = Target.parse(job.target)
    except ValueError as err:
        return _fail_job(session, job_id,
                         f"job target {job.target!r} does not parse: {_reason(err)}")
    limits = limits_for(fleet, target)
    new: list[QueuedTrial] = []
    running.update(t.id for t in tasks)
    for task_id in [t.id for t in tasks]:
        try:
            with session.begin_nested():
                task = session.get(TaskRow, task_id)
                assert task is not None
                planned = _plan_task(session, job, task, limits, state,
                                     outstanding.get(task_id, 0))
                session.flush()  # a row the database refuses is this task's failure
                if task.status in FINAL:
                    state.forget(task_id)
        except OUTAGE:
            raise
        except Exception as err:
            reason = _reason(err)
            log.exception("job %s task %s failed: %s", job_id, task_id, reason)
            state.forget(task_id)
            _fail_tasks(session, job_id, [task_id], reason)
        else:
            new += planned
    try:
        with session.begin_nested():
            _settle(session, job)
            session.flush()
    except OUTAGE:
        raise
    except Exception as err:  # noqa: BLE001 - logged with its traceback; next pass again
        state.warn(f"settle {job_id}", "job %s: settling its status failed (%s); "
                   "retried next pass", job_id, _reason(err), exc_info=True)
    return new


def _reclaim(session: Session, state: SearchState) -> tuple[list[TrialRow], int]:
    """``reclaim_expired`` in a SAVEPOINT: should it raise, planning goes on."""
    try:
        with session.begin_nested():
            requeued, given_up = dispatch.reclaim_expired(session)
            session.flush()
    except OUTAGE:
        raise
    except Exception as err:  # noqa: BLE001 - logged with its traceback; planning goes on
        state.warn("reclaim", "reclaiming expired leases failed (%s); planning goes on",
                   _reason(err), exc_info=True)
        return [], 0
    return requeued, given_up


def _leader(session: Session) -> bool:
    """One planner at a time across API replicas (PostgreSQL): False when another
    replica's scheduler holds the lock for its transaction."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(7355608)")))


def _outstanding(session: Session) -> dict[int, int]:
    """Every task's queued and leased trials, in one query over the few such rows.

    On PostgreSQL through an index scan, not the bitmap scan the planner prefers: each
    trial leaves dead entries for its queued and leased versions in the status indexes
    until a vacuum, and a bitmap scan walks them all every pass without ever marking
    them, where an index scan marks those it finds dead and skips them after (at the end
    of a 100,000-trial job without a vacuum: 16-50 ms a pass against ~1 ms, measured)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres:
        session.execute(text("SET LOCAL enable_bitmapscan = off"))
    counts = dict(session.execute(  # type: ignore[arg-type]
        select(TrialRow.task_id, func.count()).where(TrialRow.status.in_(OUTSTANDING))
        .group_by(TrialRow.task_id)).all())
    if postgres:
        session.execute(text("RESET enable_bitmapscan"))
    return counts


def plan_once(session: Session, queue: DispatchQueue, state: SearchState | None = None
              ) -> tuple[PassStats, list[QueuedTrial], list[TrialRow]]:
    """One scheduling pass in the caller's transaction; returns what to tell the queue.

    No row fails the pass: a job or task that raises is failed with its reason (each
    runs in a SAVEPOINT), a worker row that does not parse is skipped, and a failed
    reclaim is logged. A database outage does fail it (and no task is blamed)."""
    state = state or SearchState()
    stats = PassStats()
    if not _leader(session):
        return stats, [], []
    state.begin(session)
    rows_read, tasks_read = state.rows_read, state.tasks_read
    requeued, stats.given_up = _reclaim(session, state)
    stats.requeued = len(requeued)
    fleet = registered_fleet(session, lambda worker_id, target, err: state.warn(
        f"worker {worker_id}", "worker %s is skipped: its target %r or limits do not "
        "parse: %s", worker_id, target, _reason(err)))
    outstanding = _outstanding(session)
    new: list[QueuedTrial] = []
    running: set[int] = set()
    for job_id in list(session.scalars(select(JobRow.id).where(JobRow.status.in_(ACTIVE))
                                       .order_by(JobRow.id))):
        new += _plan_job(session, job_id, fleet, state, outstanding, running)
    state.retain(running)
    session.flush()
    stats.planned = len(new)
    stats.search_rows = state.rows_read - rows_read
    stats.tasks_read = state.tasks_read - tasks_read
    return stats, new, requeued


class Scheduler:
    """Runs ``plan_once`` every ``interval`` seconds in a background thread, tells the
    queue what it planned and requeued, and has the queue resync with the trials table
    every ``RESYNC_EVERY_S`` (the first pass included: a restart repairs at once).

    ``quiet``: held by a worker of this process while it measures a trial (the
    embedded fleet, whose device is the CPU the server runs on); a pass, and a global
    model's fit, hold it too, so neither runs beside a kernel being timed: a pass fits
    a task's cost model and anneals, a fit takes every core for up to a second."""

    def __init__(self, sessions: sessionmaker[Session], queue: DispatchQueue,
                 interval: float = 0.2, on_pass: Callable[[PassStats], None] | None = None,
                 quiet: AbstractContextManager[object] | None = None):
        self._sessions, self._queue, self._interval = sessions, queue, interval
        self._on_pass = on_pass
        self._quiet = quiet or nullcontext()
        self.search = SearchState(global_models=GlobalModels(quiet=quiet), sessions=sessions)
        self._next_resync = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.search.global_models.wait(10)

    def run_pass(self) -> PassStats:
        with self._sessions.begin() as session:
            stats, new, requeued = plan_once(session, self._queue, self.search)
        # committed: the trials are safe in the database whatever the queue says now
        self._tell("queueing new trials", self._queue.pushed, new)
        self._tell("queueing returned trials", self._queue.returned, requeued)
        now = time.time()
        if now >= self._next_resync:
            self._next_resync = now + RESYNC_EVERY_S
            stats.resynced = self._resync(now)
        if self._on_pass:
            self._on_pass(stats)
        return stats

    def _tell(self, what: str, notify: Callable[[Any], None],
              trials: Sequence[QueuedTrial]) -> None:
        if not trials:
            return
        try:
            notify(trials)
        except Exception as err:  # noqa: BLE001 - a hint: the resync queues them later
            self.search.warn(what, "%s failed (%s); the resync queues them later",
                             what, _reason(err))

    def _resync(self, now: float) -> int:
        try:
            with self._sessions.begin() as session:
                return self._queue.resync(session, now) if _leader(session) else 0
        except Exception as err:  # noqa: BLE001 - Redis or the database down: next time
            self.search.warn("resync", "queue resync failed (%s); retried in %g s",
                             _reason(err), RESYNC_EVERY_S)
            return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.time()
            try:
                with self._quiet:
                    self.run_pass()
            except Exception:  # keep planning: a failed pass is retried next tick
                log.exception("scheduler pass failed")
            self._stop.wait(max(self._interval - (time.time() - start), 0.01))

"""Workers and their leases: register, lease, heartbeat, report, release, deregister,
reclaim. A worker speaks only for its own leases: a result is stored only from the
worker that holds the trial."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy import Float, Row, bindparam, case, func, not_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from schemas import (
    DeviceLimits,
    MeasureErrorNo,
    MeasureOptions,
    MeasureResult,
    Target,
    Workload,
)
from schemas.api import LeasedTrial, TrialStatus
from schemas.record import line_of
from tuner_server.db.models import JobRow, TaskRow, TrialRow, WorkerRow
from tuner_server.queue.base import DispatchQueue, TakenTrial, queue_matches
from tuner_server.services.fleet import alive_clause
from tuner_server.services.records import insert_trial_records, row_of
from tuner_server.services.tokens import bind_worker_token, revoke_worker_tokens

log = logging.getLogger("tuner.dispatch")

# A trial whose lease expired this many times lost as many workers (it may be what
# kills them): it is recorded as failed instead of being handed to another.
MAX_ATTEMPTS = 2
# Trials a refusal names; the rest are counted.
REFUSAL_IDS = 20
# A verification trial is timed longer than a search trial: it decides what the build
# runs, and its configs are near one another in speed, so noise must be smaller than
# their differences. Twice the repeats (a steadier median), and each repeat at least
# twice as long and never under 100 ms (a CPU's frequency and cache state settle; a
# GPU's clocks warm), within the contract's bounds.
VERIFY_REPEAT_FACTOR = 2
VERIFY_MIN_REPEAT_MS = 100.0


def verify_measure(measure: dict[str, Any]) -> dict[str, Any]:
    """A job's measure options as its verification trials use them. Options that do not
    read are handed on as they are: the worker reports that as the trial's failure."""
    try:
        options = MeasureOptions.model_validate(measure)
    except ValidationError:
        return measure
    return options.model_copy(update={
        "repeat": min(options.repeat * VERIFY_REPEAT_FACTOR, 1000),
        "min_repeat_ms": min(max(2.0 * options.min_repeat_ms, VERIFY_MIN_REPEAT_MS),
                             60_000.0),
    }).model_dump()


class WorkerRefused(ValueError):
    """The request conflicts with the worker's state or leases (a 409); nothing changed."""


@dataclass
class ReportCounts:
    accepted: int = 0
    duplicates: int = 0


@dataclass
class Registration:
    """A registered worker, and what taking over a lost worker's row did to its leases
    (for the caller to tell the queue after the commit)."""

    id: int
    token: str  # new, bound to this worker
    requeued: list[TrialRow]  # the lost incarnation's trials, queued again
    failed: list[int]  # ... or failed (error 8): it was the second worker they lost


def register(session: Session, name: str, target: Target, limits: DeviceLimits,
             device: str | None, lease_s: float) -> Registration:
    """Register a worker, with a new token bound to it.

    A worker of the same name and target that is not alive (:func:`alive_clause`:
    deregistered, or not seen within a lease) is this one come back (a restart, the next
    embedded run): its row is reused, so the fleet does not fill with dead rows, and its
    older tokens stop working. Any worker token may take such a row over: the name and
    target are all that identify it. A live namesake is another worker.

    Trials the lost incarnation still held were lost with it: they are handled as
    expired leases now (:func:`expire`: queued again with the attempt counted, or failed
    if it was the second worker they lost), so a trial that killed two workers is still
    failed, not handed to a third."""
    now = time.time()
    worker = session.scalars(
        select(WorkerRow)
        .where(WorkerRow.name == name, WorkerRow.target == str(target),
               not_(alive_clause(now, lease_s)))
        .order_by(WorkerRow.id.desc()).limit(1)
        .with_for_update().execution_options(populate_existing=True)).first()
    requeued: list[TrialRow] = []
    failed: list[int] = []
    if worker is None:
        worker = WorkerRow(name=name, target=str(target))
        session.add(worker)
    else:
        requeued, failed = expire(session, list(session.scalars(
            select(TrialRow).where(TrialRow.worker_id == worker.id,
                                   TrialRow.status == TrialStatus.LEASED)
            .order_by(TrialRow.id).with_for_update())))
    worker.limits, worker.device = limits.model_dump(), device
    worker.last_seen, worker.stopped_at = now, None
    session.flush()
    return Registration(worker.id, bind_worker_token(session, worker.id, name),
                        requeued, failed)


def get_worker(session: Session, worker_id: int) -> WorkerRow | None:
    return session.get(WorkerRow, worker_id)


class SeenWorker(NamedTuple):
    """What a lease or a report reads of its worker (``seen_worker``)."""

    id: int
    name: str
    target: str
    stopped_at: float | None


Worker = WorkerRow | SeenWorker

_WORKERS, _TRIALS, _TASKS, _JOBS = (row.__table__ for row in (WorkerRow, TrialRow,
                                                               TaskRow, JobRow))
# The hot path's statements are built once, on the tables: a statement object keeps its
# cache key, so each call binds values only (building and keying it anew was ~1/10 of
# the worker look-up's CPU under a fleet's load), and the session runs a Core statement
# without the ORM's execution path; rows come back as plain rows, not ORM objects
# (loading those cost more than executing the statements).
_SEEN_WORKER = (update(_WORKERS).where(_WORKERS.c.id == bindparam("worker_id"))
                .values(last_seen=bindparam("now"))
                .returning(_WORKERS.c.id, _WORKERS.c.name, _WORKERS.c.target,
                           _WORKERS.c.stopped_at))
_LEASED_TASKS = (select(_TASKS.c.id, _TASKS.c.template, _TASKS.c.args, _JOBS.c.target,
                        _JOBS.c.measure)
                 .join_from(_TASKS, _JOBS, _JOBS.c.id == _TASKS.c.job_id)
                 .where(_TASKS.c.id.in_(bindparam("ids", expanding=True))))
_REPORTED = (select(_TRIALS.c.id, _TRIALS.c.task_id, _TRIALS.c.status, _TRIALS.c.worker_id,
                    _TRIALS.c.config, _TRIALS.c.config_index, _TRIALS.c.verify_round,
                    _TASKS.c.template, _TASKS.c.args)
             .join_from(_TRIALS, _TASKS, _TASKS.c.id == _TRIALS.c.task_id)
             .where(_TRIALS.c.id.in_(bindparam("ids", expanding=True)))
             .order_by(_TRIALS.c.id).with_for_update(of=_TRIALS))
_DONE = (update(_TRIALS).where(_TRIALS.c.id.in_(bindparam("ids", expanding=True)))
         .values(status=TrialStatus.DONE, error_no=bindparam("error_no"), lease_deadline=None))
# a task's counters after a batch: SET reads the row as it was (trials_done before it)
_COUNTED = (update(_TASKS).where(_TASKS.c.id == bindparam("task_id"))
            .values(trials_done=_TASKS.c.trials_done + bindparam("done")))
_BETTER = _TASKS.c.best_cost.is_(None) | (_TASKS.c.best_cost > bindparam("cost", type_=Float))
_COUNTED_BEST = _COUNTED.values(
    best_cost=case((_BETTER, bindparam("cost", type_=Float)), else_=_TASKS.c.best_cost),
    best_trial=case((_BETTER, _TASKS.c.trials_done + bindparam("position")),
                    else_=_TASKS.c.best_trial))


def seen_worker(session: Session, worker_id: int) -> SeenWorker | None:
    """The worker, its ``last_seen`` set to now: a lease's or a report's look-up. One
    UPDATE ... RETURNING, not a SELECT and, at the next flush, the ORM's unit of work
    writing ``last_seen`` (together ~1/8 of a report's CPU under a fleet's load). The
    caller commits; a refusal rolls it back with the rest."""
    row = session.execute(_SEEN_WORKER, {"worker_id": worker_id, "now": time.time()}
                          ).one_or_none()
    return None if row is None else SeenWorker(*row)


@lru_cache(maxsize=4096)
def _parsed(target: str) -> tuple[Target, tuple[str, ...]]:
    """A worker target and the queues it serves, parsed once per distinct string (every
    lease and report asks; a fleet has few targets; ``Target`` is frozen)."""
    parsed = Target.parse(target)
    return parsed, tuple(queue_matches(parsed))


def served_queues(worker: Worker) -> tuple[str, ...]:
    """The queues the worker serves (``queue_matches`` of its target)."""
    return _served(worker)[1]


def _served(worker: Worker) -> tuple[Target, tuple[str, ...]]:
    """The worker's target and queues, or a refusal saying how to recover (a row written
    before targets were checked to round-trip)."""
    try:
        return _parsed(worker.target)
    except ValueError:
        raise WorkerRefused(f"worker {worker.id}'s target {worker.target[:100]!r} does not "
                            "parse; register again") from None


def lease(session: Session, queue: DispatchQueue, worker: Worker, limit: int,
          lease_s: float) -> tuple[list[LeasedTrial], list[int]]:
    """Lease up to ``limit`` trials for the worker's target (``worker`` as
    ``seen_worker`` read it); caller commits.

    Returns (the trials handed out, ids of trials failed instead). A queue may hand
    over an expired lease before the scheduler reclaims it (Redis's XAUTOCLAIM): a
    trial that has lost MAX_ATTEMPTS workers that way is failed here, not measured."""
    if worker.stopped_at is not None:
        raise WorkerRefused(f"worker {worker.id} deregistered; register again")
    matches = list(served_queues(worker))
    now = time.time()
    trials = queue.lease(session, worker.id, matches, limit, lease_s, now)
    out: list[LeasedTrial] = []
    failed: list[int] = []
    # the trials' tasks and jobs in one query, not two look-ups a trial
    tasks = {task.id: task for task in session.execute(
        _LEASED_TASKS, {"ids": sorted({t.task_id for t in trials})})} if trials else {}
    for trial in trials:
        if trial.attempts > MAX_ATTEMPTS:  # this lease is the one past the limit
            _fail_past_attempts(session, trial)
            failed.append(trial.id)
            continue
        task = tasks[trial.task_id]
        measure = verify_measure(task.measure) if trial.verify_round else task.measure
        out.append(LeasedTrial(trial_id=trial.id, task_id=task.id, template=task.template,
                               args=task.args, config=trial.config, target=task.target,
                               measure=measure, verify_round=trial.verify_round or 0,
                               lease_deadline=trial.lease_deadline))
    return out, failed


def _fail_past_attempts(session: Session, taken: TakenTrial) -> None:
    """A trial a queue handed over past MAX_ATTEMPTS (see :func:`lease`) recorded as
    failed: it lost the workers before this one, not this one (it never held it)."""
    trial = session.get(TrialRow, taken.id, populate_existing=True)
    assert trial is not None  # the lease's UPDATE just returned it
    trial.worker_id = None
    _fail_lost(session, trial, trial.attempts - 1)


def _held(session: Session, worker: WorkerRow, trial_ids: list[int], refused: str
          ) -> list[TrialRow]:
    """The trials of ``trial_ids`` leased to this worker, locked in id order. Those it
    finished (or that were cancelled while it held them) are left out: a beat or a
    release racing its own report is harmless. Any other id (unknown, queued, leased to
    or measured by another worker) raises :class:`WorkerRefused` (``refused`` heads it)."""
    trials = list(session.scalars(
        select(TrialRow).where(TrialRow.id.in_(sorted(set(trial_ids)))).order_by(TrialRow.id)
        .with_for_update().execution_options(populate_existing=True)))
    found = {t.id: t for t in trials}
    reasons = {i: _refusal(found.get(i), worker) for i in dict.fromkeys(trial_ids)
               if (t := found.get(i)) is None or t.worker_id != worker.id
               or t.status not in (TrialStatus.LEASED, TrialStatus.DONE,
                                   TrialStatus.CANCELLED)}
    if reasons:
        raise WorkerRefused(_refused(reasons, refused))
    return [t for t in trials if t.status == TrialStatus.LEASED]


def heartbeat(session: Session, worker: WorkerRow, trial_ids: list[int],
              lease_s: float) -> int:
    """Extend the leases of these trials; returns how many. Raises
    :class:`WorkerRefused` (nothing extended) when one is not this worker's (see
    :func:`_held`): the worker should stop measuring it."""
    now = time.time()
    worker.last_seen = now
    trials = _held(session, worker, trial_ids, "heartbeat refused, nothing extended")
    for trial in trials:
        trial.lease_deadline = now + lease_s
    return len(trials)


def release(session: Session, worker: WorkerRow, trial_ids: list[int] | None
            ) -> list[TrialRow]:
    """Give trials back unmeasured (a worker shutting down): not a failed attempt.

    ``None``: every trial the worker holds. Raises :class:`WorkerRefused` (nothing
    released) when a trial named is not this worker's (see :func:`_held`)."""
    if trial_ids is None:
        trials = list(session.scalars(
            select(TrialRow).where(TrialRow.worker_id == worker.id, TrialRow.status == TrialStatus.LEASED)
            .order_by(TrialRow.id).with_for_update()))
    else:
        trials = _held(session, worker, trial_ids, "release refused, nothing released")
    for trial in trials:
        trial.status, trial.worker_id, trial.lease_deadline = TrialStatus.QUEUED, None, None
        trial.attempts = max(trial.attempts - 1, 0)
    return trials


def deregister(session: Session, worker: WorkerRow) -> list[TrialRow]:
    """The worker stops (SIGTERM): its leases go back to the queue uncounted, it shows
    stopped, and its tokens stop working. Returns the trials it gave back. The worker's
    row is written before its trials are locked, the order a lease, report or heartbeat
    takes them in: taken the other way, a deregistration racing the worker's own report
    could deadlock on PostgreSQL."""
    worker.stopped_at = time.time()
    session.flush()
    trials = release(session, worker, None)
    revoke_worker_tokens(session, worker.id)
    return trials


# a trial as its report read it (a row of the report's SELECT) or an ORM row (an expired
# lease recorded as failed): its id, task_id, config, config_index and verify_round
StoredTrial = TrialRow | Row[Any]
Outcome = tuple[StoredTrial, MeasureResult, str, dict[str, Any] | None]  # + device target


TaskParts = tuple[str, list[Any]]  # a task row's template and args


def _store(session: Session, outcomes: list[Outcome],
           tasks: dict[int, TaskParts] | None = None) -> set[int]:
    """Record these trials' results and update their tasks; the ids of the trials
    stored. A trial whose record another report stored first (its ``trial_id``, or an
    identical line) is skipped by the INSERT itself (ON CONFLICT DO NOTHING: no
    savepoint and no second try, ~1/10 of a report's statements) and left as it is. A
    record carries the measuring device's target (``opencl -model=pocl-cpu``), not the
    job's (which may be a bare ``opencl``). Task counters end as one-at-a-time updates
    would leave them: the first of equal costs is the best. A verification trial's
    record is marked with its config (``verified_config``) and counts in no counter: the
    budget, the best cost and early stopping are the search's. Raises ValueError
    (nothing stored) when a trial's task row does not decode into a workload; a trial's
    config goes into the line as the scheduler stored it (``ConfigSpace.configs_json``).
    ``tasks``: the trials' tasks' template and args by task id, when the caller read them.
    """
    if tasks is None:
        tasks = {task_id: (template, args) for task_id, template, args in session.execute(
            select(TaskRow.id, TaskRow.template, TaskRow.args)
            .where(TaskRow.id.in_(sorted({t.task_id for t, *_ in outcomes}))))}
    # each task's workload and each target parsed once a report, not once a trial
    workloads = {task_id: Workload(template=tasks[task_id][0], args=tasks[task_id][1])
                 for task_id in {t.task_id for t, *_ in outcomes}}
    targets = {text: Target.parse(text) for text in {target for _t, _r, target, _i in outcomes}}
    # each line straight from its parts: the config as the scheduler stored it (the
    # space's ``to_json``), the result and info as the request's validation left them
    rows = []
    for trial, result, target, info in outcomes:
        workload, parsed = workloads[trial.task_id], targets[target]
        line = line_of(str(parsed), workload, trial.config, result, info)
        rows.append(dict(row_of(parsed, workload, line, result, verified_config=(
            trial.config_index if trial.verify_round else None)), trial_id=trial.id))
    # Core statements on the tables: the ORM's bulk paths cost more than the rows here
    stored = insert_trial_records(session, rows)
    outcomes = [outcome for outcome in outcomes if outcome[0].id in stored]
    # the trials done in one statement per error number, not one UPDATE each; an ORM
    # copy of one (an expired lease's) is set to match, as loaded (nothing to flush)
    by_error: dict[int, list[int]] = {}
    for trial, result, _target, _info in outcomes:
        by_error.setdefault(int(result.error_no), []).append(trial.id)
        if isinstance(trial, TrialRow):
            for name, value in (("status", TrialStatus.DONE),
                                ("error_no", int(result.error_no)), ("lease_deadline", None)):
                set_committed_value(trial, name, value)
    for error_no, ids in sorted(by_error.items()):
        session.execute(_DONE, {"ids": ids, "error_no": error_no})
    per_task: dict[int, list[Any]] = {}  # task id -> [count, best cost, its position]
    for trial, result, _target, _info in outcomes:
        if trial.verify_round:
            continue
        entry = per_task.setdefault(trial.task_id, [0, None, None])
        entry[0] += 1
        if result.ok and (entry[1] is None or result.mean_cost < entry[1]):
            entry[1], entry[2] = result.mean_cost, entry[0]
    # Core UPDATEs (the ORM's bulk-update path cost a report ~3% of its CPU); a task row
    # this session holds (a scheduler pass's) is expired, to be read again if used
    for task_id in sorted(per_task):
        done, cost, position = per_task[task_id]
        if cost is None:
            session.execute(_COUNTED, {"task_id": task_id, "done": done})
        else:
            session.execute(_COUNTED_BEST, {"task_id": task_id, "done": done, "cost": cost,
                                            "position": position})
        held = session.identity_map.get(identity_key(TaskRow, task_id))
        if held is not None:
            session.expire(held, ["trials_done", "best_cost", "best_trial"])
    return stored


def _refusal(trial: StoredTrial | None, worker: Worker) -> str:
    """Why this worker may not report this trial (what follows "trial N is")."""
    if trial is None:
        return ""
    if trial.status == TrialStatus.LEASED:
        return f"leased to worker {trial.worker_id}"
    return f"{trial.status}, not leased to worker {worker.id}"


def _refused(reasons: dict[int, str], head: str = "results refused, nothing stored") -> str:
    """One sentence naming the first REFUSAL_IDS trials, grouped by reason."""
    groups: dict[str, list[int]] = {}
    for trial_id in list(reasons)[:REFUSAL_IDS]:
        groups.setdefault(reasons[trial_id], []).append(trial_id)
    parts = []
    for why, ids in groups.items():
        many = len(ids) > 1
        named = f"trial{'s' if many else ''} {', '.join(map(str, ids))}"
        verb = ("do not exist" if many else "does not exist") if not why else (
            f"{'are' if many else 'is'} {why}")
        parts.append(f"{named} {verb}")
    more = len(reasons) - REFUSAL_IDS
    return (f"{head}: {'; '.join(parts)}"
            + (f"; and {more} more" if more > 0 else ""))


def report(session: Session, worker: Worker,
           results: list[tuple[int, MeasureResult, dict[str, Any] | None]]) -> ReportCounts:
    """Store results for trials leased to this worker, each once.

    A repeat of a result this worker already stored (or of a trial cancelled while it
    held it) is a duplicate, so retries are safe. Any other trial (unknown, queued,
    leased to or measured by another worker) refuses the whole request: nothing is
    stored. The trials are locked in one SELECT (id order; their tasks' template and
    args come with them) and stored as one batch; a trial whose record (or an identical
    line) was stored first is skipped by the INSERT and counted a duplicate. ``worker``
    as ``seen_worker`` read it."""
    target = str(_served(worker)[0])
    counts = ReportCounts()
    ids = sorted({trial_id for trial_id, _result, _info in results})
    trials: dict[int, StoredTrial] = {}
    tasks: dict[int, TaskParts] = {}
    try:
        for trial in session.execute(_REPORTED, {"ids": ids}) if ids else ():
            trials[trial.id] = trial
            tasks[trial.task_id] = (trial.template, trial.args)
    except ValueError as err:  # a task's args that do not read as JSON (SQLite's TEXT)
        raise _undecodable(err) from None
    fresh: list[Outcome] = []
    taken: set[int] = set()
    refused: dict[int, str] = {}
    for trial_id, result, info in results:
        trial = trials.get(trial_id)
        if trial_id in taken or (trial is not None and trial.worker_id == worker.id
                                 and trial.status in (TrialStatus.DONE,
                                                      TrialStatus.CANCELLED)):
            counts.duplicates += 1
        elif (trial is None or trial.status != TrialStatus.LEASED
              or trial.worker_id != worker.id):
            refused[trial_id] = _refusal(trial, worker)
        else:
            taken.add(trial_id)
            fresh.append((trial, result, target, dict(info or {}, worker=worker.name)))
    if refused:
        raise WorkerRefused(_refused(refused))
    if not fresh:
        return counts
    try:
        stored = _store(session, fresh, tasks)
    except ValueError as err:
        raise _undecodable(err) from None
    counts.accepted += len(stored)
    counts.duplicates += len(fresh) - len(stored)  # stored first (or identical lines)
    return counts


def _undecodable(err: ValueError) -> WorkerRefused:
    return WorkerRefused(f"results refused, nothing stored: a trial's task does not "
                         f"decode ({str(err)[:200]})")


def _fail_lost(session: Session, trial: TrialRow, lost: int) -> bool:
    """Record a trial that lost ``lost`` workers (their leases expired) as failed, error
    8; False when a concurrent report stored it first (or an identical line is stored).
    The record's target is its last worker's, else the job's, else the trial's queue:
    the first that parses. A trial whose failure cannot be recorded (a corrupt row) is
    set aside as done with error 8 and no record: it neither stops the caller nor comes
    back."""
    times = "twice" if lost == 2 else f"{lost} times"
    result = MeasureResult.failure(MeasureErrorNo.UNKNOWN_ERROR,
                                   f"lease expired {times}: it lost {lost} workers")
    worker = session.get(WorkerRow, trial.worker_id) if trial.worker_id else None
    task = session.get(TaskRow, trial.task_id)
    job = session.get(JobRow, task.job_id) if task else None
    why = "no target of it parses"
    for text in (worker.target if worker else None, job.target if job else None,
                 trial.queue):
        if text is None:
            continue
        try:
            target = str(Target.parse(text))
        except ValueError:
            continue
        try:
            parts = {task.id: (task.template, task.args)} if task is not None else None
            return bool(_store(session, [(trial, result, target, None)], parts))
        except ValueError as err:  # its task does not decode
            why = str(err)[:200]
            break
    log.error("trial %s lost %s workers; its failure cannot be recorded: %s",
              trial.id, lost, why)
    trial.status, trial.lease_deadline = TrialStatus.DONE, None
    trial.error_no = int(MeasureErrorNo.UNKNOWN_ERROR)
    return True


def expire(session: Session, trials: list[TrialRow]) -> tuple[list[TrialRow], list[int]]:
    """These leased trials lost their worker (the lease expired, or the worker came
    back as a new process): each goes back to the queue with the attempt counted, or,
    the second worker it lost, is recorded as failed (error 8). Returns (trials
    requeued, ids of trials failed)."""
    requeued, failed = [], []
    for trial in trials:
        if trial.attempts < MAX_ATTEMPTS:
            trial.status, trial.worker_id, trial.lease_deadline = (TrialStatus.QUEUED, None,
                                                                   None)
            requeued.append(trial)
        elif _fail_lost(session, trial, trial.attempts):
            failed.append(trial.id)
    return requeued, failed


def reclaim_expired(session: Session, now: float | None = None) -> tuple[list[TrialRow], int]:
    """Expired leases go back to the queue; a trial whose lease expired twice is
    recorded as failed (error 8) instead. Returns (trials requeued, trials given up)."""
    now = time.time() if now is None else now
    requeued, failed = expire(session, list(session.scalars(select(TrialRow).where(
        TrialRow.status == TrialStatus.LEASED, TrialRow.lease_deadline < now)
        .with_for_update())))
    return requeued, len(failed)


def workers_alive(session: Session, lease_s: float) -> int:
    """Workers that serve (:func:`alive_clause` with the server's lease ``lease_s``)."""
    return session.scalar(select(func.count()).select_from(WorkerRow)
                          .where(alive_clause(time.time(), lease_s))) or 0

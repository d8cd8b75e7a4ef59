"""The dispatch queue interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import Row, bindparam, func, select, update
from sqlalchemy.orm import Session

from schemas import Target
from schemas.api import TrialStatus
from tuner_server.db.models import TrialRow
from tuner_server.queue.notify import Broker, LeaseHub, counts_of


def queue_matches(worker_target: Target) -> list[str]:
    """Queues a worker serves: its exact target, then its model, then its bare kind.

    A job for ``cuda`` runs on any CUDA worker; one for ``cuda -model=h200`` only on H200s.
    """
    names = [str(worker_target), f"{worker_target.kind} -model={worker_target.model}",
             worker_target.kind]
    return list(dict.fromkeys(names))


def queue_name(job_target: Target) -> str:
    model = job_target.option("model")
    return f"{job_target.kind} -model={model}" if model else job_target.kind


class QueuedTrial(Protocol):
    """What a queue reads of a trial it is told of: a trials row, or the scheduler's
    lighter note of one it planned (``scheduler.Planned``)."""

    @property
    def id(self) -> int: ...

    @property
    def queue(self) -> str: ...


class QueueUnavailable(RuntimeError):
    """The queue's backend does not answer (Redis down): a 503, not a 500."""


class DispatchQueue(ABC):
    """Leases queued trials to workers; expired leases go back to the queue.

    ``hub`` parks this process's waiting leases (``notify.LeaseHub``): ``pushed`` and
    ``returned`` wake them at once; other processes' pushes reach them through
    ``broker`` (if the backend has one) and a shared check every ``check_every_s``."""

    def __init__(self, check_every_s: float, broker: Broker | None = None) -> None:
        self.hub = LeaseHub(check_every_s, broker)

    def _arrived(self, trials: Sequence[QueuedTrial]) -> None:
        """Wake this process's waiters for trials now queued (after the commit)."""
        if trials:
            self.hub.wake(counts_of(t.queue for t in trials))

    def ping(self) -> None:
        """Raise :class:`QueueUnavailable` unless the queue's backend answers."""

    # pushed, finished and returned are hints sent after the commit: they never raise
    # for an outage of the queue's backend (the database already holds the truth);
    # ``resync`` repairs whatever they missed.

    @abstractmethod
    def pushed(self, trials: Sequence[QueuedTrial]) -> None:
        """Trials were committed as queued (called after the commit)."""

    @abstractmethod
    def lease(self, session: Session, worker_id: int, queues: list[str], limit: int,
              lease_s: float, now: float) -> list[TakenTrial]:
        """Mark up to ``limit`` queued trials leased to ``worker_id`` (``take_many``);
        caller commits."""

    @abstractmethod
    def finished(self, trial_ids: list[int]) -> None:
        """Trials were recorded (called after the commit)."""

    @abstractmethod
    def returned(self, trials: list[TrialRow]) -> None:
        """Trials went back to queued (released or expired; called after the commit)."""

    @abstractmethod
    def resync(self, session: Session, now: float) -> int:
        """Make the queue agree with the trials table again: every queued trial gets a
        live ticket (one lost in an outage, or taken by a lease that never committed).
        Run by the scheduler every few seconds and at startup; ``now`` is its clock
        (unix seconds). Returns how many trials were queued again; raises
        :class:`QueueUnavailable` when the backend does not answer."""

    def depth(self, session: Session) -> int:
        return session.scalar(select(func.count()).select_from(TrialRow)
                              .where(TrialRow.status == TrialStatus.QUEUED)) or 0


_TRIALS = TrialRow.__table__
# Built once (a statement object keeps its cache key: each lease binds values only);
# Core on the table, so the session runs it without the ORM's execution path
_TAKE = (update(_TRIALS)
         .where(_TRIALS.c.id.in_(bindparam("ids", expanding=True)),
                (_TRIALS.c.status == TrialStatus.QUEUED)
                | ((_TRIALS.c.status == TrialStatus.LEASED)
                   & (_TRIALS.c.lease_deadline < bindparam("now"))))
         .values(status=TrialStatus.LEASED, worker_id=bindparam("worker_id"),
                 lease_deadline=bindparam("deadline"), attempts=_TRIALS.c.attempts + 1)
         .returning(*_TRIALS.c))

# A trial as a lease took it: the trials table's columns, read only (a Core row)
TakenTrial = Row[Any]


def take_many(session: Session, trial_ids: list[int], worker_id: int, lease_s: float,
              now: float) -> list[TakenTrial]:
    """Lease those of these trials that are free (queued, or leased past their deadline)
    in one statement: the guard that keeps a trial from being handed out twice whatever
    a queue's tickets say. The trials it leased, in id order, read back by the UPDATE
    itself (RETURNING), not by a second SELECT, as plain rows: loading them as ORM
    objects cost more CPU than the statement (a caller that changes one loads it). Any
    copy of these trials the session holds is stale after it."""
    if not trial_ids:
        return []
    return sorted(session.execute(_TAKE, {"ids": sorted(set(trial_ids)), "now": now,
                                          "worker_id": worker_id,
                                          "deadline": now + lease_s}),
                  key=lambda trial: trial.id)

"""The dispatch queue interface."""

from __future__ import annotations

from abc import ABC, abstractmethod

from sqlalchemy.orm import Session

from schemas import Target
from tuner_server.db.models import TrialRow


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


class DispatchQueue(ABC):
    """Leases queued trials to workers; expired leases go back to the queue."""

    @abstractmethod
    def pushed(self, trials: list[TrialRow]) -> None:
        """Trials were committed as queued (called after the commit)."""

    @abstractmethod
    def lease(self, session: Session, worker_id: int, queues: list[str], limit: int,
              lease_s: float, now: float) -> list[TrialRow]:
        """Mark up to ``limit`` queued trials leased to ``worker_id``; caller commits."""

    @abstractmethod
    def finished(self, trial_ids: list[int]) -> None:
        """Trials were recorded (called after the commit)."""

    @abstractmethod
    def returned(self, trials: list[TrialRow]) -> None:
        """Trials went back to queued (released or expired; called after the commit)."""

    @abstractmethod
    def depth(self, session: Session) -> int: ...

"""Row leases in the database: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so many API
replicas can lease at once without handing a trial out twice. Waiting leases of other
processes learn of new trials from one shared check per process (``notify``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.api import TrialStatus
from tuner_server.db.models import TrialRow
from tuner_server.queue.base import DispatchQueue, QueuedTrial, TakenTrial, take_many

# Another server process's pushes reach this one's waiting leases through the shared
# check of the trials table (one query for all of them) this often.
CHECK_EVERY_S = 0.1


class SqlQueue(DispatchQueue):
    def __init__(self, check_every_s: float = CHECK_EVERY_S) -> None:
        super().__init__(check_every_s)

    def pushed(self, trials: Sequence[QueuedTrial]) -> None:
        self._arrived(trials)  # queued rows are the queue: only the waiters to wake

    def lease(self, session: Session, worker_id: int, queues: list[str], limit: int,
              lease_s: float, now: float) -> list[TakenTrial]:
        stmt = (select(TrialRow)
                .where(TrialRow.status == TrialStatus.QUEUED, TrialRow.queue.in_(queues))
                .order_by(TrialRow.id).limit(limit))
        if session.get_bind().dialect.name == "postgresql":
            stmt = stmt.with_for_update(skip_locked=True)
        return take_many(session, list(session.scalars(stmt.with_only_columns(TrialRow.id))),
                         worker_id, lease_s, now)

    def finished(self, trial_ids: list[int]) -> None:
        pass

    def returned(self, trials: list[TrialRow]) -> None:
        self._arrived(trials)

    def resync(self, session: Session, now: float) -> int:
        return 0  # the queued rows are the queue: nothing to repair

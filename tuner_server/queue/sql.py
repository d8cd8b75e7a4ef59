"""Row leases in the database: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so many API
replicas can lease at once without handing a trial out twice."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_server.db.models import TrialRow
from tuner_server.queue.base import DispatchQueue, take


class SqlQueue(DispatchQueue):
    def pushed(self, trials: list[TrialRow]) -> None:
        pass  # queued rows are the queue

    def lease(self, session: Session, worker_id: int, queues: list[str], limit: int,
              lease_s: float, now: float) -> list[TrialRow]:
        stmt = (select(TrialRow)
                .where(TrialRow.status == "queued", TrialRow.queue.in_(queues))
                .order_by(TrialRow.id).limit(limit))
        if session.get_bind().dialect.name == "postgresql":
            stmt = stmt.with_for_update(skip_locked=True)
        trials = list(session.scalars(stmt))
        got = [t.id for t in trials if take(session, t.id, worker_id, lease_s, now)]
        for trial in trials:
            session.refresh(trial)
        return [t for t in trials if t.id in got]

    def finished(self, trial_ids: list[int]) -> None:
        pass

    def returned(self, trials: list[TrialRow]) -> None:
        pass

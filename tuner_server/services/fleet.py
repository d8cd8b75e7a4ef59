"""The worker fleet at a glance: each worker's heartbeat, pace and error rate, from
aggregate queries (what the workers route, the dashboard and `tuner workers` show), and
the queues and device limits of the registered workers (what the scheduler plans for)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, Text, and_, case, cast, func, select
from sqlalchemy.orm import Session

from schemas import DeviceLimits, Target
from schemas.api import TrialStatus, WorkerInfo
from tuner_server.db.models import RecordRow, TrialRow, WorkerRow
from tuner_server.queue.base import queue_matches, queue_name

# Pace and error rate are over the results of the last 10 minutes.
WINDOW_S = 600.0


def alive_clause(now: float, lease_s: float) -> ColumnElement[bool]:
    """The one rule for a live worker, in SQL: not deregistered, and seen (a lease,
    heartbeat or report) within the server's lease ``lease_s`` of ``now``. A busy worker
    beats at a third of the lease and an idle one long-polls every few seconds, so a
    worker past it is lost. The worker list, a job's "waiting for a worker" and /metrics
    all count by it."""
    return and_(WorkerRow.stopped_at.is_(None), WorkerRow.last_seen >= now - lease_s)


def _device(worker: WorkerRow) -> str:
    if worker.device:
        return worker.device
    try:
        return Target.parse(worker.target).model
    except ValueError:
        return "unknown"


def list_workers(session: Session, lease_s: float, now: float | None = None
                 ) -> list[WorkerInfo]:
    """Every registered worker, the newest row first; ``alive`` by :func:`alive_clause`
    with the server's lease ``lease_s``.

    Counts come from two GROUP BY queries: done trials through ``ix_trials_worker``, the
    last 10 minutes' results through ``ix_records_created_at``, so neither reads the
    whole records table."""
    now = time.time() if now is None else now
    done = {worker_id: int(n) for worker_id, n in session.execute(
        select(TrialRow.worker_id, func.count())
        .where(TrialRow.worker_id.is_not(None), TrialRow.status == TrialStatus.DONE)
        .group_by(TrialRow.worker_id))}
    cutoff = datetime.fromtimestamp(now - WINDOW_S, UTC)
    # Grouped by ``worker_id + 0``, not the bare column: SQLite would otherwise walk
    # ix_trials_worker (every trial ever run) instead of the recent records' range.
    by_worker = (TrialRow.worker_id + 0).label("worker")
    recent = {worker_id: (int(n), int(failed or 0)) for worker_id, n, failed in session.execute(
        select(by_worker, func.count(), func.sum(case((RecordRow.error_no != 0, 1), else_=0)))
        .select_from(RecordRow).join(TrialRow, TrialRow.id == RecordRow.trial_id)
        .where(RecordRow.created_at >= cutoff)
        .group_by(by_worker))}
    out = []
    for worker, alive in session.execute(
            select(WorkerRow, alive_clause(now, lease_s)).order_by(WorkerRow.id.desc())):
        n, failed = recent.get(worker.id, (0, 0))
        out.append(WorkerInfo(
            id=worker.id, name=worker.name, target=worker.target, device=_device(worker),
            last_heartbeat=worker.last_seen,
            alive=bool(alive),
            stopped=worker.stopped_at is not None,
            trials_per_minute=n / (WINDOW_S / 60), error_rate=failed / n if n else None,
            trials_done=int(done.get(worker.id, 0))))
    return out


# (queues a worker serves, its device's limits), once per distinct pair
Fleet = list[tuple[list[str], DeviceLimits]]


def registered_fleet(session: Session,
                     skipped: Callable[[int, str, Exception], None]) -> Fleet:
    """The queues and limits of the registered (not deregistered) workers, once per
    distinct (target, limits): a fleet of 1,000 alike workers is parsed once a pass, not
    1,000 times (that was most of a pass's CPU). A pair that does not parse is skipped
    (``skipped(first worker id, target, error)``): those workers serve nothing."""
    fleet = []
    limits_text = cast(WorkerRow.limits, Text)
    for worker_id, target, limits in session.execute(
            select(func.min(WorkerRow.id), WorkerRow.target, limits_text)
            .where(WorkerRow.stopped_at.is_(None))
            .group_by(WorkerRow.target, limits_text).order_by(func.min(WorkerRow.id))):
        try:
            fleet.append((queue_matches(Target.parse(target)),
                          DeviceLimits.model_validate(json.loads(limits))))
        except (ValueError, TypeError) as err:
            skipped(worker_id, target, err)
    return fleet


def limits_for(fleet: Fleet, job_target: Target) -> DeviceLimits | None:
    """The tightest limits among registered workers that can run this job's trials. Their
    fewest SIMD lanes too: every PoCL CPU shares one queue, so a queue of AVX2 and
    AVX-512 workers plans (and verifies) the 8-lane default, which runs on all of them,
    though an untuned build on the AVX-512 ones runs their 16-lane default."""
    name = queue_name(job_target)
    rows = [limits for queues, limits in fleet if name in queues]
    if not rows:
        return None
    return DeviceLimits(**{f: min(getattr(r, f) for r in rows)
                           for f in DeviceLimits.model_fields})

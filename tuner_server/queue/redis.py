"""Redis Streams dispatch: a stream per target queue, one consumer group, a consumer per
worker. A stream entry is a ticket for a trial; the trials table decides whether the
ticket is still good (see ``take``), so a lost or doubled ticket never loses or doubles
a trial. Tickets of a dead worker are taken over with XAUTOCLAIM once idle past the lease.
"""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_server.db.models import TrialRow
from tuner_server.queue.base import DispatchQueue, QueueUnavailable, take_many

GROUP = "workers"


class RedisQueue(DispatchQueue):
    def __init__(self, url: str, prefix: str = "tuner") -> None:
        self._redis = redis.Redis.from_url(url, decode_responses=True)
        self._prefix = prefix
        self._groups: set[str] = set()

    def ping(self) -> None:
        try:
            self._redis.ping()
        except redis.RedisError as err:
            raise QueueUnavailable(f"redis: {err}") from None

    def _stream(self, queue: str) -> str:
        return f"{self._prefix}:q:{queue}"

    @property
    def _entries(self) -> str:
        return f"{self._prefix}:entries"  # trial id -> "stream entry-id"

    def _ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        self._groups.add(stream)

    def _add(self, trials: list[TrialRow]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        streams = []
        for trial in trials:
            stream = self._stream(trial.queue)
            self._ensure_group(stream)
            pipe.xadd(stream, {"trial": trial.id})
            streams.append((trial.id, stream))
        ids = pipe.execute()
        self._redis.hset(self._entries, mapping={
            str(trial_id): f"{stream} {entry}" for (trial_id, stream), entry in zip(streams, ids)})

    def pushed(self, trials: list[TrialRow]) -> None:
        if trials:
            self._add(trials)

    def returned(self, trials: list[TrialRow]) -> None:
        if trials:
            self._add(trials)

    def _drop(self, tickets: list[tuple[str, str]]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for stream, entry in tickets:
            pipe.xack(stream, GROUP, entry)
            pipe.xdel(stream, entry)
        pipe.execute()

    def lease(self, session: Session, worker_id: int, queues: list[str], limit: int,
              lease_s: float, now: float) -> list[TrialRow]:
        consumer = f"worker-{worker_id}"
        tickets: list[tuple[str, str, int]] = []
        for queue in queues:
            stream = self._stream(queue)
            self._ensure_group(stream)
            want = limit - len(tickets)
            if want <= 0:
                break
            # tickets a lost worker held past its lease first, then new ones
            _next, claimed, *_ = self._redis.xautoclaim(
                stream, GROUP, consumer, min_idle_time=int(lease_s * 1000), count=want)
            tickets += [(stream, entry, int(fields["trial"])) for entry, fields in claimed
                        if fields]
            want = limit - len(tickets)
            if want > 0:
                for _stream, entries in self._redis.xreadgroup(
                        GROUP, consumer, {stream: ">"}, count=want) or []:
                    tickets += [(stream, entry, int(fields["trial"]))
                                for entry, fields in entries]
        got = take_many(session, [trial_id for _s, _e, trial_id in tickets], worker_id,
                        lease_s, now)
        leased: dict[int, None] = {}
        stale = []
        for stream, entry, trial_id in tickets:
            if trial_id in got and trial_id not in leased:  # a doubled ticket is stale
                leased[trial_id] = None
            else:
                stale.append((stream, entry))
        if stale:
            self._drop(stale)
        if not leased:
            return []
        return list(session.scalars(select(TrialRow).where(TrialRow.id.in_(list(leased)))
                                    .order_by(TrialRow.id)))

    def finished(self, trial_ids: list[int]) -> None:
        if not trial_ids:
            return
        keys = [str(t) for t in trial_ids]
        found: list[Any] = self._redis.hmget(self._entries, keys)
        tickets = [tuple(v.rsplit(" ", 1)) for v in found if v]
        if tickets:
            self._drop(tickets)  # type: ignore[arg-type]
        self._redis.hdel(self._entries, *keys)

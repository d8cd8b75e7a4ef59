"""Redis Streams dispatch: a stream per target queue, one consumer group, a consumer per
worker. A stream entry is a ticket for a trial; the trials table decides whether the
ticket is still good (see ``take_many``), so a lost or doubled ticket never loses or doubles
a trial. Tickets of a dead worker are taken over with XAUTOCLAIM once idle past the lease.

Redis is a hint, the database the truth: a ticket change after a commit that fails (Redis
down) is logged, not raised, and ``resync`` gives every queued trial without a live
ticket a new one, including after Redis or the server restarted.

Every new ticket is also announced on one pub/sub channel (``<prefix>:wake``: which
queues, how many), in the same round trip as the XADDs: each server process's watcher
wakes its waiting leases from it (``notify``), with a check of the trials table every
second behind it for a message lost in an outage.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas.api import TrialStatus
from tuner_server.db.models import TrialRow
from tuner_server.queue.base import (
    DispatchQueue,
    QueuedTrial,
    QueueUnavailable,
    TakenTrial,
    take_many,
)
from tuner_server.queue.notify import Counts, Subscription, counts_of

log = logging.getLogger("tuner.queue")

GROUP = "workers"
# A ticket a lease read (XREADGROUP) while its trial is still queued this long after:
# that lease never committed (its server was killed in between); the ticket goes back.
STALE_READ_S = 10.0
# Queued trials one resync looks at, at most; the next resync goes on from there.
RESYNC_BATCH = 10_000
# An outage fails every ticket change: one warning per this many seconds says so.
WARN_EVERY_S = 30.0
# Waiting leases check the trials table this often, behind the pub/sub wakes.
CHECK_EVERY_S = 1.0

Ticket = tuple[str, str]  # (stream, entry id)


def _entry_key(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


class _Wakes(Subscription):
    """The wake channel, read by one process's watcher; its own queue's messages are
    skipped (those waiters were woken in-process already)."""

    def __init__(self, url: str, channel: str, origin: str) -> None:
        self._redis = redis.asyncio.Redis.from_url(url, decode_responses=True,
                                                   socket_connect_timeout=5)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._channel, self._origin = channel, origin

    async def start(self) -> _Wakes:
        """Subscribe; on failure the client is closed before the error goes on (the
        watcher retries with a new one each time it starts)."""
        try:
            await self._pubsub.subscribe(self._channel)
        except BaseException:
            await self.close()
            raise
        return self

    async def next(self, timeout: float) -> Counts | None:
        message = await self._pubsub.get_message(timeout=timeout)
        if message is None:
            return None
        try:
            body = json.loads(message["data"])
            if body["o"] == self._origin:
                return None
            return {str(q): int(n) for q, n in body["q"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not ours: someone else's message on the channel

    async def close(self) -> None:
        try:
            await self._pubsub.aclose()
        finally:
            await self._redis.aclose()


class RedisQueue(DispatchQueue):
    def __init__(self, url: str, prefix: str = "tuner",
                 stale_read_s: float = STALE_READ_S,
                 check_every_s: float = CHECK_EVERY_S) -> None:
        super().__init__(check_every_s, self._subscribe)
        self._url = url
        self._origin = secrets.token_hex(8)  # this queue object's wakes, skipped by it
        self._redis = redis.Redis.from_url(url, decode_responses=True,
                                           socket_connect_timeout=5, socket_timeout=30)
        self._prefix = prefix
        self._groups: set[str] = set()
        self._stale_read_ms = int(stale_read_s * 1000)
        self._resync_after = 0  # trial id: where the next resync goes on
        self._warned = -WARN_EVERY_S

    def ping(self) -> None:
        try:
            self._redis.ping()
        except redis.RedisError as err:
            raise QueueUnavailable(f"redis: {err}") from None

    def _stream(self, queue: str) -> str:
        return f"{self._prefix}:q:{queue}"

    @property
    def _wake_channel(self) -> str:
        return f"{self._prefix}:wake"

    async def _subscribe(self) -> Subscription:
        return await _Wakes(self._url, self._wake_channel, self._origin).start()

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

    def _hint_failed(self, what: str, err: redis.RedisError) -> None:
        """A ticket change after a commit failed: the database holds the truth and the
        scheduler's resync repairs the tickets, so this is a warning, not an error."""
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            log.warning("redis: %s failed (%s); the scheduler's resync repairs the tickets",
                        what, err)

    def _add(self, trials: list[tuple[int, str]]) -> None:
        """A new ticket for each (trial id, queue), announced to every server's waiters."""
        pipe = self._redis.pipeline(transaction=False)
        streams = []
        for trial_id, queue in trials:
            stream = self._stream(queue)
            self._ensure_group(stream)
            pipe.xadd(stream, {"trial": trial_id})
            streams.append((trial_id, stream))
        counts = counts_of(queue for _trial, queue in trials)
        pipe.publish(self._wake_channel, json.dumps({"o": self._origin, "q": counts}))
        ids = pipe.execute()[:-1]
        self._redis.hset(self._entries, mapping={
            str(trial_id): f"{stream} {entry}" for (trial_id, stream), entry in zip(streams, ids)})

    def pushed(self, trials: Sequence[QueuedTrial]) -> None:
        if trials:
            try:
                self._add([(t.id, t.queue) for t in trials])
            except redis.RedisError as err:
                self._hint_failed(f"queueing {len(trials)} new trials", err)
            self._arrived(trials)  # after the tickets: a woken lease finds them

    def returned(self, trials: list[TrialRow]) -> None:
        if trials:
            try:
                self._add([(t.id, t.queue) for t in trials])
            except redis.RedisError as err:
                self._hint_failed(f"queueing {len(trials)} returned trials", err)
            self._arrived(trials)

    def _drop(self, tickets: list[Ticket], forget: list[str] | None = None) -> None:
        """Acknowledge and delete these tickets; ``forget``: trial ids whose entries go
        from the index too, in the same round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for stream, entry in tickets:
            pipe.xack(stream, GROUP, entry)
            pipe.xdel(stream, entry)
        if forget:
            pipe.hdel(self._entries, *forget)
        pipe.execute()

    def _read(self, stream: str, consumer: str, want: int,
              lease_s: float) -> list[tuple[str, str, int]]:
        """Up to ``want`` tickets of one stream: a lost worker's past its lease first,
        then new ones. A group Redis lost (a restart without its data) is made again."""
        try:
            self._ensure_group(stream)
            return self._read_group(stream, consumer, want, lease_s)
        except redis.ResponseError as err:
            if "NOGROUP" not in str(err):
                raise
        self._groups.discard(stream)
        self._ensure_group(stream)
        return self._read_group(stream, consumer, want, lease_s)

    def _read_group(self, stream: str, consumer: str, want: int,
                    lease_s: float) -> list[tuple[str, str, int]]:
        _next, claimed, *_ = self._redis.xautoclaim(
            stream, GROUP, consumer, min_idle_time=int(lease_s * 1000), count=want)
        tickets = [(stream, entry, int(fields["trial"])) for entry, fields in claimed
                   if fields]
        if len(tickets) < want:
            for _stream, entries in self._redis.xreadgroup(
                    GROUP, consumer, {stream: ">"}, count=want - len(tickets)) or []:
                tickets += [(stream, entry, int(fields["trial"])) for entry, fields in entries]
        return tickets

    def lease(self, session: Session, worker_id: int, queues: list[str], limit: int,
              lease_s: float, now: float) -> list[TakenTrial]:
        consumer = f"worker-{worker_id}"
        tickets: list[tuple[str, str, int]] = []
        try:
            for queue in queues:
                want = limit - len(tickets)
                if want <= 0:
                    break
                tickets += self._read(self._stream(queue), consumer, want, lease_s)
        except redis.RedisError as err:
            # tickets read so far sit in this consumer's pending list; resync returns them
            raise QueueUnavailable(f"redis: {err}") from None
        rows = take_many(session, [trial_id for _s, _e, trial_id in tickets], worker_id,
                         lease_s, now)
        got = {trial.id for trial in rows}
        leased: dict[int, None] = {}
        stale = []
        for stream, entry, trial_id in tickets:
            if trial_id in got and trial_id not in leased:  # a doubled ticket is stale
                leased[trial_id] = None
            else:
                stale.append((stream, entry))
        if stale:
            try:
                self._drop(stale)
            except redis.RedisError as err:  # read again later, and dropped then
                self._hint_failed(f"dropping {len(stale)} stale tickets", err)
        return rows

    def finished(self, trial_ids: list[int]) -> None:
        if not trial_ids:
            return
        keys = [str(t) for t in trial_ids]
        try:
            found: list[Any] = self._redis.hmget(self._entries, keys)
            tickets = [tuple(v.rsplit(" ", 1)) for v in found if v]
            self._drop(tickets, keys)  # type: ignore[arg-type]
        except redis.RedisError as err:  # a stale ticket is dropped when a lease reads it
            self._hint_failed(f"dropping the tickets of {len(trial_ids)} recorded trials", err)

    def resync(self, session: Session, now: float) -> int:
        """Queued trials (up to ``RESYNC_BATCH``, on from where the last resync stopped)
        with no live ticket get one. Live: not read yet, or read by a lease less than
        ``stale_read_s`` ago. A ticket read longer ago whose trial is still queued was
        taken by a lease that never committed: it is dropped and a new one added.
        Tickets of leased and recorded trials are left to ``lease`` (XAUTOCLAIM, stale
        drops) and ``finished``."""
        rows = session.execute(
            select(TrialRow.id, TrialRow.queue)
            .where(TrialRow.status == TrialStatus.QUEUED, TrialRow.id > self._resync_after)
            .order_by(TrialRow.id).limit(RESYNC_BATCH)).all()
        self._resync_after = rows[-1][0] if len(rows) == RESYNC_BATCH else 0
        if not rows:
            return 0
        try:
            return self._resync([(trial_id, queue) for trial_id, queue in rows])
        except redis.RedisError as err:
            raise QueueUnavailable(f"redis: {err}") from None

    def _resync(self, trials: list[tuple[int, str]]) -> int:
        values = self._redis.hmget(self._entries, [str(trial_id) for trial_id, _ in trials])
        lost: list[tuple[int, str]] = []  # (trial id, queue): no live ticket
        held: dict[str, dict[str, tuple[int, str]]] = {}  # stream -> entry -> trial
        for trial, value in zip(trials, values):
            stream, _, entry = (value or "").rpartition(" ")
            if entry and stream == self._stream(trial[1]):
                held.setdefault(stream, {})[entry] = trial
            else:
                lost.append(trial)
        stale: list[Ticket] = []
        for stream, tickets in held.items():
            last = self._last_delivered(stream)
            if last is None:  # Redis lost the stream or its group: every ticket is gone
                self._groups.discard(stream)
                lost += tickets.values()
                continue
            read = [e for e in tickets if _entry_key(e) <= last]
            pipe = self._redis.pipeline(transaction=False)
            for entry in read:
                pipe.xpending_range(stream, GROUP, entry, entry, 1)
            for entry, pending in zip(read, pipe.execute() if read else []):
                if pending and pending[0]["time_since_delivered"] < self._stale_read_ms:
                    continue  # a lease is taking it now
                stale.append((stream, entry))
                lost.append(tickets[entry])
        if stale:
            self._drop(stale)
        if lost:
            self._add(lost)
            self.hub.wake(counts_of(queue for _trial, queue in lost))
            log.info("resync: %d queued trials had no live ticket; queued again", len(lost))
        return len(lost)

    def _last_delivered(self, stream: str) -> tuple[int, int] | None:
        """The group's last delivered entry; None when the stream or group is missing."""
        try:
            groups = self._redis.xinfo_groups(stream)
        except redis.ResponseError:  # no such key
            return None
        for group in groups:
            if group["name"] == GROUP:
                return _entry_key(str(group["last-delivered-id"]))
        return None

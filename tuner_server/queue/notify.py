"""Lease long-polls that cost nothing while they wait.

A waiting lease parks on an asyncio event registered under the queues its worker
serves (``queue_matches``); nothing runs for it until a wake names one of them. Wakes
come from three places, all funnelled into :meth:`LeaseHub.wake`:

- this process, at once: the queue's ``pushed`` and ``returned`` (the scheduler's thread,
  the routes' threads) name the queues and how many trials each got;
- other server processes: the queue's broker (Redis pub/sub, see ``RedisQueue``), read by
  one watcher task per process for all its waiters;
- one shared check of the trials table per process (``queued_counts``: one query for all
  waiting queues), every ``check_every_s``: the only cross-process path of the SQL queue
  (every 0.1 s), a safety net for a missed broker message on Redis (every 1 s).

A wake of ``n`` trials wakes waiters in arrival order until their ``max_trials`` cover
``n``, not every waiter: a trial trickling into an idle fleet of 1,000 costs one lease
attempt, not 1,000. A woken waiter leases once; if another took the trial, it waits
again. The route registers a waiter before its lease attempt, so a wake that lands
during the attempt is not lost (the event is already set when it starts waiting).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import func, select, union_all
from sqlalchemy.orm import Session, sessionmaker

from schemas.api import TrialStatus
from tuner_server.db.models import TrialRow

log = logging.getLogger("tuner.queue")

# A watcher with no waiters left stops after this long (its broker connection with it);
# the next waiter starts another.
LINGER_S = 5.0
# The shared check looks at no more queued trials than the waiters could take, and never
# more than this: it counts, it does not read the queue.
MAX_CHECK_ROWS = 10_000

Counts = dict[str, int]  # queue -> trials that arrived in it


def counts_of(queues: Iterable[str]) -> Counts:
    """How many trials each queue got, from one queue name per trial."""
    out: Counts = {}
    for queue in queues:
        out[queue] = out.get(queue, 0) + 1
    return out


def queued_counts(session: Session, caps: dict[str, int]) -> Counts:
    """Queued trials per queue, counting at most ``caps[queue]`` in each (a full queue
    must not hide another's trials): one statement, a limited index range scan of
    ``ix_trials_queue`` (status, queue, id) per queue."""
    limited = [select(TrialRow.queue).where(TrialRow.status == TrialStatus.QUEUED,
                                            TrialRow.queue == queue).limit(cap).subquery()
               for queue, cap in sorted(caps.items()) if cap > 0]
    parts = [select(part.c.queue) for part in limited]  # SQLite: no LIMIT in a UNION arm
    if not parts:
        return {}
    some = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery()
    return {queue: int(n) for queue, n in
            session.execute(select(some.c.queue, func.count()).group_by(some.c.queue))}


class Subscription(ABC):
    """Wakes from other server processes (Redis pub/sub), read by one watcher task."""

    @abstractmethod
    async def next(self, timeout: float) -> Counts | None:
        """The next wakes (None: nothing within ``timeout``); raises on a broken
        connection (the watcher logs it and relies on the shared check)."""

    @abstractmethod
    async def close(self) -> None:
        """Unsubscribe and drop the connection."""


Broker = Callable[[], Awaitable[Subscription]]  # subscribes; None: no broker


@dataclass(eq=False)
class Waiter:
    """One parked lease: the queues it serves and how many trials it would take."""

    queues: tuple[str, ...]
    want: int
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)
    parked: bool = False  # in ``wait`` (registered, its lease attempt done)

    async def wait(self, timeout: float) -> bool:
        """True when woken, False when ``timeout`` passed first."""
        if timeout <= 0:
            return self.event.is_set()
        self.parked = True
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except asyncio.TimeoutError:
            return self.event.is_set()
        finally:
            self.parked = False
        return True


class LeaseHub:
    """The parked leases of one process (one per dispatch queue object) and the one
    watcher task that wakes them from the broker and the shared check."""

    def __init__(self, check_every_s: float, broker: Broker | None = None) -> None:
        self.check_every_s = check_every_s
        self._broker = broker
        self._lock = threading.Lock()
        self._by_queue: dict[str, list[Waiter]] = {}
        self._count = 0
        self._watcher: asyncio.Task[None] | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._queues_of: dict[int, tuple[str, ...]] = {}  # worker id -> queues it serves

    # ------------------------------------------------------------------ waiters

    def queues_of(self, worker_id: int) -> tuple[str, ...] | None:
        """The queues a worker serves, once a lease of it has said (a worker row's target
        never changes: a namesake on another target is another row)."""
        return self._queues_of.get(worker_id)

    def remember(self, worker_id: int, queues: Iterable[str]) -> None:
        self._queues_of[worker_id] = tuple(queues)

    def register(self, queues: Iterable[str], want: int,
                 sessions: sessionmaker[Session]) -> Waiter:
        """Park a lease (call from the event loop, before its lease attempt); starts this
        loop's watcher when none runs."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(tuple(queues), want, loop)
        with self._lock:
            for queue in waiter.queues:
                self._by_queue.setdefault(queue, []).append(waiter)
            self._count += 1
            self._sessions = sessions
            watcher = self._watcher
            if watcher is None or watcher.done() or watcher.get_loop() is not loop:
                self._watcher = loop.create_task(self._watch(), name="tuner-lease-watcher")
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        with self._lock:
            self._drop(waiter)

    def _drop(self, waiter: Waiter) -> None:
        """Take a waiter off every queue it waits on (lock held); idempotent."""
        removed = False
        for queue in waiter.queues:
            waiting = self._by_queue.get(queue)
            if waiting and waiter in waiting:
                waiting.remove(waiter)
                removed = True
                if not waiting:
                    del self._by_queue[queue]
        if removed:
            self._count -= 1

    @property
    def waiting(self) -> int:
        """Leases registered (parked, or in the lease attempt before parking)."""
        return self._count

    @property
    def parked(self) -> int:
        """Leases parked: waiting for a wake, nothing running for them."""
        with self._lock:
            return len({id(w) for ws in self._by_queue.values() for w in ws if w.parked})

    # -------------------------------------------------------------------- wakes

    def wake(self, counts: Counts) -> int:
        """Trials arrived in these queues: wake waiters in arrival order until their
        ``want`` covers each count. Safe from any thread; never raises. Returns how many
        waiters it woke."""
        woken: list[Waiter] = []
        with self._lock:
            for queue, n in counts.items():
                waiting = self._by_queue.get(queue)
                while n > 0 and waiting:
                    waiter = waiting[0]
                    self._drop(waiter)
                    woken.append(waiter)
                    n -= waiter.want
                    waiting = self._by_queue.get(queue)
        for waiter in woken:
            try:
                waiter.loop.call_soon_threadsafe(waiter.event.set)
            except RuntimeError:  # its loop is closed: nobody waits on it any more
                pass
        return len(woken)

    def _wanted(self) -> dict[str, int]:
        """How many trials the waiters of each queue would take in all."""
        with self._lock:
            return {queue: min(sum(w.want for w in waiting), MAX_CHECK_ROWS)
                    for queue, waiting in self._by_queue.items() if waiting}

    def check(self) -> int:
        """The shared check: one query for every waiting queue; wakes for what is queued
        there. Runs in a worker thread (blocking I/O). Returns waiters woken."""
        caps = self._wanted()
        sessions = self._sessions
        if not caps or sessions is None:
            return 0
        with sessions() as session:
            counts = queued_counts(session, caps)
        return self.wake(counts) if counts else 0

    # ------------------------------------------------------------------ watcher

    async def _watch(self) -> None:
        """One per process (per event loop): reads the broker and runs the shared check
        every ``check_every_s`` while anyone waits; stops ``LINGER_S`` after the last."""
        sub: Subscription | None = None
        if self._broker is not None:
            try:
                sub = await self._broker()
            except Exception as err:  # noqa: BLE001 - the checks still wake everyone
                log.warning("lease wakes from other servers: broker unavailable (%s); "
                            "checking every %g s", err, self.check_every_s)
        idle_since: float | None = None
        next_check = 0.0  # the first check at once: covers wakes sent before we listened
        try:
            while True:
                now = time.monotonic()
                if self._count == 0:
                    idle_since = idle_since if idle_since is not None else now
                    if now - idle_since >= LINGER_S:
                        with self._lock:
                            if self._count == 0:
                                self._watcher = None
                                return
                else:
                    idle_since = None
                    if now >= next_check:
                        next_check = now + self.check_every_s
                        try:
                            await asyncio.to_thread(self.check)
                        except Exception as err:  # noqa: BLE001 - next tick tries again
                            log.warning("lease wake check failed: %s", err)
                # idle: look again for waiters twice a second
                wait = max(0.0, next_check - time.monotonic()) if self._count else 0.5
                if sub is None:
                    await asyncio.sleep(wait)
                    continue
                try:
                    counts = await sub.next(wait)
                except Exception as err:  # noqa: BLE001 - fall back to checks alone
                    log.warning("lease wakes from other servers lost (%s); checking every "
                                "%g s", err, self.check_every_s)
                    await _closed(sub)
                    sub = None
                    continue
                if counts:
                    self.wake(counts)
        finally:
            if sub is not None:
                await _closed(sub)


async def _closed(sub: Subscription) -> None:
    """Close a subscription, whatever state its connection is in."""
    try:
        await sub.close()
    except Exception:  # noqa: BLE001 - closing a broken connection
        pass

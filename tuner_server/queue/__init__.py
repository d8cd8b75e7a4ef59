"""Dispatch queues: how trials reach workers. The trials table stays the truth of
every trial's state; a queue only decides who gets which queued trial next."""

from __future__ import annotations

from tuner_server.queue.base import DispatchQueue, QueueUnavailable, queue_matches
from tuner_server.queue.sql import SqlQueue


def make_queue(url: str | None, prefix: str = "tuner") -> DispatchQueue:
    """``sql`` (or nothing) leases rows in the database; ``redis://...`` uses Streams."""
    if not url or url == "sql":
        return SqlQueue()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from tuner_server.queue.redis import RedisQueue

        return RedisQueue(url, prefix)
    raise ValueError(f"queue url {url!r}: expected 'sql' or redis://host:port/db")


__all__ = ["DispatchQueue", "QueueUnavailable", "SqlQueue", "make_queue", "queue_matches"]

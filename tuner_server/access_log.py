"""Uvicorn's access log, as this server writes it: a token an old ``/?token=`` link
carries is written as ``token=***``, and the line is formatted and written by a thread of
its own, off the request path.

Uvicorn formats and writes each access line (and flushes the stream) in the request's
own task: on 2 cores, side by side, ~0.1 ms of a 3 ms records/best call's median and
~0.8 ms of its p99 (docs/BENCHMARKS.md; Python's logging cookbook advises a
``QueueHandler`` for this). The
request path now only makes the record, redacts it and puts it on a queue; the listener
thread formats and writes it, in order, and what is queued at shutdown is written before
the process exits."""

from __future__ import annotations

import logging
import queue
import re
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import QueueHandler, QueueListener

ACCESS_LOGGER = "uvicorn.access"
_TOKEN_IN_QUERY = re.compile(r"(?i)((?:^|[?&])token=)[^&#\s\"]*")


def redact_token(text: str) -> str:
    """``text`` with the value of every ``token=`` query parameter replaced by ``***``."""
    return _TOKEN_IN_QUERY.sub(r"\1***", text)


class TokenRedactor(logging.Filter):
    """Uvicorn's access log line names the request's path with its query string: a
    ``token=`` in it is written as ``token=***``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_token(a) if isinstance(a, str) else a
                                for a in record.args)
        return True


def redact_access_log() -> None:
    """Install :class:`TokenRedactor` on the access logger, once per process (uvicorn's
    logging configuration keeps a logger's filters)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, TokenRedactor) for f in logger.filters):
        logger.addFilter(TokenRedactor())


class _Enqueue(QueueHandler):
    """Puts the record on the queue as made: the listener's handlers format it (the
    base class would format it here, on the request path). Uvicorn's access records
    carry strings and numbers only, nothing a later change could alter."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


@contextmanager
def access_log_deferred() -> Iterator[None]:
    """While inside, the access logger's handlers sit behind a queue and a listener
    thread; its filters (the redaction) stay on it, so whatever its records reach is
    redacted. On leaving, what is queued is written and the handlers are put back,
    unless the logger was configured anew meanwhile (another in-process server's
    uvicorn). Nothing changes when the logger has no handlers (uvicorn did not configure
    logging, as under a test client) or is deferred already."""
    logger = logging.getLogger(ACCESS_LOGGER)
    handlers = list(logger.handlers)
    if not handlers or any(isinstance(h, _Enqueue) for h in handlers):
        yield
        return
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = QueueListener(records, *handlers, respect_handler_level=True)
    enqueue = _Enqueue(records)
    listener.start()
    for handler in handlers:
        logger.removeHandler(handler)
    logger.addHandler(enqueue)
    try:
        yield
    finally:
        ours = logger.handlers == [enqueue]
        logger.removeHandler(enqueue)
        listener.stop()  # writes what is queued
        if ours:
            for handler in handlers:
                logger.addHandler(handler)

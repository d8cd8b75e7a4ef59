"""The server's access log: written by a thread of its own (the request path only queues
the record), every line kept and in order, a query's token redacted, and the logger as
it was once the server stops."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from tuner_server.access_log import (
    ACCESS_LOGGER,
    TokenRedactor,
    access_log_deferred,
    redact_access_log,
)


class Lines(logging.Handler):
    """Keeps each formatted line and the thread that wrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((self.format(record), threading.current_thread().name))


@pytest.fixture
def access() -> Iterator[tuple[logging.Logger, Lines]]:
    logger = logging.getLogger(ACCESS_LOGGER)
    saved = (list(logger.handlers), list(logger.filters), logger.level, logger.propagate)
    for handler in saved[0]:
        logger.removeHandler(handler)
    for kept in saved[1]:
        logger.removeFilter(kept)
    lines = Lines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, lines
    finally:
        logger.removeHandler(lines)
        for kept in list(logger.filters):
            logger.removeFilter(kept)
        for handler in saved[0]:
            logger.addHandler(handler)
        for kept in saved[1]:
            logger.addFilter(kept)
        logger.setLevel(saved[2])
        logger.propagate = saved[3]


def alone(logger: logging.Logger, lines: Lines) -> None:
    """``lines`` the logger's only handler: pytest attaches its capture handler to every
    logger that does not propagate when a test's call begins."""
    for handler in list(logger.handlers):
        if handler is not lines:
            logger.removeHandler(handler)


def request(logger: logging.Logger, path: str) -> None:
    logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", path, "1.1", 200)


def test_lines_written_off_the_request_thread_in_order_redacted(
        access: tuple[logging.Logger, Lines]) -> None:
    logger, lines = access
    alone(logger, lines)
    redact_access_log()
    paths = [f"/?token=tun_client_{i}" if i % 3 == 0 else f"/api/v1/jobs/{i}"
             for i in range(500)]
    with access_log_deferred():
        assert lines not in logger.handlers
        assert any(isinstance(f, TokenRedactor) for f in logger.filters)
        for path in paths:
            request(logger, path)
    # leaving wrote everything queued, in order, by the listener's thread
    assert [line for line, _ in lines.lines] == [
        f'127.0.0.1:5 - "GET {p.split("=")[0] + "=***" if "token=" in p else p} HTTP/1.1" 200'
        for p in paths]
    assert {thread for _, thread in lines.lines} != {threading.current_thread().name}
    # and the logger is as it was: its handler and its filter, on the request path again
    assert logger.handlers == [lines]
    assert any(isinstance(f, TokenRedactor) for f in logger.filters)
    lines.lines.clear()
    request(logger, "/?token=tun_client_x")
    assert lines.lines == [('127.0.0.1:5 - "GET /?token=*** HTTP/1.1" 200',
                            threading.current_thread().name)]


def test_a_logger_configured_anew_meanwhile_is_left_as_it_is(
        access: tuple[logging.Logger, Lines]) -> None:
    """Another in-process server's uvicorn configures the logger while the first is
    deferred: leaving puts nothing back over the new configuration (every line would be
    written twice), and what was queued is still written."""
    logger, lines = access
    alone(logger, lines)
    newer = Lines()
    with access_log_deferred():
        request(logger, "/first")
        for handler in list(logger.handlers):  # what dictConfig does to the logger
            logger.removeHandler(handler)
        logger.addHandler(newer)
    assert logger.handlers == [newer]
    assert [line for line, _ in lines.lines] == ['127.0.0.1:5 - "GET /first HTTP/1.1" 200']


def test_nothing_changes_without_handlers_or_twice(
        access: tuple[logging.Logger, Lines]) -> None:
    """Under a test client uvicorn configures no handler: nothing to defer. Entered
    twice (two apps in one process), the inner one leaves the outer's queue alone."""
    logger, lines = access
    alone(logger, lines)
    logger.removeHandler(lines)
    with access_log_deferred():
        assert logger.handlers == []
    logger.addHandler(lines)
    with access_log_deferred():
        outer = list(logger.handlers)
        with access_log_deferred():
            assert logger.handlers == outer
        request(logger, "/x")
    assert [line for line, _ in lines.lines] == ['127.0.0.1:5 - "GET /x HTTP/1.1" 200']

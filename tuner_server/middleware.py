"""The guard every request passes: bounded bodies, one-line error details, and any
error answered as JSON without dropping the connection (503 for an outage)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from contextlib import nullcontext

import redis
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas.text import one_line
from tuner_server.gc_pause import gc_paused
from tuner_server.queue import QueueUnavailable

# Request bodies past these are refused (413) before they are read into memory.
MAX_BODY_BYTES = 1024 * 1024
MAX_IMPORT_BYTES = 32 * 1024 * 1024
# A request whose body is at least this long (a records/best of ~500 workloads, a log
# of ~200 lines) is parsed and answered with collection paused (``gc_pause``).
GC_PAUSE_BYTES = 64 * 1024
# Error details are one line of at most this many characters.
MAX_DETAIL_CHARS = 500

DATABASE_DOWN = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError,
                 sa_exc.TimeoutError)
QUEUE_DOWN = (QueueUnavailable, redis.ConnectionError, redis.TimeoutError)

log = logging.getLogger("tuner.server")


def outage_reason(err: BaseException) -> str:
    """An outage's cause in a few words: the driver's message, not SQLAlchemy's dump of
    the statement and its parameters."""
    cause = getattr(err, "orig", None) or err
    return one_line(str(cause).split("\n", 1)[0] or type(cause).__name__, 200)


def error_answer(err: BaseException) -> tuple[int, str]:
    """(status, detail) for an exception no route handled: 503 when the database or the
    queue is down (the request may be retried), else 500."""
    seen: BaseException | None = err
    for _ in range(5):  # the outage may be the cause of what was raised
        if seen is None:
            break
        if isinstance(seen, DATABASE_DOWN):
            return 503, f"database unavailable: {outage_reason(seen)}"
        if isinstance(seen, QUEUE_DOWN):
            return 503, f"queue unavailable: {outage_reason(seen)}"
        seen = seen.__cause__ or seen.__context__
    return 500, f"internal error: {type(err).__name__}; see the server log"


async def refusal(request: Request, exc: StarletteHTTPException) -> Response:
    """A refusal (``HTTPException``) as every route's is answered: its detail one bounded
    line, whatever it quotes (the app's handler, and ``api.hot``'s refusals)."""
    if isinstance(exc.detail, str):
        exc = StarletteHTTPException(exc.status_code, one_line(exc.detail, MAX_DETAIL_CHARS),
                                     exc.headers)
    return await http_exception_handler(request, exc)


def replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app after ``body`` was read whole: the body first, then what
    ``receive`` gives (after a body, only a disconnect comes)."""
    done = False

    async def again() -> Message:
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class _ClientGone(Exception):
    """The client disconnected before its request body was read."""


class Guard:
    """The outermost layer of our own (inside Starlette's ServerErrorMiddleware).

    Bodies: read whole before the app runs, refused with 413 past their limit (from
    Content-Length, or counted as they stream). Errors: an exception that escapes the
    app becomes a JSON answer here and is NOT re-raised: Starlette's ServerErrorMiddleware
    re-raises after its 500, and uvicorn then drops the connection, so a client's next
    request on it fails too."""

    def __init__(self, app: ASGIApp, large_paths: Collection[str] = ()) -> None:
        self.app = app
        self.large_paths = frozenset(large_paths)  # bodies up to MAX_IMPORT_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = MAX_IMPORT_BYTES if scope["path"] in self.large_paths else MAX_BODY_BYTES
        try:
            body = await self._read_body(scope, receive, limit)
        except _ClientGone:
            return
        if body is None:
            await JSONResponse({"detail": f"request body larger than {limit} bytes"},
                               status_code=413)(scope, receive, send)
            return
        replay = replayed(body, receive)
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            with gc_paused() if len(body) >= GC_PAUSE_BYTES else nullcontext():
                await self.app(scope, replay, watch)
        except Exception as err:  # every error gets an answer
            status, detail = error_answer(err)
            where = f"{scope.get('method')} {scope.get('path')}"
            if status == 503:
                log.warning("%s: %s", where, detail)
            else:
                log.exception("%s failed", where)
            if started:  # too late to answer: the connection ends with this response
                return
            await JSONResponse({"detail": detail}, status_code=status)(scope, replay, send)

    @staticmethod
    async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
        """The whole request body, or None when it is longer than ``limit`` bytes;
        raises _ClientGone when the client disconnects first."""
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

"""Request-scoped dependencies: the database session and the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from schemas.api import MAX_ID, ErrorBody
from tuner_server.services.tokens import MISS

_bearer = HTTPBearer(auto_error=False)

# An id in a path, bounded like the contract's body ids (schemas.api.MAX_ID).
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]

# The refusals a route may answer, for the OpenAPI document: each a one-line ``detail``.
_REFUSALS = {401: "missing or unknown token", 403: "the token's role may not do this",
             404: "no such job, task or worker", 409: "at odds with the worker's state "
             "or leases", 422: "the request does not validate; the detail names the field",
             503: "the database or the queue is unavailable; retry"}


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a router: 401, 403, 422 and 503, and ``statuses``."""
    return {status: {"model": ErrorBody, "description": _REFUSALS[status]}
            for status in sorted({401, 403, 422, 503, *statuses})}


@dataclass(frozen=True)
class Caller:
    role: str
    worker_id: int | None = None  # set for a token bound to one worker


ADMIN = Caller("admin")


async def get_session(request: Request) -> AsyncIterator[Session]:
    """The request's one database session, shared by the token check and the route
    (FastAPI caches a dependency per request). Made here without I/O: it connects on
    first use, so a request that needs no database (a cached token refused) costs none.
    Closed after the response; closing a transaction left open (a read-only route)
    talks to the database, so that runs in the thread pool."""
    session = request.app.state.sessions()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


async def get_reader(request: Request) -> AsyncIterator[Session]:
    """A session for a route that only reads records (``db.session.reader_engine``):
    autocommit on PostgreSQL, so closing it talks to no one."""
    session = request.app.state.readers()
    try:
        yield session
    finally:
        if session.in_transaction() and session.get_bind().dialect.name != "postgresql":
            await run_in_threadpool(session.close)
        else:
            session.close()


async def _caller(request: Request, creds: HTTPAuthorizationCredentials | None,
                  session: Session) -> Caller:
    """Who calls: from the process's token cache, else one look-up in the request's
    session (in the thread pool: it is I/O)."""
    if not request.app.state.settings.require_auth:
        return ADMIN
    if creds is None:
        raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
    tokens = request.app.state.tokens
    info = tokens.cached(creds.credentials)
    if info is MISS:
        info = await run_in_threadpool(tokens.lookup, creds.credentials, session)
    if info is None:
        raise HTTPException(401, "unknown token", {"WWW-Authenticate": "Bearer"})
    return Caller(info.role, info.worker_id)


def require(*roles: str) -> Callable[..., Awaitable[Caller]]:
    """Admit callers whose token has one of ``roles`` (admin always passes)."""
    allowed = {"admin", *roles}

    async def check(request: Request,
                    creds: HTTPAuthorizationCredentials | None = Depends(_bearer),
                    session: Session = Depends(get_session)) -> Caller:
        caller = await _caller(request, creds, session)
        if caller.role not in allowed:
            raise HTTPException(403, f"a {caller.role} token may not do this "
                                     f"(needs {' or '.join(sorted(allowed))})")
        return caller

    return check


async def require_worker_self(request: Request, worker_id: PathId,
                              creds: HTTPAuthorizationCredentials | None = Depends(_bearer),
                              session: Session = Depends(get_session)) -> Caller:
    """Admit the token a registration handed to worker ``worker_id`` (or an admin's):
    a worker speaks only for itself."""
    caller = await _caller(request, creds, session)
    if caller.role == "admin":
        return caller
    if caller.role != "worker":
        raise HTTPException(403, f"a {caller.role} token may not do this (needs the "
                                 f"worker's own token)")
    if caller.worker_id is None:
        raise HTTPException(403, "this worker token only registers workers; use the token "
                                 "that POST /api/v1/workers returned")
    if caller.worker_id != worker_id:
        raise HTTPException(403, f"this token belongs to worker {caller.worker_id}, "
                                 f"not worker {worker_id}")
    return caller

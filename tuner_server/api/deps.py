"""Request-scoped dependencies: the database session and the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Field
from sqlalchemy.orm import Session

from tuner_server.services.tokens import lookup

_bearer = HTTPBearer(auto_error=False)

# Ids are INTEGER columns (32 bits on PostgreSQL). A larger number matches nothing, and
# binding it overflows the driver (a 500), so the API refuses it as a 422 naming the field.
MAX_ID = 2**31 - 1
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
BodyId = Annotated[int, Field(ge=1, le=MAX_ID)]


@dataclass(frozen=True)
class Caller:
    role: str
    worker_id: int | None = None  # set for a token bound to one worker


ADMIN = Caller("admin")


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def _caller(request: Request, creds: HTTPAuthorizationCredentials | None) -> Caller:
    if not request.app.state.settings.require_auth:
        return ADMIN
    if creds is None:
        raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
    # its own short session: holding the request's open would hold SQLite's lock
    with request.app.state.sessions() as session:
        info = lookup(session, creds.credentials)
    if info is None:
        raise HTTPException(401, "unknown token", {"WWW-Authenticate": "Bearer"})
    return Caller(info.role, info.worker_id)


def require(*roles: str) -> Callable[..., Caller]:
    """Admit callers whose token has one of ``roles`` (admin always passes)."""
    allowed = {"admin", *roles}

    def check(request: Request,
              creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Caller:
        caller = _caller(request, creds)
        if caller.role not in allowed:
            raise HTTPException(403, f"a {caller.role} token may not do this "
                                     f"(needs {' or '.join(sorted(allowed))})")
        return caller

    return check


def require_worker_self(request: Request, worker_id: PathId,
                        creds: HTTPAuthorizationCredentials | None = Depends(_bearer)
                        ) -> Caller:
    """Admit the token a registration handed to worker ``worker_id`` (or an admin's):
    a worker speaks only for itself."""
    caller = _caller(request, creds)
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

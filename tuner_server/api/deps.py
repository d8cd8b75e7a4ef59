"""Request-scoped dependencies: the database session and the caller's role."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Field
from sqlalchemy.orm import Session

from tuner_server.services.tokens import role_of

_bearer = HTTPBearer(auto_error=False)

# Ids are INTEGER columns (32 bits on PostgreSQL). A larger number matches nothing, and
# binding it overflows the driver (a 500), so the API refuses it as a 422 naming the field.
MAX_ID = 2**31 - 1
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
BodyId = Annotated[int, Field(ge=1, le=MAX_ID)]


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def require(*roles: str) -> Callable[..., str]:
    """Admit callers whose token has one of ``roles`` (admin always passes)."""
    allowed = {"admin", *roles}

    def check(request: Request,
              creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> str:
        if not request.app.state.settings.require_auth:
            return "admin"
        if creds is None:
            raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
        # its own short session: holding the request's open would hold SQLite's lock
        with request.app.state.sessions() as session:
            role = role_of(session, creds.credentials)
        if role is None:
            raise HTTPException(401, "unknown token", {"WWW-Authenticate": "Bearer"})
        if role not in allowed:
            raise HTTPException(403, f"a {role} token may not do this "
                                     f"(needs {' or '.join(sorted(allowed))})")
        return role

    return check

"""Request-scoped dependencies: the database session and the caller's role."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from tuner_server.services.tokens import role_of

_bearer = HTTPBearer(auto_error=False)


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

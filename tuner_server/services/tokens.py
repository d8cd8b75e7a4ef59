"""Bearer tokens with roles; only a token's SHA-256 is stored."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner_server.db.models import TokenRow

ROLES = ("admin", "client", "worker")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, role: str, name: str = "") -> str:
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    token = f"tun_{role}_{secrets.token_urlsafe(24)}"
    session.add(TokenRow(name=name or role, role=role, token_sha256=_digest(token)))
    return token


def role_of(session: Session, token: str) -> str | None:
    return session.scalar(select(TokenRow.role).where(TokenRow.token_sha256 == _digest(token)))

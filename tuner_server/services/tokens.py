"""Bearer tokens with roles; only a token's SHA-256 is stored.

A worker token with no worker (a fleet's bootstrap token, ``TUNER_WORKER_TOKEN``) may
only register; each registration hands out a token bound to that one worker, and only
that token (or an admin's) may lease, beat, report and release for it."""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner_server.db.models import TokenRow

log = logging.getLogger("tuner.tokens")

ROLES = ("admin", "client", "worker")


@dataclass(frozen=True)
class TokenInfo:
    id: int
    name: str
    role: str
    worker_id: int | None  # the worker it speaks for; None: any of its role
    created_at: datetime | None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _info(row: TokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, name=row.name, role=row.role, worker_id=row.worker_id,
                     created_at=row.created_at)


def create_token(session: Session, role: str, name: str = "",
                 worker_id: int | None = None) -> str:
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    token = f"tun_{role}_{secrets.token_urlsafe(24)}"
    session.add(TokenRow(name=name or role, role=role, token_sha256=_digest(token),
                         worker_id=worker_id))
    return token


def ensure_token(session: Session, token: str, role: str, name: str) -> bool:
    """Admit a token chosen outside (the environment's bootstrap token); True if new."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if len(token) < 16:
        raise ValueError(f"a {role} token from the environment must have at least 16 "
                         f"characters (got {len(token)})")
    digest = _digest(token)
    row = session.scalar(select(TokenRow).where(TokenRow.token_sha256 == digest))
    if row is not None:
        if row.role != role or row.worker_id is not None:
            raise ValueError(f"the {role} token from the environment is already a "
                             f"{row.role} token ({row.name!r})")
        return False
    session.add(TokenRow(name=name, role=role, token_sha256=digest))
    return True


def lookup(session: Session, token: str) -> TokenInfo | None:
    row = session.scalar(select(TokenRow).where(TokenRow.token_sha256 == _digest(token)))
    return _info(row) if row is not None else None


def list_tokens(session: Session) -> list[TokenInfo]:
    return [_info(r) for r in session.scalars(select(TokenRow).order_by(TokenRow.id))]


def revoke(session: Session, key: str) -> list[TokenInfo]:
    """Delete the tokens with this id (digits) or name; returns what was deleted."""
    # "²".isdigit() is true too; past 9 digits it is no id (INTEGER), so a name
    by_id = key.isascii() and key.isdigit() and len(key) <= 9
    clause = TokenRow.id == int(key) if by_id else TokenRow.name == key
    rows = list(session.scalars(select(TokenRow).where(clause)))
    for row in rows:
        session.delete(row)
    return [_info(r) for r in rows]


def bind_worker_token(session: Session, worker_id: int, name: str) -> str:
    """A new token for this worker alone; the worker's earlier tokens stop working."""
    revoke_worker_tokens(session, worker_id)
    return create_token(session, "worker", name, worker_id=worker_id)


def revoke_worker_tokens(session: Session, worker_id: int) -> int:
    result = session.execute(delete(TokenRow).where(TokenRow.worker_id == worker_id))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


class _Miss:
    """What :meth:`TokenCache.cached` answers when it does not know a token."""


MISS = _Miss()


class TokenCache:
    """Each token's role per server process, so most requests authenticate without a
    database query. A token row never changes; it is only deleted (revoked). So a known
    token stays known while its row exists: a remembered token is trusted ``ttl``
    seconds from when it was last read or confirmed, and the first request to find one
    past that confirms every remembered token at once (a sweep: one query for the ids
    that still exist) and forgets the others. A token revoked elsewhere (`tuner token
    revoke`, another server process) stops working within ``ttl``. A fleet's workers
    each call every few seconds, longer than ``ttl``: remembering a token for ``ttl``
    only sent every worker call to the database. An unknown token is asked again after
    ``ttl`` (it may be created elsewhere meanwhile). This process's own revocations (a
    worker registering again, deregistering) call :meth:`forget`."""

    MAX_ENTRIES = 10_000  # past this the cache starts over (unknown tokens sprayed at it)

    def __init__(self, sessions: sessionmaker[Session], ttl: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions, self.ttl, self._clock = sessions, ttl, clock
        # digest -> (when it was last read or confirmed in the database, what it said)
        self._seen: dict[str, tuple[float, TokenInfo | None]] = {}
        self._forgot_all = 0.0  # when forget() last dropped everything
        self._forgot: dict[int, float] = {}  # worker id -> when its tokens were forgotten
        self._lock = threading.Lock()
        self._sweeping = threading.Lock()

    def _known(self, digest: str) -> TokenInfo | None | _Miss:
        """What the cache may answer for ``digest`` now: what it read or confirmed less
        than ``ttl`` ago."""
        with self._lock:
            seen = self._seen.get(digest)
        if seen is None or self._clock() - seen[0] >= self.ttl:
            return MISS
        return seen[1]

    def cached(self, token: str) -> TokenInfo | None | _Miss:
        """What the cache knows of ``token`` (None: no such token), without I/O; MISS
        when it must be looked up (or confirmed by a sweep)."""
        return self._known(_digest(token))

    def lookup(self, token: str, session: Session | None = None) -> TokenInfo | None:
        """``token``'s role: from the cache; for a remembered one past ``ttl``, after a
        sweep (in a short session of its own); else from the database, in ``session`` (a
        request's), whose transaction it then ends so that a long-poll holds no lock
        while it waits, or in a short session of its own."""
        digest = _digest(token)
        known = self._known(digest)
        if not isinstance(known, _Miss):
            return known
        with self._lock:
            seen = self._seen.get(digest)
        if seen is not None and seen[1] is not None and self._sweep_once(digest):
            known = self._known(digest)
            if not isinstance(known, _Miss):
                return known
        if session is None:
            with self._sessions() as own:
                return self._read(own, token, digest)
        info = self._read(session, token, digest)
        session.commit()
        return info

    def _read(self, session: Session, token: str, digest: str) -> TokenInfo | None:
        began = self._clock()
        info = lookup(session, token)
        with self._lock:
            if not self._revoked_since(info, began):
                if len(self._seen) >= self.MAX_ENTRIES:
                    self._seen.clear()
                self._seen[digest] = (began, info)
        return info

    def _sweep_once(self, digest: str) -> bool:
        """Sweep, unless another thread is sweeping or ``digest``'s entry was confirmed
        meanwhile; False when no sweep could be made (the caller looks the token up)."""
        if not self._sweeping.acquire(blocking=False):
            return False
        try:
            if not isinstance(self._known(digest), _Miss):
                return True  # another sweep confirmed it meanwhile
            try:
                with self._sessions() as session:
                    self._sweep(session)
            except SQLAlchemyError as err:  # the token is looked up alone instead
                log.warning("token sweep failed (%s); looking tokens up one by one",
                            str(err).splitlines()[0][:200])
                return False
            return True
        finally:
            self._sweeping.release()

    def _sweep(self, session: Session) -> None:
        """Confirm the remembered tokens whose rows exist (their entries now as new as the
        sweep) and forget the others (one query: every token id, ~one row per worker)."""
        began = self._clock()
        with self._lock:
            before = list(self._seen.items())
        alive = set(session.scalars(select(TokenRow.id)))
        confirmed = {d: (max(at, began), info) for d, (at, info) in before
                     if info is not None and info.id in alive}
        gone = {d for d, (_at, info) in before if info is not None and info.id not in alive}
        with self._lock:  # only entries no one changed since they were copied
            for d, seen in before:
                if self._seen.get(d) is seen:
                    if d in confirmed:
                        self._seen[d] = confirmed[d]
                    elif d in gone:
                        del self._seen[d]

    def _revoked_since(self, info: TokenInfo | None, began: float) -> bool:
        """Whether a forget() that may cover ``info`` came after a lookup that began at
        ``began``: its answer may predate the revocation and is not kept."""
        if self._forgot_all >= began:
            return True
        wid = info.worker_id if info is not None else None
        return wid is not None and self._forgot.get(wid, -1.0) >= began

    def forget(self, worker_id: int | None = None) -> None:
        """Drop what is cached of ``worker_id``'s tokens (all tokens when None): this
        process revoked them. Other workers' entries stay, so a burst of registrations
        does not send every request to the database."""
        now = self._clock()
        with self._lock:
            if worker_id is None:
                self._seen.clear()
                self._forgot.clear()
                self._forgot_all = now
                return
            self._seen = {d: seen for d, seen in self._seen.items()
                          if seen[1] is None or seen[1].worker_id != worker_id}
            if len(self._forgot) >= self.MAX_ENTRIES:  # only lookups in flight need them
                self._forgot = {w: t for w, t in self._forgot.items() if now - t < 60.0}
            self._forgot[worker_id] = now

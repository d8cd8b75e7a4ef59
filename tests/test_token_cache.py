"""Tokens are checked against the database at most once a second per server process
(issue 18, point 3): repeated requests with one token take no database session for it,
and a token used again later is checked with every other remembered one in one query a
second (a sweep), not looked up again; a token revoked by another process (`tuner token
revoke`) stops working within a second; this process's own revocations (a worker
registering again) at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_fixtures import LiveServer, live_server, migrate
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tuner_server.db.models import TokenRow, WorkerRow
from tuner_server.db.session import make_engine, session_factory
from tuner_server.services import tokens


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server("sqlite", tmp_path) as live:
        yield live


def test_repeated_requests_look_the_token_up_once(server: LiveServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []
    real = tokens.lookup

    def counting(session: object, token: str) -> tokens.TokenInfo | None:
        looked_up.append(token)
        return real(session, token)  # type: ignore[arg-type]

    monkeypatch.setattr(tokens, "lookup", counting)
    with server.client("client") as client:
        started = time.monotonic()
        for _ in range(5):
            assert client.get("/api/v1/jobs").status_code == 200
        within_ttl = time.monotonic() - started < 1.0
    if within_ttl:  # five requests inside one second: one database lookup
        assert looked_up == [server.tokens["client"]]
    assert 1 <= len(looked_up) < 5


@pytest.mark.serial
def test_a_token_revoked_elsewhere_stops_working_within_a_second(server: LiveServer) -> None:
    engine = make_engine(server.database_url)
    try:
        with server.client("client") as client:
            assert client.get("/api/v1/jobs").status_code == 200  # now remembered
            with session_factory(engine).begin() as session:  # as `tuner token revoke`
                info = tokens.lookup(session, server.tokens["client"])
                assert info is not None
                tokens.revoke(session, str(info.id))
            revoked = time.monotonic()
            while client.get("/api/v1/jobs").status_code == 200:
                assert time.monotonic() - revoked < 1.5, "the revoked token still works"
                time.sleep(0.05)
            assert client.get("/api/v1/jobs").status_code == 401
    finally:
        engine.dispose()


def test_this_processes_revocation_holds_at_once(server: LiveServer) -> None:
    """A worker that deregisters loses its token on the next request, though the token
    was remembered a moment before (the route forgets what the cache holds)."""
    body = {"name": "w", "target": "opencl -model=fake",
            "limits": {"max_threads_per_block": 256, "max_thread_x": 256, "max_thread_y": 256,
                       "max_thread_z": 64, "max_shared_memory_per_block": 49152,
                       "warp_size": 32, "compute_units": 1}}
    with server.client("worker") as boot:
        first = boot.post("/api/v1/workers", json=body).json()
    old = {"Authorization": f"Bearer {first['token']}"}
    with server.client(None) as anon:
        beat = f"/api/v1/workers/{first['id']}/heartbeat"
        assert anon.post(beat, json={"trial_ids": []}, headers=old).status_code == 200
        assert anon.delete(f"/api/v1/workers/{first['id']}", headers=old).status_code == 200
        assert anon.post(beat, json={"trial_ids": []}, headers=old).status_code == 401


def test_forgetting_one_workers_tokens_keeps_the_others(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A registration burst must not send every request to the database: forget(worker)
    drops that worker's tokens only, and a lookup in flight across the forget is not kept."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    try:
        with sessions.begin() as session:
            rows = [WorkerRow(name=f"w{i}", target="opencl -model=fake", limits={}, last_seen=0.0)
                    for i in range(2)]
            session.add_all(rows)
            session.flush()
            ids = [row.id for row in rows]
            a, b = (tokens.bind_worker_token(session, wid, f"w{i}") for i, wid in enumerate(ids))
            client = tokens.create_token(session, "client", "c")
        cache = tokens.TokenCache(sessions, ttl=60.0)
        for token in (a, b, client):
            assert cache.lookup(token) is not None
        cache.forget(ids[0])
        assert cache.cached(a) is tokens.MISS
        assert cache.cached(b) is not tokens.MISS and cache.cached(client) is not tokens.MISS

        real = tokens.lookup

        def revoked_meanwhile(session: object, token: str) -> tokens.TokenInfo | None:
            info = real(session, token)  # type: ignore[arg-type]
            cache.forget(ids[0])  # this process revokes while the lookup is in flight
            return info

        monkeypatch.setattr(tokens, "lookup", revoked_meanwhile)
        assert cache.lookup(a) is not None  # the answer it read is returned ...
        assert cache.cached(a) is tokens.MISS  # ... but not kept
        cache.forget()
        assert cache.cached(b) is tokens.MISS and cache.cached(client) is tokens.MISS
    finally:
        engine.dispose()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[sessionmaker[Session], list[str]]]:
    """A migrated database's sessions, and the tokens ``tokens.lookup`` was asked for."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    engine = make_engine(url)
    looked_up: list[str] = []
    real = tokens.lookup

    def counting(session: Session, token: str) -> tokens.TokenInfo | None:
        looked_up.append(token)
        return real(session, token)

    monkeypatch.setattr(tokens, "lookup", counting)
    try:
        yield session_factory(engine), looked_up
    finally:
        engine.dispose()


def _revoke(sessions: sessionmaker[Session], token: str) -> None:
    """As `tuner token revoke` does it, elsewhere."""
    with sessions.begin() as session:
        row = session.scalar(select(TokenRow).where(
            TokenRow.token_sha256 == tokens._digest(token)))
        assert row is not None
        tokens.revoke(session, str(row.id))


def test_a_sweep_checks_remembered_tokens_in_one_query(
        made: tuple[sessionmaker[Session], list[str]]) -> None:
    """Past ``ttl`` a remembered token is confirmed by a sweep of every remembered token
    (no lookup of its own); one revoked meanwhile is forgotten by that sweep and then
    found unknown. An unknown token past ``ttl`` is looked up again, with no sweep."""
    sessions, looked_up = made
    with sessions.begin() as session:
        kept, gone, other = (tokens.create_token(session, "client", name)
                             for name in ("k", "g", "o"))
    clock = Clock()
    cache = tokens.TokenCache(sessions, ttl=1.0, clock=clock)
    for token in (kept, gone, other, "tun_client_nosuchtoken"):
        cache.lookup(token)
    assert cache.lookup("tun_client_nosuchtoken") is None  # remembered: no second lookup
    _revoke(sessions, gone)
    clock.now += 0.9
    assert cache.cached(gone) is not tokens.MISS  # within ttl: still trusted
    clock.now += 0.2
    assert cache.cached(kept) is tokens.MISS  # confirmation due
    assert looked_up == [kept, gone, other, "tun_client_nosuchtoken"]
    assert cache.lookup(kept) is not None
    assert looked_up == [kept, gone, other, "tun_client_nosuchtoken"]  # swept, not looked up
    assert cache.cached(other) is not tokens.MISS  # confirmed by the same sweep
    assert cache.cached(gone) is tokens.MISS  # forgotten by it
    assert cache.lookup(gone) is None
    assert cache.lookup("tun_client_nosuchtoken") is None
    assert looked_up[4:] == [gone, "tun_client_nosuchtoken"]


def test_a_failed_sweep_falls_back_to_a_lookup(
        made: tuple[sessionmaker[Session], list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep the database refuses costs the request nothing but its own lookup."""
    sessions, looked_up = made
    with sessions.begin() as session:
        token = tokens.create_token(session, "client", "c")
    clock = Clock()
    cache = tokens.TokenCache(sessions, ttl=1.0, clock=clock)
    assert cache.lookup(token) is not None
    clock.now += 2.0

    def refused(_session: Session) -> None:
        raise OperationalError("SELECT tokens.id FROM tokens", {}, Exception("gone away"))

    monkeypatch.setattr(cache, "_sweep", refused)
    assert cache.lookup(token) is not None
    assert looked_up == [token, token]
    assert cache.cached(token) is not tokens.MISS  # the lookup's answer is remembered


def test_an_entry_written_during_a_sweep_keeps_its_own_time(
        made: tuple[sessionmaker[Session], list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup that read its token before a sweep began and wrote it after is trusted
    from its read, not from the sweep it was not part of."""
    sessions, _ = made
    with sessions.begin() as session:
        early, late = (tokens.create_token(session, "client", name) for name in ("e", "l"))
    clock = Clock()
    cache = tokens.TokenCache(sessions, ttl=1.0, clock=clock)
    assert cache.lookup(early) is not None
    clock.now += 2.0
    real_scalars = Session.scalars

    def lookup_lands_meanwhile(session: Session, *args: object, **kw: object) -> object:
        # while the sweep reads the ids, a lookup that began 0.5 s before it lands
        digest = tokens._digest(late)
        with sessions() as other:
            info = tokens.lookup(other, late)
        cache._seen[digest] = (clock.now - 0.5, info)
        return real_scalars(session, *args, **kw)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:
        patched.setattr(Session, "scalars", lookup_lands_meanwhile)
        assert cache.lookup(early) is not None  # sweeps
    assert cache.cached(early) is not tokens.MISS
    clock.now += 0.6
    assert cache.cached(late) is tokens.MISS  # 1.1 s after its read: due again
    assert cache.cached(early) is not tokens.MISS  # 0.6 s after the sweep

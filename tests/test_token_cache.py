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

from tuner_server.db.models import WorkerRow
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


def test_a_sweep_checks_remembered_tokens_in_one_query(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``ttl`` a remembered token is confirmed by a sweep of every remembered token
    (no lookup of its own); one revoked meanwhile is forgotten by that sweep and then
    found unknown."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    try:
        with sessions.begin() as session:
            kept, gone = (tokens.create_token(session, "client", name) for name in ("k", "g"))
        looked_up: list[str] = []
        real = tokens.lookup

        def counting(session: object, token: str) -> tokens.TokenInfo | None:
            looked_up.append(token)
            return real(session, token)  # type: ignore[arg-type]

        monkeypatch.setattr(tokens, "lookup", counting)
        cache = tokens.TokenCache(sessions, ttl=0.2)
        assert cache.lookup(kept) is not None and cache.lookup(gone) is not None
        with sessions.begin() as session:  # as `tuner token revoke`, elsewhere
            info = real(session, gone)
            assert info is not None
            tokens.revoke(session, str(info.id))
        assert cache.cached(gone) is not tokens.MISS  # within ttl: still trusted
        time.sleep(0.25)
        assert cache.cached(kept) is tokens.MISS  # a sweep is due
        assert cache.lookup(kept) is not None
        assert looked_up == [kept, gone]  # the sweep confirmed it: no lookup of its own
        assert cache.cached(kept) is not tokens.MISS
        assert cache.cached(gone) is tokens.MISS  # the sweep forgot it
        assert cache.lookup(gone) is None
        assert looked_up == [kept, gone, gone]
    finally:
        engine.dispose()

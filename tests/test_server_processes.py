"""Several server processes over one PostgreSQL database (issue 18, point 4): whichever
process answers ``/metrics`` gives the fleet's counts (prometheus_client's
multiprocess mode, set up by ``tuner serve --workers N``), and one scheduler plans at a
time (PostgreSQL's advisory lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from server_fixtures import (
    PG_ADMIN_DSN,
    free_port,
    kill_group,
    make_tokens,
    migrate,
    postgres_database,
    wait_until,
)
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from schemas import MeasureErrorNo, MeasureResult
from tuner_server.db.models import TrialRow
from tuner_server.db.session import (
    HEADROOM,
    POOL_SIZE,
    READER_CONNECTIONS,
    ConnectionBudgetError,
    connection_share,
    make_engine,
    session_factory,
    split_connections,
)
from tuner_server.services.scheduler import _leader

pytestmark = pytest.mark.timeout(180)

TUNER = Path(sys.executable).with_name("tuner")
TARGET = "opencl -model=pocl-cpu"
LIMITS = {"max_threads_per_block": 256, "max_thread_x": 256, "max_thread_y": 256,
          "max_thread_z": 64, "max_shared_memory_per_block": 49152, "warp_size": 32,
          "compute_units": 1}
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs
N_TRIAL = 9


@contextmanager
def serve(directory: Path, url: str, env: dict[str, str], *args: str
          ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`tuner serve` on a free port (sql queue); (base URL, process), stopped after."""
    port = free_port()
    log = directory / f"serve-{port}.log"
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("TUNER_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(TUNER), "serve", "--port", str(port), "--database-url", url,
             "--queue-url", "sql", *args], stdout=out, stderr=subprocess.STDOUT,
            env={**clean, "TUNER_SCHEDULER_INTERVAL": "0.05",
                 "XDG_DATA_HOME": str(directory / "xdg"), **env},
            start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"tuner serve exited with {proc.returncode}\n{log.read_text()}")
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 60, "the server's /healthz", diagnose=log.read_text)
        yield base, proc
    finally:
        proc.send_signal(signal.SIGTERM)  # uvicorn stops its worker processes
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            kill_group(proc)


def metrics(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text  # a new connection each time
    return {name: float(value) for name, _, value in
            (line.partition(" ") for line in text.splitlines() if line and line[0] != "#")}


def call(base: str, method: str, path: str, token: str, json: Any = None) -> Any:
    """One request on a connection of its own (several processes may share a port)."""
    response = httpx.request(method, f"{base}{path}", json=json, timeout=30,
                             headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 300, (method, path, response.text)
    return response.json()


def run_trials(bases: list[str], tokens: dict[str, str]) -> list[dict[str, Any]]:
    """Submit a job of N_TRIAL trials, register a worker, and lease and report every
    trial, turn by turn through ``bases``; returns the leased trials."""
    call(bases[0], "POST", "/api/v1/jobs", tokens["client"],
         {"target": TARGET, "n_trial": N_TRIAL, "plan_size": N_TRIAL, "tuner": "random",
          "tasks": [{"template": "dense_small_batch.gpu", "args": DENSE_ARGS}]})
    worker = call(bases[-1], "POST", "/api/v1/workers", tokens["worker"],
                  {"name": "w", "target": TARGET, "limits": LIMITS})
    wid, own = worker["id"], worker["token"]
    result = MeasureResult(costs=(1e-4,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                           timestamp=time.time()).model_dump(mode="json")
    leased: list[dict[str, Any]] = []
    turn = 0
    deadline = time.monotonic() + 60
    while len(leased) < N_TRIAL:
        assert time.monotonic() < deadline, f"only {len(leased)} trials leased"
        base = bases[turn % len(bases)]
        got = call(base, "POST", f"/api/v1/workers/{wid}/lease", own,
                   {"max_trials": 1, "wait_s": 2})["trials"]
        for trial in got:
            report = bases[(turn + 1) % len(bases)]
            answer = call(report, "POST", f"/api/v1/workers/{wid}/results", own,
                          {"results": [{"trial_id": trial["trial_id"], "result": result}]})
            assert answer["accepted"] == 1
        leased += got
        turn += 1
    return leased


def check_planned_once(url: str, leased: list[dict[str, Any]]) -> None:
    """The job's first N_TRIAL trials (what it tunes; later ones re-measure its best):
    each config once, and those were what the worker leased, each once."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            rows = list(session.scalars(select(TrialRow).order_by(TrialRow.id)
                                        .limit(N_TRIAL)))
    finally:
        engine.dispose()
    assert len({r.config_index for r in rows}) == N_TRIAL, [r.config_index for r in rows]
    assert sorted(t["trial_id"] for t in leased) == [r.id for r in rows]


def test_two_servers_answer_metrics_with_their_sum(tmp_path: Path) -> None:
    """Two `tuner serve` processes sharing a PROMETHEUS_MULTIPROC_DIR: trials leased
    and reported through both, turn by turn; each one's /metrics counts them all."""
    shared = tmp_path / "metrics"
    shared.mkdir()
    with postgres_database() as url:
        migrate(url)
        tokens = make_tokens(url)
        env = {"PROMETHEUS_MULTIPROC_DIR": str(shared)}
        with serve(tmp_path, url, env) as (a, _), serve(tmp_path, url, env) as (b, _):
            leased = run_trials([a, b], tokens)
            for base in (a, b):
                seen = metrics(base)
                assert seen["tuner_trials_leased_total"] == N_TRIAL, (base, seen)
                assert seen["tuner_trials_recorded_total"] == N_TRIAL, (base, seen)
                assert seen["tuner_records"] == N_TRIAL
                assert seen["tuner_trials_per_second"] > 0
        check_planned_once(url, leased)


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_serve_workers_share_one_metrics_directory(tmp_path: Path) -> None:
    """`tuner serve --workers 2`: both server processes count into one directory of
    its own making (removed when it stops), so /metrics, whichever answers, sums them."""
    with postgres_database() as url:
        migrate(url)
        tokens = make_tokens(url)
        with serve(tmp_path, url, {}, "--workers", "2") as (base, proc):
            def app_processes() -> dict[int, str]:
                found = {}
                for child in _children(proc.pid):
                    shared = _environ(child).get("PROMETHEUS_MULTIPROC_DIR", "")
                    if shared and any(Path(shared).glob(f"counter_{child}.db")):
                        found[child] = shared  # its app has made its counters there
                return found if len(found) == 2 else {}

            made = wait_until(app_processes, 60, "two server processes' counters")
            [directory] = set(made.values())
            assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
            leased = run_trials([base], tokens)
            for _ in range(4):  # whichever process answers
                seen = metrics(base)
                assert seen["tuner_trials_leased_total"] == N_TRIAL, seen
                assert seen["tuner_trials_recorded_total"] == N_TRIAL, seen
        assert not Path(directory).exists()
        check_planned_once(url, leased)


def test_one_scheduler_holds_the_planning_lock() -> None:
    """Two connections stand for two server processes: while one's pass holds the lock
    (its transaction), the other's pass is not the leader; after it commits, it is."""
    with postgres_database() as url:
        engine = make_engine(url)
        sessions = session_factory(engine)
        try:
            with sessions.begin() as first:
                assert _leader(first)
                with sessions.begin() as second:
                    assert not _leader(second)
            with sessions.begin() as second:
                assert _leader(second)
        finally:
            engine.dispose()


def test_trials_per_second_counts_the_window_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-second slots in a ring: a slot reused for a later second starts from zero,
    and seconds that left the window no longer count."""
    from tuner_server.services import metrics as module

    clock = [100.2]
    monkeypatch.setattr(module.time, "time", lambda: clock[0])
    counts = module.Metrics(window_s=10)
    counts.recorded(3)            # second 100
    clock[0] = 105.7
    counts.recorded(4)            # second 105
    assert counts.trials_per_second() == pytest.approx(0.7)
    clock[0] = 112.1              # second 112 reuses second 100's slot; 100 and 101 left
    counts.recorded(5)
    assert counts.trials_per_second() == pytest.approx(0.9)
    clock[0] = 115.0              # 105 left the window too
    assert counts.trials_per_second() == pytest.approx(0.5)
    assert "tuner_recorded_slot" not in counts.render(0, 0, 0)


def test_serve_refuses_a_metrics_directory_that_is_not_one(tmp_path: Path) -> None:
    """A PROMETHEUS_MULTIPROC_DIR that does not exist is named before anything starts."""
    from typer.testing import CliRunner

    from cli.main import app

    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(app, ["serve", "--database-url",
                                      f"sqlite:///{tmp_path / 'x.db'}"],
                                env={"PROMETHEUS_MULTIPROC_DIR": str(missing)})
    assert result.exit_code == 2, result.output
    assert "PROMETHEUS_MULTIPROC_DIR" in result.output and str(missing) in result.output


def _backends(url: str, admin: Any) -> int:
    """Connections to ``url``'s database other than ``admin``'s own."""
    name = url.rsplit("/", 1)[1]
    return int(admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                             " AND pid <> pg_backend_pid()", (name,)).fetchone()[0])


def test_server_processes_hold_their_share_of_connections(tmp_path: Path) -> None:
    """Each server process holds at most its connections (TUNER_DB_CONNECTIONS here;
    by default its share of max_connections), however many requests wait: 40
    requests held by a lock on the records table through `tuner serve --workers 2` of
    6 connections each open at most 12, and every one is answered once it is released.
    Before, each process opened up to 40: four processes under a fleet's load ran
    PostgreSQL's default 100 out ("too many clients already")."""
    with postgres_database() as url:
        migrate(url)
        with serve(tmp_path, url, {"TUNER_DB_CONNECTIONS": "6"}, "--workers", "2") as (base, _):
            dsn = PG_ADMIN_DSN.replace("dbname=test", f"dbname={url.rsplit('/', 1)[1]}")
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin, \
                    psycopg.connect(dsn) as locker, ThreadPoolExecutor(40) as pool:
                locker.execute("LOCK TABLE records IN ACCESS EXCLUSIVE MODE")
                answers = [pool.submit(httpx.get, f"{base}/metrics", timeout=60)
                           for _ in range(40)]
                most = 0
                for _ in range(30):  # 3 s of the requests waiting
                    time.sleep(0.1)
                    most = max(most, _backends(url, admin))
                locker.rollback()  # the lock goes: every request goes on
                codes = [a.result().status_code for a in answers]
    assert most <= 12 + 1, most  # + the locker's own
    assert codes == [200] * 40, codes


def test_connection_share_splits_what_postgres_allows() -> None:
    """A process's share: PostgreSQL's max_connections less its reserved slots and the
    headroom, split over the processes, at most what one process holds alone; too
    small a share is refused in words that say what to change."""
    with postgres_database() as url:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                limit = int(conn.exec_driver_sql("SHOW max_connections").scalar_one())
                reserved = int(conn.exec_driver_sql(
                    "SHOW superuser_reserved_connections").scalar_one())
            for processes in (1, 2, 4, 8):
                share = connection_share(engine, processes)
                assert share <= POOL_SIZE + READER_CONNECTIONS
                assert share * processes <= limit - reserved - HEADROOM
                pool, reader = split_connections(share)
                assert pool + reader == share and reader >= 2
            with pytest.raises(ConnectionBudgetError, match="max_connections"):
                connection_share(engine, limit)
            usable = limit - reserved - HEADROOM
            assert connection_share(engine, 2, asked=usable // 2) == usable // 2
            for processes, asked in ((2, usable // 2 + 1), (1, 5)):  # too many, too few
                with pytest.raises(ConnectionBudgetError, match="TUNER_DB_CONNECTIONS"):
                    connection_share(engine, processes, asked)
        finally:
            engine.dispose()
    assert split_connections(POOL_SIZE + READER_CONNECTIONS) == (POOL_SIZE, READER_CONNECTIONS)
    with pytest.raises(ValueError):
        split_connections(5)


def test_serve_refuses_more_processes_than_postgres_has_connections_for() -> None:
    """`tuner serve --workers N` whose N processes could not each get the connections
    they need stops before anything listens, saying what to change."""
    from typer.testing import CliRunner

    from cli.main import app

    with postgres_database() as url:
        migrate(url)
        engine = make_engine(url)
        with engine.connect() as conn:  # as many processes as connections: too many
            limit = conn.exec_driver_sql("SHOW max_connections").scalar_one()
        engine.dispose()
        result = CliRunner().invoke(app, ["serve", "--database-url", url, "--queue-url", "sql",
                                          "--workers", str(limit)])
        few = CliRunner().invoke(app, ["serve", "--database-url", url, "--queue-url", "sql"],
                                 env={"TUNER_DB_CONNECTIONS": "3"})
    assert result.exit_code == 1, result.output
    assert "max_connections" in result.output and "--workers" in result.output
    assert few.exit_code == 1, few.output
    assert "at least 6" in few.output and "TUNER_DB_CONNECTIONS=3" in few.output

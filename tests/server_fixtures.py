"""Helpers for server tests: throwaway databases (SQLite file or PostgreSQL), a live
uvicorn server on a loopback port, tokens, and the TopHub logs as parsed lines."""

from __future__ import annotations

import fcntl
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from compiler.records.pretuned import TOPHUB_DIR as TOPHUB_LOGS

REPO_ROOT = Path(__file__).resolve().parents[1]
TOPHUB_DIR = TOPHUB_LOGS
# File order matters: AutoTVM's "ties keep the first seen" follows it.
TOPHUB_FILES = ("cuda_v0.10.log", "rocm_v0.05.log", "opencl_v0.04.log", "llvm_v0.04.log")

REDIS_URL = "redis://127.0.0.1:6379/0"
PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
BACKENDS = ("sqlite", "postgresql")


def _pg_reason() -> str | None:
    """None when PostgreSQL answers, else why it does not."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as err:  # noqa: BLE001 - any failure means "skip"
        return f"PostgreSQL at 127.0.0.1:5432 (db 'test') is unreachable: {err}"
    return None


PG_UNREACHABLE = _pg_reason()


def _redis_reason() -> str | None:
    """None when Redis answers, else why it does not."""
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as err:  # noqa: BLE001 - any failure means "skip"
        return f"Redis at {REDIS_URL} is unreachable: {err}"
    return None


REDIS_UNREACHABLE = _redis_reason()


def clear_redis(prefix: str) -> None:
    """Delete every key under ``prefix`` (a test's queue namespace) from REDIS_URL."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def opencl_target() -> tuple[str | None, str]:
    """(target of OpenCL device 0, or None; why not)."""
    try:
        from compiler.runtime.opencl import list_opencl_devices

        devices = list_opencl_devices()
    except Exception as err:  # noqa: BLE001 - pyopencl missing, no ICD loader, ...
        return None, f"cannot list OpenCL devices: {err}"
    if not devices:
        return None, "no OpenCL device here (install pocl-opencl-icd)"
    return str(devices[0].target), ""


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process we started in its own session, with its children (a worker's
    measuring child), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def tophub_paths() -> list[Path]:
    """The four TopHub logs the package carries."""
    return [TOPHUB_DIR / name for name in TOPHUB_FILES]


def tophub_lines(path: Path) -> list[dict[str, Any]]:
    """A log's records in file order, as parsed JSON (comments and blanks dropped)."""
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@contextmanager
def postgres_database() -> Iterator[str]:
    """CREATE a fresh database on the shared server, yield its URL, DROP it after."""
    if PG_UNREACHABLE:
        pytest.skip(PG_UNREACHABLE)
    import psycopg

    name = f"tuner_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.format(name=name)
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def empty_database(backend: str, directory: Path) -> Iterator[str]:
    """A database with no schema at all: a new SQLite file or a new PostgreSQL database."""
    if backend == "sqlite":
        yield f"sqlite:///{directory / f'tuner_{secrets.token_hex(4)}.db'}"
    else:
        with postgres_database() as url:
            yield url


def migrate(url: str) -> None:
    """``tuner db upgrade`` in-process."""
    from tuner_server.db.session import make_engine, upgrade

    engine = make_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


@contextmanager
def migrated_sessions(backend: str, directory: Path) -> Iterator[Any]:
    """Sessions (a sessionmaker) on a fresh migrated database of ``backend``."""
    from tuner_server.db.session import make_engine, session_factory

    with empty_database(backend, directory) as url:
        migrate(url)
        engine = make_engine(url)
        try:
            yield session_factory(engine)
        finally:
            engine.dispose()


def make_tokens(url: str) -> dict[str, str]:
    """One token per role, created straight in the database."""
    from tuner_server.db.session import make_engine, session_factory
    from tuner_server.services.tokens import ROLES, create_token

    engine = make_engine(url)
    try:
        with session_factory(engine).begin() as session:
            return {role: create_token(session, role) for role in ROLES}
    finally:
        engine.dispose()


# Ports for test servers: below the kernel's ephemeral range (32768-60999 on Linux), which
# client connections take theirs from, so none can take a port between free_port() and the
# server's bind. A port is claimed by locking its byte of one file (one per user: another
# user's could not be opened): test workers (``pytest -n``) never hand out the same port,
# and a worker's claims end with it.
PORT_RANGE = (20000, 32000)
_PORT_CLAIMS = Path(tempfile.gettempdir()) / f"tuner-test-ports-{os.getuid()}.lock"
_claimed: set[int] = set()
_claims_fd: list[int] = []
_claims_lock = threading.Lock()  # lockf never conflicts within a process: threads take turns
_ports = random.Random()  # not the global one a test may seed


def free_port() -> int:
    """A port nothing listens on and no other test process will hand out."""
    with _claims_lock:
        if not _claims_fd:
            _claims_fd.append(os.open(_PORT_CLAIMS, os.O_RDWR | os.O_CREAT, 0o600))
        for _ in range(PORT_RANGE[1] - PORT_RANGE[0]):
            port = _ports.randrange(*PORT_RANGE)
            if port in _claimed:
                continue
            try:
                fcntl.lockf(_claims_fd[0], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except (BlockingIOError, PermissionError):  # another test process holds it
                continue
            _claimed.add(port)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:  # something else listens there
                    continue
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE[0]}-{PORT_RANGE[1] - 1} after as many "
                       "tries as it holds")


@dataclass
class LiveServer:
    """A uvicorn server in a thread, its database URL and one token per role."""

    url: str
    database_url: str
    tokens: dict[str, str]
    _server: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def client(self, role: str | None = "admin") -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._server.config.app.state.engine.dispose()


def start_server(database_url: str, tokens: dict[str, str],
                 run_scheduler: bool = False) -> LiveServer:
    """Start the real app under uvicorn on a loopback socket; returns once /healthz
    answers. With ``run_scheduler`` the app's lifespan runs, so its scheduler plans trials
    (every 0.1 s); without, trials are planned only when a test asks."""
    import uvicorn

    from tuner_server.app import create_app
    from tuner_server.settings import Settings

    settings = (Settings(database_url=database_url, require_auth=True, run_scheduler=True,
                         scheduler_interval=0.1) if run_scheduler
                else Settings(database_url=database_url, require_auth=True))
    app = create_app(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           lifespan="on" if run_scheduler else "off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"server on {url} did not answer /healthz")
        time.sleep(0.05)
    return LiveServer(url, database_url, tokens, server, thread)


@contextmanager
def live_server(backend: str, directory: Path) -> Iterator[LiveServer]:
    """A migrated empty database of ``backend`` behind a running server."""
    with empty_database(backend, directory) as url:
        migrate(url)
        server = start_server(url, make_tokens(url))
        try:
            yield server
        finally:
            server.stop()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               every: float = 0.05, diagnose: Callable[[], str] = lambda: "") -> Any:
    """Poll until ``predicate()`` is truthy; AssertionError naming ``what`` at the
    deadline (a plain exception: bench/ uses it outside pytest too)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n"
                                 f"{diagnose()}")
        time.sleep(every)

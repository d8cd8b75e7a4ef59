"""The embedded fleet: the server on a local database plus one isolated worker on the
local device, in this process, so tuning needs nothing else running."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from schemas import Target

if TYPE_CHECKING:
    from compiler.runtime import DeviceInfo

EMBEDDED = "embedded"  # the embedded run's token names and worker name


class NoLocalDevice(RuntimeError):
    """No local device serves the target (or the one asked for does not): the message
    lists what there is; tune for one of those, or on a server's fleet."""


class WorkerStopped(RuntimeError):
    """The embedded worker's loop ended with an error."""


def default_database_url() -> str:
    """The database the embedded fleet uses: ``TUNER_DATABASE_URL``, else the embedded
    SQLite file (the server's own default)."""
    from tuner_server.settings import Settings

    return Settings().database_url


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for another backend or an in-memory database)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def local_device(target: Target, spec: str | None = None) -> DeviceInfo:
    """The local device that serves ``target`` (``spec`` if given), by the server's own
    rule for which worker gets which trial; else :class:`NoLocalDevice` saying what
    there is."""
    from compiler.runtime import list_devices
    from compiler.runtime.device import preferred_device
    from tuner_server.queue import queue_matches
    from tuner_server.queue.base import queue_name

    try:
        devices = list_devices()
    except Exception as err:  # noqa: BLE001 - a broken driver: as if there were none
        devices, why = [], f" ({err})"
    else:
        why = ""
    have = ", ".join(f"{d.spec} ({d.target})" for d in devices) or f"none{why}"
    wanted = queue_name(target)
    serving = [d for d in devices if wanted in queue_matches(d.target)]
    if spec is not None:
        spec = spec if ":" in spec else f"{spec}:0"
        named = [d for d in devices if d.spec == spec]
        if not named:
            raise NoLocalDevice(f"device: no local device {spec!r}; local devices: {have}")
        if named[0].spec not in {d.spec for d in serving}:
            raise NoLocalDevice(
                f"device {spec} is a {str(named[0].target)!r} device, which does not "
                f"serve {str(target)!r}")
        return named[0]
    if not serving:
        raise NoLocalDevice(f"no local device serves {str(target)!r}; local devices: {have}")
    return preferred_device(serving) or serving[0]  # a GPU first, as `tuner worker` picks


def tokens_file(database_url: str) -> Path:
    """Where the embedded runs of this database keep their token pair: beside a SQLite
    file, else in the user's data directory under the URL's hash."""
    path = sqlite_path(database_url)
    if path is not None:
        return path.with_name(path.name + ".tokens.json")
    from tuner_server.settings import user_data_dir

    digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return user_data_dir() / f"embedded-{digest}.tokens.json"


def embedded_tokens(sessions: Any, database_url: str) -> dict[str, str]:
    """One client token and one (register-only) worker token for every embedded run of
    this database: the saved pair while the database still has it, else a new one."""
    from tuner_server.services.tokens import create_token, lookup

    path = tokens_file(database_url)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    tokens: dict[str, str] = {}
    with sessions.begin() as session:
        for role in ("client", "worker"):
            kept = saved.get(role)
            info = lookup(session, kept) if isinstance(kept, str) else None
            if info is None or info.role != role or info.worker_id is not None:
                kept = create_token(session, role, EMBEDDED)
            tokens[role] = str(kept)
    if tokens != saved:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(tokens, f)
        os.replace(tmp, path)
    return tokens


class EmbeddedFleet:
    """The server on a local database plus one worker on the local device, in this
    process; built by :meth:`start`, so a Ctrl-C halfway through still finds what to
    :meth:`close`."""

    def __init__(self, database_url: str, device: str) -> None:
        self._database_url, self._device = database_url, device
        self._server: Any = None
        self._socket: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.agent: Any = None
        self.failure: Exception | None = None
        self.url = ""
        self.client_token = ""
        # Held by the worker while it measures a trial; the server's planning and a
        # client following the job (``Client.follow``) hold it too, so none of them runs
        # beside a kernel being timed on the cores they share.
        self.quiet = threading.Lock()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def start(self) -> None:
        import uvicorn

        from compiler.runtime.prebuild import lease_batch
        from tuner_server.app import create_app
        from tuner_server.db.session import make_engine, session_factory, upgrade
        from tuner_server.settings import Settings
        from workers.agent import WorkerAgent

        engine = make_engine(self._database_url)
        try:
            upgrade(engine)
            tokens = embedded_tokens(session_factory(engine), self._database_url)
        finally:
            engine.dispose()
        self.client_token = tokens["client"]
        # the server gets the bound socket: no other process can take its port between
        # choosing it and listening on it
        self._socket = sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = create_app(Settings(database_url=self._database_url), self.quiet)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._threads.append(threading.Thread(target=self._server.run,
                                              kwargs={"sockets": [sock]}, daemon=True))
        self._threads[0].start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline or not self._threads[0].is_alive():
                raise RuntimeError("the embedded server did not start")
            time.sleep(0.05)
        # One worker row for every embedded run: the server reuses the stopped row of a
        # worker of this name and target. It leases a batch at a time, whose kernels are
        # built ahead on every core before any is timed.
        self.agent = WorkerAgent(self.url, tokens["worker"], self._device, name=EMBEDDED,
                                 batch=lease_batch(), wait_s=1.0,
                                 quiet=self.quiet)
        self.agent.register()
        worker = threading.Thread(target=self._work, daemon=True)
        worker.start()
        self._threads.append(worker)

    def _work(self) -> None:
        try:
            self.agent.run()
        except Exception as err:  # noqa: BLE001 - reported by check(), in the main thread
            self.failure = err

    def check(self) -> None:
        """Raise :class:`WorkerStopped` if the worker thread died: the job would wait
        for it forever."""
        if self.failure is not None:
            raise WorkerStopped(f"the embedded worker stopped: {self.failure}")

    def abort(self) -> None:
        """Kill the trial being measured (Ctrl-C): :meth:`close` still has to run."""
        if self.agent is not None:
            self.agent.abort()

    def close(self) -> None:
        """Stop the worker (it gives its lease back and deregisters), then the server."""
        if self.agent is not None:
            self.agent.stopping.set()
            if len(self._threads) > 1:
                self._threads[1].join(60)
            else:  # registered (or registering) but not serving: only its child to reap
                self.agent.abort()
                self.agent.deregister()
                self.agent.close()
        if self._server is not None:
            self._server.should_exit = True
            self._threads[0].join(10)
        if self._socket is not None:  # uvicorn closes it only where it started serving
            self._socket.close()

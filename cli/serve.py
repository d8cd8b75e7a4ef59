"""``tuner serve``: run the API server."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from cli.common import fail
from cli.db import DATABASE_URL, resolve_url

QUEUE_FORMS = "sql, or redis://HOST:PORT/DB"
# prometheus_client's multiprocess mode: where several server processes keep /metrics
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# How long a server process may take to start (imports, the schema check) and then to
# answer its supervisor's ping before uvicorn kills and replaces it: its 5 s default
# kills every process of a fleet starting on a busy machine, over and over.
STARTUP_S = 60
# Seconds an idle keep-alive connection stays open. Past the clients' own (httpx: 5 s),
# so a client always drops an idle connection first; at uvicorn's 5 s both ends expire
# it together, and a request sent on it as the server closes it fails (a worker that
# measured for 5 s loses its next lease call to a connection reset).
KEEP_ALIVE_S = 30


def check_queue_url(url: str) -> None:
    """The queue URL must name a queue this server has, before anything starts."""
    from urllib.parse import urlsplit

    if url == "sql":
        return
    try:
        parts = urlsplit(url)
        _port = parts.port  # raises ValueError on a port that is not a number
    except ValueError as err:
        fail(f"--queue-url {url!r}: {err}; use {QUEUE_FORMS}")
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.hostname or parts.path):
        fail(f"--queue-url: {url!r} is not a queue URL; use {QUEUE_FORMS}")


@contextmanager
def metrics_dir() -> Iterator[str]:
    """The directory where several server processes keep their /metrics counts, so any of
    them answers with the sum: $PROMETHEUS_MULTIPROC_DIR when set (checked to exist; its
    counts add to what is there already), else a new one removed when the server stops."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        yield given
        return
    made = tempfile.mkdtemp(prefix="tuner-metrics-")
    os.environ[MULTIPROC_ENV] = made
    try:
        yield made
    finally:
        del os.environ[MULTIPROC_ENV]
        shutil.rmtree(made, ignore_errors=True)


def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8600, "--port", min=1, max=65535),
    database_url: str | None = DATABASE_URL,
    queue_url: str | None = typer.Option(None, "--queue-url", envvar="TUNER_QUEUE_URL",
                                         help="sql (default) or redis://127.0.0.1:6379/0"),
    workers: int = typer.Option(1, "--workers", min=1,
                                help="server processes (one core each; PostgreSQL only)"),
) -> None:
    """Serve the REST API (docs at /docs); the schema must be migrated first."""
    if queue_url is not None:
        check_queue_url(queue_url)
    import uvicorn
    from pydantic import ValidationError

    from tuner_server.app import create_app
    from tuner_server.db.session import ConnectionBudgetError
    from tuner_server.settings import Settings

    url = resolve_url(database_url)
    shared = os.environ.get(MULTIPROC_ENV)
    if shared and not os.path.isdir(shared):
        fail(f"{MULTIPROC_ENV}={shared!r} is not a directory; create it or unset it")
    if workers > 1 and url.startswith("sqlite"):
        fail("--workers: several server processes need PostgreSQL; SQLite has one writer")
    try:
        settings = Settings(database_url=url)
    except ValidationError as err:
        first = err.errors()[0]
        name = "TUNER_" + "_".join(str(p) for p in first["loc"]).upper()
        fail(f"{name}: {first['msg']}; fix or unset that environment variable")
    if queue_url:
        settings = settings.model_copy(update={"queue_url": queue_url})
    # each process takes its share of PostgreSQL's connections (db.session.connection_share)
    settings = settings.model_copy(update={"server_processes": workers})
    try:
        app = create_app(settings)  # checks the schema before anything listens
    except ConnectionBudgetError as err:  # its message says what to change
        fail(str(err), code=1)
    except ValueError as err:  # the environment's worker token, the queue URL
        fail(f"{err}; fix the setting (--queue-url, TUNER_WORKER_TOKEN)", code=1)
    app.state.queue.ping()  # and the queue: a fleet without its queue would accept jobs
    #                         it cannot dispatch
    if workers == 1:
        uvicorn.run(app, host=host, port=port, log_level="info",
                    timeout_keep_alive=KEEP_ALIVE_S)
        return
    # Each process builds its own app from the environment; the scheduler in each takes
    # PostgreSQL's advisory lock, so one plans at a time; their /metrics counts meet in
    # one directory.
    os.environ["TUNER_DATABASE_URL"] = settings.database_url
    os.environ["TUNER_QUEUE_URL"] = settings.queue_url
    os.environ["TUNER_SERVER_PROCESSES"] = str(workers)
    app.state.engine.dispose()
    with metrics_dir():
        uvicorn.run("tuner_server.app:create_app", factory=True, host=host, port=port,
                    workers=workers, log_level="info", timeout_keep_alive=KEEP_ALIVE_S,
                    timeout_worker_healthcheck=STARTUP_S)

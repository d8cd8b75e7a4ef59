"""``tuner serve``: run the API server."""

from __future__ import annotations

import os

import typer

from cli.common import fail
from cli.db import DATABASE_URL, resolve_url


def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8600, "--port"),
    database_url: str | None = DATABASE_URL,
    queue_url: str | None = typer.Option(None, "--queue-url", envvar="TUNER_QUEUE_URL",
                                         help="sql (default) or redis://127.0.0.1:6379/0"),
    workers: int = typer.Option(1, "--workers", min=1,
                                help="server processes (one core each; PostgreSQL only)"),
) -> None:
    """Serve the REST API (docs at /docs); the schema must be migrated first."""
    import uvicorn

    from tuner_server.app import create_app
    from tuner_server.db.session import SchemaError
    from tuner_server.settings import Settings

    url = resolve_url(database_url)
    if workers > 1 and url.startswith("sqlite"):
        fail("--workers: several server processes need PostgreSQL; SQLite has one writer")
    try:
        settings = Settings(database_url=url)
        if queue_url:
            settings = settings.model_copy(update={"queue_url": queue_url})
        app = create_app(settings)  # checks the schema before anything listens
    except SchemaError as err:
        fail(str(err), code=1)
    if workers == 1:
        uvicorn.run(app, host=host, port=port, log_level="info")
        return
    # Each process builds its own app from the environment; the scheduler in each takes
    # PostgreSQL's advisory lock, so one plans at a time.
    os.environ["TUNER_DATABASE_URL"] = settings.database_url
    os.environ["TUNER_QUEUE_URL"] = settings.queue_url
    app.state.engine.dispose()
    uvicorn.run("tuner_server.app:create_app", factory=True, host=host, port=port,
                workers=workers, log_level="info")

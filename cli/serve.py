"""``tuner serve``: run the API server."""

from __future__ import annotations

import typer

from cli.common import fail
from cli.db import DATABASE_URL, resolve_url


def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8600, "--port"),
    database_url: str | None = DATABASE_URL,
    queue_url: str | None = typer.Option(None, "--queue-url", envvar="TUNER_QUEUE_URL",
                                         help="sql (default) or redis://127.0.0.1:6379/0"),
) -> None:
    """Serve the REST API (docs at /docs); the schema must be migrated first."""
    import uvicorn

    from tuner_server.app import create_app
    from tuner_server.db.session import SchemaError
    from tuner_server.settings import Settings

    try:
        settings = Settings(database_url=resolve_url(database_url))
        if queue_url:
            settings = settings.model_copy(update={"queue_url": queue_url})
        app = create_app(settings)
    except SchemaError as err:
        fail(str(err), code=1)
    uvicorn.run(app, host=host, port=port, log_level="info")

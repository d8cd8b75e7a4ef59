"""``tuner.dashboard``: the dashboard over a local database, read-only and without
tokens (what ``optuna-dashboard sqlite:///db`` is to Optuna), so the results of an
embedded ``tuner.tune`` can be looked at with no server to run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tuner.client import TunerError
from tuner.database import NoDatabase
from tuner.embedded import default_database_url, sqlite_path

if TYPE_CHECKING:
    from fastapi import FastAPI

# Beside `tuner serve`'s 8600, so both can run on one machine.
DEFAULT_PORT = 8601
# No token guards the local dashboard: it listens on the loopback interface only.
HOST = "127.0.0.1"


def dashboard_app(database_url: str | None = None) -> FastAPI:
    """The read-only dashboard app over ``database_url`` (default: ``TUNER_DATABASE_URL``,
    else the embedded SQLite file ``tuner.tune`` writes). :class:`tuner.NoDatabase` when
    there is no such database or its schema is not this version's."""
    from tuner_server.db.session import ConnectionBudgetError, SchemaError
    from tuner_server.local_dashboard import create_dashboard_app

    url = database_url or default_database_url()
    path = sqlite_path(url)
    if path is not None and not path.exists():  # connecting would create an empty one
        raise NoDatabase(f"no database at {path}; tune something first (tuner tune), or "
                         f"name one with --database-url")
    try:
        return create_dashboard_app(url)
    except SchemaError as err:
        raise NoDatabase(str(err)) from None
    except ConnectionBudgetError as err:  # PostgreSQL's max_connections, TUNER_DB_CONNECTIONS
        raise TunerError(str(err)) from None


def dashboard(database_url: str | None = None, port: int = DEFAULT_PORT,
              on_ready: Callable[[str], object] | None = None) -> None:
    """Serve :func:`dashboard_app` on http://127.0.0.1:``port``/ until interrupted;
    ``on_ready`` gets that address once the database has been checked."""
    import uvicorn

    app = dashboard_app(database_url)
    try:
        if on_ready is not None:
            on_ready(f"http://{HOST}:{port}/")
        uvicorn.run(app, host=HOST, port=port, log_level="warning")
    finally:
        app.state.engine.dispose()

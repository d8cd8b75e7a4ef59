"""The local dashboard (``tuner dashboard``): the server's app over a database, read-only
and without tokens, with no scheduler running, for a machine's own tuning results."""

from __future__ import annotations

from fastapi import FastAPI

from tuner_server.api.dashboard import ReadOnly
from tuner_server.app import create_app
from tuner_server.settings import Settings


def create_dashboard_app(database_url: str) -> FastAPI:
    """The app over ``database_url`` that answers reads only (405 to anything else),
    asks no token and plans nothing. Bind it to 127.0.0.1: no token guards it."""
    settings = Settings(database_url=database_url, require_auth=False, run_scheduler=False,
                        queue_url="sql", worker_token=None)
    app = create_app(settings)
    app.state.read_only = True
    app.add_middleware(ReadOnly)
    return app

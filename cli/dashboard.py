"""``tuner dashboard``: the dashboard over a local database, read-only, no token, on
127.0.0.1 (the fleet's server, ``tuner serve``, keeps its tokens)."""

from __future__ import annotations

import typer

import tuner.dashboard as api
from cli.db import DATABASE_URL, resolve_url


def dashboard(
    database_url: str | None = DATABASE_URL,
    port: int = typer.Option(api.DEFAULT_PORT, "--port", min=1, max=65535),
) -> None:
    """Show a database's jobs, tuning curves, workers and records in the browser,
    read-only and without a token, at http://127.0.0.1:PORT/ (default database: the one
    `tuner tune` writes)."""
    url = resolve_url(database_url)

    def ready(address: str) -> None:
        typer.echo(f"tuner dashboard: {address} (read-only, {url}); Ctrl-C stops it",
                   err=True)

    api.dashboard(url, port, on_ready=ready)

"""``tuner db`` and ``tuner token``: schema migrations and bearer tokens."""

from __future__ import annotations

from datetime import datetime

import typer
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from cli.common import fail, note_database
from tuner.embedded import sqlite_path
from tuner_server.db.session import check_schema, make_engine, session_factory, upgrade
from tuner_server.services.tokens import ROLES, create_token, list_tokens, revoke
from tuner_server.settings import Settings

db_app = typer.Typer(help="The server's database.", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens.", no_args_is_help=True)

DATABASE_URL = typer.Option(None, "--database-url", envvar="TUNER_DATABASE_URL",
                            help="SQLAlchemy URL; default: the embedded SQLite file")
BACKENDS = ("sqlite", "postgresql")
URL_FORMS = "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"


def resolve_url(url: str | None) -> str:
    """The database URL to use, checked before anything connects: it must parse, name a
    backend this server runs on and a driver that is installed."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    url = note_database(url or Settings().database_url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        fail(f"--database-url: {url!r} is not a database URL; use {URL_FORMS}")
    if parsed.get_backend_name() not in BACKENDS:
        fail(f"--database-url: {parsed.get_backend_name()!r} databases are not supported; "
             f"use {URL_FORMS}")
    try:
        parsed.get_dialect().import_dbapi()
    except ArgumentError as err:
        fail(f"--database-url: {err}; use {URL_FORMS}")
    except ImportError as err:
        fail(f"--database-url: its driver is not installed ({err}); use {URL_FORMS}", code=1)
    return url


def existing_database(database_url: str | None) -> str:
    """The URL of an existing database, else one line saying what to do (a missing
    SQLite file is not created)."""
    url = resolve_url(database_url)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        fail(f"no database at {path}; create it with: tuner db upgrade --database-url "
             f"'{url}'", code=1)
    return url


def open_database(database_url: str | None) -> tuple[Engine, sessionmaker[Session]]:
    """An existing database with this version's schema, else one line saying what to do."""
    url = existing_database(database_url)
    engine = make_engine(url)
    check_schema(engine, url)
    return engine, session_factory(engine)


@db_app.command("upgrade")
def db_upgrade(database_url: str | None = DATABASE_URL) -> None:
    """Create or migrate the schema to this version's newest revision."""
    url = resolve_url(database_url)
    before, after = upgrade(make_engine(url))
    typer.echo(f"schema {before or 'empty'} -> {after}")


@token_app.command("create")
def token_create(
    role: str = typer.Option(..., "--role", help=f"one of {', '.join(ROLES)}"),
    name: str = typer.Option("", "--name"),
    database_url: str | None = DATABASE_URL,
) -> None:
    """Create a token; it is printed once, on the last line."""
    if role not in ROLES:
        fail(f"--role: {role!r} is not one of {', '.join(ROLES)}")
    _check_name(name, "--name")
    _engine, sessions = open_database(database_url)
    with sessions.begin() as session:
        token = create_token(session, role, name)
    typer.echo(f"created a {role} token")
    typer.echo(token)


MAX_NAME = 128  # tokens.name
MAX_ID = 2**31 - 1


def _check_name(name: str, flag: str) -> None:
    if len(name) > MAX_NAME or any(ord(c) < 32 for c in name):
        fail(f"{flag}: a token name has at most {MAX_NAME} printable characters")


def _when(created: datetime | None) -> str:
    return created.strftime("%Y-%m-%d %H:%M:%S") if created else "-"


@token_app.command("list")
def token_list(database_url: str | None = DATABASE_URL) -> None:
    """Every token (never the token itself): id, name, role, its worker, when created."""
    _engine, sessions = open_database(database_url)
    with sessions() as session:
        tokens = list_tokens(session)
    if not tokens:
        typer.echo("no tokens")
        return
    rows = [("id", "name", "role", "worker", "created")]
    rows += [(str(t.id), t.name, t.role, "-" if t.worker_id is None else str(t.worker_id),
              _when(t.created_at)) for t in tokens]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


@token_app.command("revoke")
def token_revoke(
    key: str = typer.Argument(..., metavar="ID|NAME", help="a token's id or name"),
    database_url: str | None = DATABASE_URL,
) -> None:
    """Delete the token with this id, or every token with this name."""
    _check_name(key, "ID|NAME")
    if key.isdigit() and int(key) > MAX_ID:
        fail(f"no token has the id {key}; see `tuner token list`", code=1)
    _engine, sessions = open_database(database_url)
    with sessions.begin() as session:
        gone = revoke(session, key)
    if not gone:
        fail(f"no token has the id or name {key!r}; see `tuner token list`", code=1)
    for t in gone:
        typer.echo(f"revoked token {t.id} ({t.name}, {t.role})")

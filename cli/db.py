"""``tuner db`` and ``tuner token``: schema migrations and bearer tokens."""

from __future__ import annotations

import typer

from tuner_server.db.session import make_engine, session_factory, upgrade
from tuner_server.services.tokens import ROLES, create_token
from tuner_server.settings import Settings

db_app = typer.Typer(help="The server's database.", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens.", no_args_is_help=True)

DATABASE_URL = typer.Option(None, "--database-url", envvar="TUNER_DATABASE_URL",
                            help="SQLAlchemy URL; default: the embedded SQLite file")


def resolve_url(url: str | None) -> str:
    return url or Settings().database_url


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
        typer.echo(f"error: --role: {role!r} is not one of {', '.join(ROLES)}", err=True)
        raise typer.Exit(2)
    engine = make_engine(resolve_url(database_url))
    with session_factory(engine).begin() as session:
        token = create_token(session, role, name)
    typer.echo(f"created a {role} token")
    typer.echo(token)

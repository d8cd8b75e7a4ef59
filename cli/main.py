"""Entry point of the ``tuner`` console script.

Every error a user can cause ends here as ONE line on stderr, ``error: <what was
wrong>; <what to do>``, with exit code 2 for a bad command line and 1 for a failure;
commands only raise. ``--debug`` (or ``TUNER_DEBUG=1``) shows the traceback instead."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from cli import (
    dashboard,
    db,
    demo,
    devices,
    fleet,
    measure,
    models,
    records,
    serve,
    templates,
    tune,
    worker,
)
from cli.common import MAX_ERROR, database_in_use, with_hint
from schemas.text import one_line
from tuner import TunerError

DEBUG_ENV = "TUNER_DEBUG"
_debug = False  # set by --debug, before any command runs


def debugging() -> bool:
    return _debug or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")


def explain(err: Exception) -> tuple[str, int]:
    """(one-line message, exit code) for an exception a command let through."""
    from sqlalchemy import exc as sa

    from tuner_server.db.session import SchemaError
    from tuner_server.queue import QueueUnavailable

    url = database_in_use()
    if isinstance(err, sa.ArgumentError):
        return (f"--database-url {url!r}: {err}; use sqlite:///PATH or "
                f"postgresql+psycopg://USER@HOST:PORT/DATABASE"), 2
    if isinstance(err, sa.DBAPIError):
        cause = err.orig if err.orig is not None else err
        return (f"database {url!r}: {cause}; check --database-url (TUNER_DATABASE_URL), "
                f"that the database server runs and that the database exists"), 1
    if isinstance(err, sa.SQLAlchemyError):
        return f"database {url!r}: {err}; check --database-url (TUNER_DATABASE_URL)", 1
    if isinstance(err, SchemaError):
        return str(err), 1
    if isinstance(err, QueueUnavailable):
        return f"{err}; check --queue-url (TUNER_QUEUE_URL)", 1
    if isinstance(err, TunerError):
        return with_hint(err), 1
    if isinstance(err, ValidationError):  # a value no command checked before
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"invalid value: {where}: {first['msg']}; check the command's options", 2
    if isinstance(err, ModuleNotFoundError):
        return (f"the Python module {err.name!r} is not installed; install it (pip install "
                f"...) or choose another driver"), 1
    if isinstance(err, OSError) and err.strerror:
        where = f"{err.filename}: " if err.filename else ""
        return f"{where}{err.strerror}; check the path and its permissions", 1
    return (f"unexpected {type(err).__name__}: {err}; rerun with --debug for the traceback "
            f"and report it"), 1


class TunerGroup(TyperGroup):
    """The top-level group: turns every error into one line (see the module's doc)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except typer.TyperException as err:  # click's errors: a bad command line
            if type(err).__name__ == "NoArgsIsHelpError":  # `tuner db`: its help
                err.show()  # type: ignore[attr-defined]
            else:
                context = getattr(err, "ctx", None)
                where = f"; see `{context.command_path} --help`" if context else ""
                message = err.format_message().rstrip(".")
                typer.echo(one_line(f"error: {message}{where}", MAX_ERROR), err=True)
            code = err.exit_code
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            code = 1
        except Exception as err:
            if debugging():
                raise
            message, code = explain(err)
            typer.echo(one_line(f"error: {message}", MAX_ERROR), err=True)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="tuner",
    help="AutoTVM-style kernel tuning: templates, devices, measurements, models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=TunerGroup,
)


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", envvar=DEBUG_ENV,
                                        help="show tracebacks instead of one-line errors")
             ) -> None:
    global _debug
    _debug = debug


app.command("devices")(devices.devices)
app.command("space")(templates.space)
app.command("codegen")(templates.codegen)
app.command("measure")(measure.measure)
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("dashboard")(dashboard.dashboard)
app.command("tune")(tune.tune)
app.command("worker")(worker.worker)
app.command("jobs")(fleet.jobs)
app.command("job")(fleet.job)
app.command("workers")(fleet.workers)
app.command("cancel")(fleet.cancel)
app.command("tasks")(models.tasks)
app.command("compile")(models.compile_model)
app.command("run")(models.run_model)
app.add_typer(db.db_app, name="db")
app.add_typer(db.token_app, name="token")
app.add_typer(records.records_app, name="records")


if __name__ == "__main__":
    app()

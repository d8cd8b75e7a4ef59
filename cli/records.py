"""``tuner records``: import, export and best, on a database (``tuner.Database``, the
embedded one by default) or a server (``tuner.Client``): the same calls, printed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

import tuner as api
from cli.common import fail, load_template, load_workload, open_client, parse_target
from cli.db import DATABASE_URL, existing_database
from compiler.records.pretuned import TOPHUB_DIR
from schemas import Record, Target

records_app = typer.Typer(help="Tuning records (AutoTVM log lines).", no_args_is_help=True)

SERVER = typer.Option(None, "--server", envvar="TUNER_SERVER", help="server URL")
TOKEN = typer.Option(None, "--token", envvar="TUNER_TOKEN", help="bearer token")
LOG_FILES = typer.Argument(None, exists=True, dir_okay=False, readable=True,
                           help="AutoTVM log files (or --pretuned)")

Store = api.Client | api.Database  # the same record methods, on a server or a database


def _store(server: str | None, token: str | None, database_url: str | None) -> Store:
    """The server at ``--server``, else the database at ``--database-url`` (it must
    exist)."""
    if server:
        return open_client(server, token, timeout=60)
    return api.Database(existing_database(database_url))


@records_app.command("import")
def records_import(
    files: list[Path] | None = LOG_FILES,
    pretuned: bool = typer.Option(False, "--pretuned",
                                  help="import the TopHub logs shipped with the package"),
    target: str | None = typer.Option(None, "--target",
                                      help="with --pretuned: only this target's records "
                                           "('cuda' matches every cuda model)"),
    database_url: str | None = DATABASE_URL,
    server: str | None = SERVER,
    token: str | None = TOKEN,
) -> None:
    """Import AutoTVM log files; bad lines are listed, good ones kept, lines already
    stored counted as duplicates."""
    if target is not None and not pretuned:
        fail("--target: only with --pretuned (a log file is imported whole)")
    if pretuned == bool(files):
        fail("give log files or --pretuned (one of them)")
    logs = pretuned_logs(parse_target(target) if target else None) if pretuned else [
        (path, *read_log(path)) for path in files or []]
    failed = 0
    with _store(server, token, database_url) as store:
        for path, lines, undecodable in logs:
            answer = store.import_lines(lines)
            # the answer lists the first refused lines only; ``refused`` counts them all
            refused = answer.refused + len(undecodable)
            errors = sorted([(e.line, e.error) for e in answer.errors] + undecodable)
            typer.echo(f"{path}: {answer.accepted} imported, {refused} refused, "
                       f"{answer.duplicates} duplicates")
            for number, why in errors:
                typer.echo(f"  line {number}: {why}", err=True)
            if refused > len(errors):
                typer.echo(f"  ... and {refused - len(errors)} more", err=True)
            failed += refused
    if failed:
        raise typer.Exit(1)


def pretuned_logs(target: Target | None) -> list[tuple[Path, list[str], list[tuple[int, str]]]]:
    """The shipped TopHub logs as (path, lines, undecodable): with ``target``, only the
    logs holding its records and, in them, only its lines (others left blank, so line
    numbers stay those of the file)."""
    logs = []
    for path in sorted(TOPHUB_DIR.glob("*.log")):
        lines, bad = read_log(path)
        if target is not None:
            lines = [line if _for_target(line, target) else "" for line in lines]
            if not any(lines):
                continue
        logs.append((path, lines, bad))
    if not logs:
        fail(f"--target: no pretuned records for {target}; the shipped logs are for "
             f"{', '.join(sorted(p.stem.split('_')[0] for p in TOPHUB_DIR.glob('*.log')))}",
             code=1)
    return logs


def _for_target(line: str, target: Target) -> bool:
    """Whether a log line is a record of ``target`` as the records filter reads it: its
    kind, and its model when ``target`` names one."""
    try:
        record_target = Target.parse(json.loads(line)["input"][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return False
    return record_target.kind == target.kind and (
        not target.option("model") or record_target.model == target.model)


def read_log(path: Path) -> tuple[list[str], list[tuple[int, str]]]:
    """The file's lines, each decoded on its own: a line that is not UTF-8 is reported
    (and left blank, so the others keep their numbers) instead of losing the file."""
    lines: list[str] = []
    bad: list[tuple[int, str]] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            lines.append("")
            why = f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
            bad.append((number, why))
    return lines, bad


@records_app.command("export")
def records_export(
    target: str = typer.Option(..., "--target", help="'cuda' matches every cuda model"),
    best: bool = typer.Option(False, "--best", help="only the best per (model, workload)"),
    database_url: str | None = DATABASE_URL,
    server: str | None = SERVER,
    token: str | None = TOKEN,
) -> None:
    """Print AutoTVM lines to stdout."""
    tgt = parse_target(target)
    with _store(server, token, database_url) as store:
        sys.stdout.write(store.pretuned_log(tgt) if best else store.export(tgt))


@records_app.command("best")
def records_best(
    target: str = typer.Option(..., "--target"),
    template: str = typer.Option(..., "--template"),
    args: str = typer.Option(..., "--args", help="AutoTVM args list as JSON"),
    database_url: str | None = DATABASE_URL,
    server: str | None = SERVER,
    token: str | None = TOKEN,
) -> None:
    """The best record for one workload, and which rule found it (exit 1 if none)."""
    tgt = parse_target(target)
    workload = load_workload(load_template(template), args, flag="--args")
    with _store(server, token, database_url) as store:
        item = store.best(tgt, [workload])[0]
    if item.record is None:
        typer.echo(f"no record for this workload on {tgt}", err=True)
        raise typer.Exit(1)
    typer.echo(f"rule: {item.rule}", err=True)
    typer.echo(Record.from_json(item.record).to_line())

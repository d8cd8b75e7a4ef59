"""``tuner records``: import, export and best, on the embedded database or a server."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import typer
from sqlalchemy.orm import Session, sessionmaker

import tuner as api
from cli.common import (
    check_server_url,
    fail,
    load_template,
    load_workload,
    parse_target,
)
from cli.db import DATABASE_URL, open_database
from compiler.records.pretuned import TOPHUB_DIR
from schemas import Record, Target
from tuner_server.services import records as svc

records_app = typer.Typer(help="Tuning records (AutoTVM log lines).", no_args_is_help=True)

SERVER = typer.Option(None, "--server", envvar="TUNER_SERVER", help="server URL")
TOKEN = typer.Option(None, "--token", envvar="TUNER_TOKEN", help="bearer token")
LOG_FILES = typer.Argument(None, exists=True, dir_okay=False, readable=True,
                           help="AutoTVM log files (or --pretuned)")


def _sessions(database_url: str | None) -> sessionmaker[Session]:
    return open_database(database_url)[1]


def _client(server: str, token: str | None) -> api.Client:
    return api.Client(check_server_url(server), token, timeout=60)


def _target(text: str) -> Target:
    return parse_target(text)


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
    logs = pretuned_logs(_target(target) if target else None) if pretuned else [
        (path, *read_log(path)) for path in files or []]
    sessions = None if server else _sessions(database_url)
    client = _client(server, token) if server else None
    failed = 0
    for path, lines, undecodable in logs:
        if client is not None:
            answer = client.import_log(lines)
            accepted, refused = answer.accepted, answer.refused
            duplicates = answer.duplicates
            errors = [(e.line, e.error) for e in answer.errors]
        else:
            assert sessions is not None
            with sessions.begin() as session:
                report = svc.import_lines(session, lines)
            accepted, refused, errors = report.accepted, report.refused, report.errors
            duplicates = report.duplicates
        # the answer lists the first refused lines only; ``refused`` counts them all
        refused += len(undecodable)
        errors = sorted(errors + undecodable)
        typer.echo(f"{path}: {accepted} imported, {refused} refused, "
                   f"{duplicates} duplicates")
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
    tgt = _target(target)
    if server:
        with _client(server, token) as client:
            sys.stdout.write(client.pretuned_log(tgt) if best else client.export(tgt))
        return
    with _sessions(database_url)() as session:
        if best:
            lines, _etag = svc.pretuned_log(session, tgt)
            for line in lines:
                typer.echo(line)
            return

        def local_page(offset: int) -> tuple[int, list[str]]:
            total, items = svc.query(session, tgt, limit=PAGE, offset=offset)
            return total, [record.to_line() for record in items]

        _print_pages(local_page)


PAGE = 10000


def _print_pages(page: Callable[[int], tuple[int, list[str]]]) -> None:
    offset = 0
    while True:
        total, lines = page(offset)
        for line in lines:
            typer.echo(line)
        offset += len(lines)
        if not lines or offset >= total:
            return


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
    tgt = _target(target)
    workload = load_workload(load_template(template), args, flag="--args")
    if server:
        with _client(server, token) as client:
            item = client.best([workload], tgt)[0]
        rule, record = item.rule, Record.from_json(item.record) if item.record else None
    else:
        with _sessions(database_url)() as session:
            answer = svc.best(session, [workload], tgt)[0]
        rule, record = answer.rule, answer.record
    if record is None:
        typer.echo(f"no record for this workload on {tgt}", err=True)
        raise typer.Exit(1)
    typer.echo(f"rule: {rule}", err=True)
    typer.echo(record.to_line())

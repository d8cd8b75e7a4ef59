"""``tuner records``: import, export and best, on the embedded database or a server."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import typer
from sqlalchemy.orm import Session, sessionmaker

from cli.common import (
    check_server_url,
    fail,
    load_template,
    load_workload,
    parse_target,
)
from cli.db import DATABASE_URL, open_database
from schemas import Record, Target
from tuner_server.services import records as svc

records_app = typer.Typer(help="Tuning records (AutoTVM log lines).", no_args_is_help=True)

SERVER = typer.Option(None, "--server", envvar="TUNER_SERVER", help="server URL")
TOKEN = typer.Option(None, "--token", envvar="TUNER_TOKEN", help="bearer token")


def _sessions(database_url: str | None) -> sessionmaker[Session]:
    return open_database(database_url)[1]


def _client(server: str, token: str | None) -> httpx.Client:
    server = check_server_url(server)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server, headers=headers, timeout=60)


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        fail(f"server answered {response.status_code}: {detail}", code=1)
    return response


def _target(text: str) -> Target:
    return parse_target(text)


@records_app.command("import")
def records_import(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, readable=True),
    database_url: str | None = DATABASE_URL,
    server: str | None = SERVER,
    token: str | None = TOKEN,
) -> None:
    """Import AutoTVM log files; bad lines are listed, good ones kept."""
    sessions = None if server else _sessions(database_url)
    client = _client(server, token) if server else None
    failed = 0
    for path in files:
        lines, undecodable = read_log(path)
        if client is not None:
            body = _check(client.post("/api/v1/records/import", content="\n".join(lines),
                                      headers={"content-type": "text/plain"})).json()
            accepted, refused = body["accepted"], body.get("refused", len(body["errors"]))
            errors = [(e["line"], e["error"]) for e in body["errors"]]
        else:
            assert sessions is not None
            with sessions.begin() as session:
                report = svc.import_lines(session, lines)
            accepted, refused, errors = report.accepted, report.refused, report.errors
        # the answer lists the first refused lines only; ``refused`` counts them all
        refused += len(undecodable)
        errors = sorted(errors + undecodable)
        typer.echo(f"{path}: {accepted} imported, {refused} refused")
        for number, why in errors:
            typer.echo(f"  line {number}: {why}", err=True)
        if refused > len(errors):
            typer.echo(f"  ... and {refused - len(errors)} more", err=True)
        failed += refused
    if failed:
        raise typer.Exit(1)


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
        client = _client(server, token)
        if best:
            sys.stdout.write(_check(client.get(f"/api/v1/logs/{tgt}")).text)
            return

        def page(offset: int) -> tuple[int, list[str]]:
            body = _check(client.get("/api/v1/records", params={
                "target": str(tgt), "limit": PAGE, "offset": offset})).json()
            return body["total"], [json.dumps(item) for item in body["items"]]

        _print_pages(page)
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
        body = _check(_client(server, token).post("/api/v1/records/best", json={
            "target": str(tgt), "workloads": [workload.model_dump(mode="json")]})).json()
        item = body["items"][0]
        rule, record = item["rule"], Record.from_json(item["record"]) if item["record"] else None
    else:
        with _sessions(database_url)() as session:
            answer = svc.best(session, [workload], tgt)[0]
        rule, record = answer.rule, answer.record
    if record is None:
        typer.echo(f"no record for this workload on {tgt}", err=True)
        raise typer.Exit(1)
    typer.echo(f"rule: {rule}", err=True)
    typer.echo(record.to_line())

"""``tuner records``: import, export and best, on the embedded database or a server."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import typer

from cli.common import fail, load_template, load_workload
from cli.db import DATABASE_URL, resolve_url
from schemas import Record, Target
from tuner_server.db.session import SchemaError, check_schema, make_engine, session_factory
from tuner_server.services import records as svc

records_app = typer.Typer(help="Tuning records (AutoTVM log lines).", no_args_is_help=True)

SERVER = typer.Option(None, "--server", envvar="TUNER_SERVER", help="server URL")
TOKEN = typer.Option(None, "--token", envvar="TUNER_TOKEN", help="bearer token")


def _sessions(database_url: str | None):  # type: ignore[no-untyped-def]
    url = resolve_url(database_url)
    engine = make_engine(url)
    try:
        check_schema(engine, url)
    except SchemaError as err:
        fail(str(err), code=1)
    return session_factory(engine)


def _client(server: str, token: str | None) -> httpx.Client:
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
    try:
        return Target.parse(text)
    except ValueError as err:
        fail(f"--target: {err}")


@records_app.command("import")
def records_import(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, readable=True),
    database_url: str | None = DATABASE_URL,
    server: str | None = SERVER,
    token: str | None = TOKEN,
) -> None:
    """Import AutoTVM log files; bad lines are listed, good ones kept."""
    failed = 0
    for path in files:
        text = path.read_text()
        if server:
            body = _check(_client(server, token).post(
                "/api/v1/records/import", content=text,
                headers={"content-type": "text/plain"})).json()
            accepted, errors = body["accepted"], [(e["line"], e["error"]) for e in body["errors"]]
        else:
            with _sessions(database_url).begin() as session:
                report = svc.import_lines(session, text.splitlines())
            accepted, errors = report.accepted, report.errors
        typer.echo(f"{path}: {accepted} imported, {len(errors)} refused")
        for number, why in errors:
            typer.echo(f"  line {number}: {why}", err=True)
        failed += len(errors)
    if failed:
        raise typer.Exit(1)


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

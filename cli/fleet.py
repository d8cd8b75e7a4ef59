"""``tuner jobs``, ``tuner job``, ``tuner workers``, ``tuner cancel``: watch and steer a
tuning server's jobs and its worker fleet from a terminal.

The server is reached through ``tuner.Client``; the rendering (:func:`sparkline`, the
table builders) works on the server's answers as sent, so it can be tested alone.
Every failure a user can cause (server down, bad token, unknown job) becomes one
``error: ...`` line and exit code 1; bad arguments exit 2."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import httpx
import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cli.common import fail
from tuner import FINAL, Unreachable
from tuner import Client as FleetClient
from tuner import TunerError as FleetError
from tuner.client import DEFAULT_SERVER

REFRESH_S = 1.0  # --follow polls this often
RETRY_S = 30.0  # --follow rides out a server this long unreachable before giving up
SPARK_WIDTH = 32  # cells of a tuning curve at most; fewer on a narrow terminal
BLOCKS = "▁▂▃▄▅▆▇█"

SERVER = typer.Option(DEFAULT_SERVER, "--server", envvar="TUNER_SERVER",
                      help="the tuning server's URL")
TOKEN = typer.Option(None, "--token", envvar="TUNER_TOKEN",
                     help="a client (or admin) token")
JOB_ID = typer.Argument(..., min=1, help="a job id (from `tuner jobs`)")


def _client(server: str, token: str | None) -> FleetClient:
    if not server.startswith(("http://", "https://")):
        fail(f"--server: {server!r} is not an http:// or https:// URL")
    try:
        return FleetClient(server, token)
    except (httpx.InvalidURL, ValueError) as err:
        fail(f"--server: {err}")


def _failed(err: FleetError) -> NoReturn:
    fail(str(err), code=1)


# ---------------------------------------------------------------------- rendering

def sparkline(values: Sequence[float | None], width: int | None = None) -> str:
    """A unicode sparkline of ``values``, one block per value, scaled from their min to
    their max; ``None`` (nothing measured yet) is a blank. Longer series are squeezed to
    ``width`` cells, each showing the largest value of its stretch (for a best-so-far
    curve: the best at the stretch's end). A flat series draws full blocks."""
    if width is not None and width < 1:
        raise ValueError("width must be at least 1")
    series = list(values)
    if width is not None and len(series) > width:
        n = len(series)
        buckets = (series[i * n // width:(i + 1) * n // width] for i in range(width))
        series = [max((v for v in b if v is not None), default=None) for b in buckets]
    present = [v for v in series if v is not None and math.isfinite(v)]
    if not present:
        return " " * len(series)
    lo, hi = min(present), max(present)
    top = len(BLOCKS) - 1
    cells = []
    for v in series:
        if v is None or not math.isfinite(v):
            cells.append(" ")
        elif hi == lo:
            cells.append(BLOCKS[top])
        else:
            cells.append(BLOCKS[round((v - lo) / (hi - lo) * top)])
    return "".join(cells)


def curve_series(curve: Sequence[dict[str, Any]], trials: int) -> list[float | None]:
    """Best GFLOP/s after each of ``trials`` trials, from the server's curve (one point
    per improvement); ``None`` before the first valid measurement."""
    points = sorted((int(p["trial"]), p.get("best_gflops")) for p in curve
                    if p.get("best_gflops") is not None)
    length = max([trials] + [n for n, _ in points])
    series: list[float | None] = [None] * length
    best: float | None = None
    it = iter(points)
    nxt = next(it, None)
    for i in range(1, length + 1):
        while nxt is not None and nxt[0] <= i:
            best = float(nxt[1])  # type: ignore[arg-type]
            nxt = next(it, None)
        series[i - 1] = best
    return series


def duration(seconds: float | None) -> str:
    """``95`` -> ``1m35s``: short enough for a table column."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def gflops(value: float | None) -> str:
    return f"{value:.2f}" if value else "-"


def workload_text(args: Sequence[Any]) -> str:
    """AutoTVM args made short: tensors as shapes (``1x64x56x56``), lists as ``1,1``."""
    parts = []
    for arg in args:
        if isinstance(arg, list) and len(arg) == 3 and arg[0] == "TENSOR":
            parts.append("x".join(str(d) for d in arg[1]))
        elif isinstance(arg, list):
            parts.append(",".join(str(a) for a in arg))
        elif arg is None:
            parts.append("-")
        else:
            parts.append(str(arg))
    return " ".join(parts)


def job_progress(job: dict[str, Any]) -> tuple[int, int, float]:
    """(trials done, trials wanted, fraction): the server's figures where it gives them
    (its ``progress`` counts a task that stopped early as complete), else counted from
    the tasks."""
    tasks = job.get("tasks") or []
    done = job.get("trials_done")
    if done is None:
        done = sum(int(t.get("trials_done") or 0) for t in tasks)
    total = job.get("trials_total")
    if total is None:
        total = sum(int(t.get("n_trial") or job.get("n_trial") or 0) for t in tasks)
    fraction = job.get("progress")
    if fraction is None:
        fraction = done / total if total else 0.0
    return int(done), int(total), float(fraction)


def job_best(job: dict[str, Any]) -> float | None:
    """The best GFLOP/s of any of the job's tasks (the server's figure where it gives one)."""
    if "best_gflops" in job:
        return job["best_gflops"]  # type: ignore[no-any-return]
    return max((t["best_gflops"] for t in job.get("tasks") or [] if t.get("best_gflops")),
               default=None)


def _status(status: str) -> Text:
    style = {"done": "green", "running": "cyan", "queued": "yellow",
             "cancelled": "magenta", "failed": "bold red"}.get(status, "")
    return Text(status, style=style)


def _progress_text(job: dict[str, Any]) -> str:
    done, total, fraction = job_progress(job)
    return f"{done}/{total} ({fraction:.0%})" if total else f"{fraction:.0%}"


def jobs_table(jobs: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="jobs", title_justify="left")
    for name, justify in (("id", "right"), ("status", "left"), ("progress", "right"),
                          ("ETA", "right"), ("best GFLOP/s", "right"), ("tuner", "left"),
                          ("target", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for job in jobs:
        eta = None if job.get("status") in FINAL else job.get("eta_s")
        table.add_row(str(job["id"]), _status(str(job.get("status"))), _progress_text(job),
                      duration(eta), gflops(job_best(job)), str(job.get("tuner") or "-"),
                      str(job.get("target") or "-"))
    return table


def job_view(job: dict[str, Any], eta_s: float | None = None, note: str | None = None,
             spark_width: int = SPARK_WIDTH) -> RenderableType:
    """The job's header line and a table of its tasks with their tuning curves; ``eta_s``
    is our own estimate, for a server that gives none."""
    eta = None
    if job.get("status") not in FINAL:
        eta = job["eta_s"] if job.get("eta_s") is not None else eta_s
    header = Text.assemble(
        (f"job {job['id']} ", "bold"), _status(str(job.get("status"))),
        f"  {_progress_text(job)} trials  ETA {duration(eta)}  "
        f"best {gflops(job_best(job))} GFLOP/s  tuner {job.get('tuner') or '-'}  "
        f"target {job.get('target') or '-'}")
    parts: list[RenderableType] = [header]
    if job.get("note"):  # e.g. no live worker serves its target, and how to start one
        parts.append(Text(f"note: {job['note']}", style="yellow"))
    if job.get("error"):
        parts.append(Text(f"error: {job['error']}", style="red"))
    table = Table(box=None, pad_edge=False)
    for name, justify, wrap in (("#", "right", False), ("template", "left", False),
                                ("workload", "left", True), ("trials", "right", False),
                                ("best GFLOP/s", "right", False),
                                ("tuning curve", "left", False)):
        table.add_column(name, justify=justify, no_wrap=not wrap)  # type: ignore[arg-type]
    for i, task in enumerate(job.get("tasks") or []):
        done = int(task.get("trials_done") or 0)
        total = task.get("n_trial") or job.get("n_trial")
        curve = sparkline(curve_series(task.get("curve") or [], done), spark_width)
        table.add_row(str(i), str(task.get("template")), workload_text(task.get("args") or []),
                      f"{done}/{total}", gflops(task.get("best_gflops")),
                      Text(curve, style="green", no_wrap=True))
    parts.append(table)
    if note:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


def age(then: float | None, now: float) -> str:
    return "-" if then is None else f"{duration(max(now - float(then), 0.0))} ago"


def workers_table(workers: Sequence[dict[str, Any]], now: float) -> Table:
    table = Table(title="workers", title_justify="left")
    for name, justify in (("id", "right"), ("name", "left"), ("target", "left"),
                          ("device", "left"), ("last heartbeat", "right"), ("alive", "left"),
                          ("trials/min", "right"), ("error rate", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for w in workers:
        alive = w.get("alive")
        rate, errors = w.get("trials_per_minute"), w.get("error_rate")
        table.add_row(
            str(w.get("id")), str(w.get("name") or "-"), str(w.get("target") or "-"),
            str(w.get("device") or "-"), age(w.get("last_heartbeat"), now),
            Text("-") if alive is None else Text("yes", "green") if alive else Text("no", "red"),
            "-" if rate is None else f"{float(rate):.1f}",
            "-" if errors is None else f"{float(errors):.0%}")
    return table


def _console() -> Console:
    return Console(highlight=False)


def _spark_width(console: Console) -> int:
    """Leave the workload column room on a narrow terminal (80 columns: 10 cells)."""
    return max(10, min(SPARK_WIDTH, console.width - 70))


# ----------------------------------------------------------------------- commands

def jobs(server: str = SERVER, token: str | None = TOKEN,
         limit: int = typer.Option(50, "--limit", min=1, max=1000,
                                   help="newest jobs shown")) -> None:
    """The server's jobs, newest first: progress, ETA, best GFLOP/s."""
    with _client(server, token) as client:
        try:
            rows = [j.model_dump(mode="json") for j in client.jobs(limit)]
        except FleetError as err:
            _failed(err)
    if not rows:
        typer.echo("no jobs")
        return
    _console().print(jobs_table(rows))


def job(job_id: int = JOB_ID,
        follow: bool = typer.Option(False, "--follow", "-f",
                                    help="refresh every second until the job ends "
                                         "(exit 1 if it ends cancelled or failed)"),
        server: str = SERVER, token: str | None = TOKEN) -> None:
    """One job: its tasks, their trials, best GFLOP/s and tuning curves."""
    with _client(server, token) as client:
        try:
            if not follow:
                console = _console()
                console.print(job_view(client.job(job_id).model_dump(mode="json"),
                                       spark_width=_spark_width(console)))
                return
            final = _follow(client, job_id)
        except FleetError as err:
            _failed(err)
        except KeyboardInterrupt:
            typer.echo(f"stopped following job {job_id} (it keeps running on the server)",
                       err=True)
            raise typer.Exit(130) from None
    if final["status"] != "done":
        raise typer.Exit(1)


def _follow(client: FleetClient, job_id: int) -> dict[str, Any]:
    """A rich Live view of the job, refreshed every ``REFRESH_S``, until it ends."""
    job = client.job(job_id).model_dump(mode="json")  # an unknown job or bad token fails before anything is drawn
    console = _console()
    try:
        with Live(job_view(job, spark_width=_spark_width(console)), console=console,
                  auto_refresh=False) as live:
            return _poll(client, job, live)
    finally:
        if not console.is_terminal:  # a pipe gets the last view only, without its newline
            console.line()


def _poll(client: FleetClient, job: dict[str, Any], live: Live) -> dict[str, Any]:
    """Refresh ``live`` until the job ends; rides out a server that stops answering (a
    restart) for up to ``RETRY_S``, saying so under the view."""
    samples: list[tuple[float, int]] = []  # (time, trials done): an ETA of our own
    unreachable_since: float | None = None
    while job["status"] not in FINAL:
        time.sleep(REFRESH_S)
        note = None
        try:
            job = client.job(int(job["id"])).model_dump(mode="json")
            unreachable_since = None
        except Unreachable as err:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > RETRY_S:
                raise
            note = f"{err}; retrying"
        done, total, _ = job_progress(job)
        samples = [*samples[-29:], (time.monotonic(), done)]
        live.update(job_view(job, _eta(samples, total), note,
                             _spark_width(live.console)), refresh=True)
    return job


def _eta(samples: Sequence[tuple[float, int]], total: int) -> float | None:
    """Seconds left at the rate seen over ``samples`` (None until trials move)."""
    if len(samples) < 2:
        return None
    (t0, d0), (t1, d1) = samples[0], samples[-1]
    if d1 <= d0 or t1 <= t0:
        return None
    return max(total - d1, 0) / ((d1 - d0) / (t1 - t0))


def workers(server: str = SERVER, token: str | None = TOKEN) -> None:
    """The registered workers: heartbeat age, alive, trials/min, error rate."""
    with _client(server, token) as client:
        try:
            rows = [w.model_dump(mode="json") for w in client.workers()]
        except FleetError as err:
            _failed(err)
    if not rows:
        typer.echo("no workers registered")
        return
    _console().print(workers_table(rows, time.time()))


def cancel(job_id: int = JOB_ID, server: str = SERVER, token: str | None = TOKEN) -> None:
    """Cancel a job: its queued trials are withdrawn; trials in hand still report."""
    with _client(server, token) as client:
        try:
            status = client.cancel(job_id)
        except FleetError as err:
            _failed(err)
    if status == "cancelled":
        typer.echo(f"job {job_id} cancelled")
    else:
        typer.echo(f"job {job_id} {status}: it had already ended, nothing to cancel")

"""``tuner jobs``, ``tuner job``, ``tuner workers``, ``tuner cancel``: watch and steer a
tuning server's jobs and its worker fleet from a terminal.

The server is reached through ``tuner.Client``; the rendering (:func:`sparkline`, the
table builders) works on its typed answers (``JobView``, ``WorkerInfo``), so it can be
tested alone.
Every failure a user can cause (server down, bad token, unknown job) becomes one
``error: ...`` line and exit code 1; bad arguments exit 2."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cli.common import fail, open_client, with_hint
from schemas.api import CurvePoint, JobStatus, JobView, WorkerInfo
from tuner import Client as FleetClient
from tuner import TunerError as FleetError
from tuner import Unreachable
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


def _failed(err: FleetError) -> NoReturn:
    fail(with_hint(err), code=1)


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


def curve_series(curve: Sequence[CurvePoint], trials: int) -> list[float | None]:
    """Best GFLOP/s after each of ``trials`` trials, from the server's curve (one point
    per improvement); ``None`` before the first valid measurement."""
    points = sorted((p.trial, p.best_gflops) for p in curve if p.best_gflops is not None)
    length = max([trials] + [n for n, _ in points])
    series: list[float | None] = [None] * length
    best: float | None = None
    it = iter(points)
    nxt = next(it, None)
    for i in range(1, length + 1):
        while nxt is not None and nxt[0] <= i:
            best = nxt[1]
            nxt = next(it, None)
        series[i - 1] = best
    return series


def duration(seconds: float | None) -> str:
    """``95`` -> ``1m35s``: short enough for a table column."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = round(seconds)
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


_STYLES = {JobStatus.DONE: "green", JobStatus.RUNNING: "cyan", JobStatus.QUEUED: "yellow",
           JobStatus.VERIFYING: "blue", JobStatus.CANCELLED: "magenta",
           JobStatus.FAILED: "bold red"}


def _status(status: JobStatus) -> Text:
    return Text(status.value, style=_STYLES[status])


def _progress_text(job: JobView) -> str:
    """Trials done of wanted and the server's fraction (a task that stopped early
    counts as complete)."""
    if not job.trials_total:
        return f"{job.progress:.0%}"
    return f"{job.trials_done}/{job.trials_total} ({job.progress:.0%})"


def jobs_table(jobs: Sequence[JobView]) -> Table:
    table = Table(title="jobs", title_justify="left")
    for name, justify in (("id", "right"), ("status", "left"), ("progress", "right"),
                          ("ETA", "right"), ("best GFLOP/s", "right"), ("tuner", "left"),
                          ("target", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for job in jobs:
        eta = None if job.status.final else job.eta_s
        table.add_row(str(job.id), _status(job.status), _progress_text(job), duration(eta),
                      gflops(job.best_gflops), job.tuner, job.target)
    return table


def job_view(job: JobView, eta_s: float | None = None, note: str | None = None,
             spark_width: int = SPARK_WIDTH) -> RenderableType:
    """The job's header line and a table of its tasks with their tuning curves; ``eta_s``
    is our own estimate, for when the server has none yet."""
    eta = None if job.status.final else job.eta_s if job.eta_s is not None else eta_s
    header = Text.assemble(
        (f"job {job.id} ", "bold"), _status(job.status),
        f"  {_progress_text(job)} trials  ETA {duration(eta)}  "
        f"best {gflops(job.best_gflops)} GFLOP/s  tuner {job.tuner}  target {job.target}")
    parts: list[RenderableType] = [header]
    if job.note:  # e.g. no live worker serves its target, and how to start one
        parts.append(Text(f"note: {job.note}", style="yellow"))
    if job.error:
        parts.append(Text(f"error: {job.error}", style="red"))
    table = Table(box=None, pad_edge=False)
    for name, justify, wrap in (("#", "right", False), ("template", "left", False),
                                ("workload", "left", True), ("trials", "right", False),
                                ("best GFLOP/s", "right", False),
                                ("tuning curve", "left", False)):
        table.add_column(name, justify=justify, no_wrap=not wrap)  # type: ignore[arg-type]
    for i, task in enumerate(job.tasks):
        curve = sparkline(curve_series(task.curve or [], task.trials_done), spark_width)
        table.add_row(str(i), task.template, workload_text(task.args),
                      f"{task.trials_done}/{task.n_trial}", gflops(task.best_gflops),
                      Text(curve, style="green", no_wrap=True))
    parts.append(table)
    if note:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


def age(then: float, now: float) -> str:
    return f"{duration(max(now - then, 0.0))} ago"


def workers_table(workers: Sequence[WorkerInfo], now: float) -> Table:
    table = Table(title="workers", title_justify="left")
    for name, justify in (("id", "right"), ("name", "left"), ("target", "left"),
                          ("device", "left"), ("last heartbeat", "right"), ("alive", "left"),
                          ("trials/min", "right"), ("error rate", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for w in workers:
        table.add_row(
            str(w.id), w.name or "-", w.target, w.device or "-", age(w.last_heartbeat, now),
            Text("yes", "green") if w.alive else Text("no", "red"),
            f"{w.trials_per_minute:.1f}",
            "-" if w.error_rate is None else f"{w.error_rate:.0%}")
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
    with open_client(server, token) as client:
        try:
            rows = client.jobs(limit)
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
    with open_client(server, token) as client:
        try:
            if not follow:
                console = _console()
                console.print(job_view(client.job(job_id), spark_width=_spark_width(console)))
                return
            final = _follow(client, job_id)
        except FleetError as err:
            _failed(err)
        except KeyboardInterrupt:
            typer.echo(f"stopped following job {job_id} (it keeps running on the server)",
                       err=True)
            raise typer.Exit(130) from None
    if final.status != JobStatus.DONE:
        raise typer.Exit(1)


def _follow(client: FleetClient, job_id: int) -> JobView:
    """A rich Live view of the job, refreshed every ``REFRESH_S``, until it ends."""
    job = client.job(job_id)  # an unknown job or bad token fails before anything is drawn
    console = _console()
    try:
        with Live(job_view(job, spark_width=_spark_width(console)), console=console,
                  auto_refresh=False) as live:
            return _poll(client, job, live)
    finally:
        if not console.is_terminal:  # a pipe gets the last view only, without its newline
            console.line()


def _poll(client: FleetClient, job: JobView, live: Live) -> JobView:
    """Refresh ``live`` until the job ends; rides out a server that stops answering (a
    restart) for up to ``RETRY_S``, saying so under the view."""
    samples: list[tuple[float, int]] = []  # (time, trials done): an ETA of our own
    unreachable_since: float | None = None
    while not job.status.final:
        time.sleep(REFRESH_S)
        note = None
        try:
            job = client.job(job.id)
            unreachable_since = None
        except Unreachable as err:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > RETRY_S:
                raise
            note = f"{err}; retrying"
        samples = [*samples[-29:], (time.monotonic(), job.trials_done)]
        live.update(job_view(job, _eta(samples, job.trials_total), note,
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
    with open_client(server, token) as client:
        try:
            rows = client.workers()
        except FleetError as err:
            _failed(err)
    if not rows:
        typer.echo("no workers registered")
        return
    _console().print(workers_table(rows, time.time()))


def cancel(job_id: int = JOB_ID, server: str = SERVER, token: str | None = TOKEN) -> None:
    """Cancel a job: its queued trials are withdrawn; trials in hand still report."""
    with open_client(server, token) as client:
        try:
            status = client.cancel(job_id)
        except FleetError as err:
            _failed(err)
    if status == JobStatus.CANCELLED:
        typer.echo(f"job {job_id} cancelled")
    else:
        typer.echo(f"job {job_id} {status}: it had already ended, nothing to cancel")

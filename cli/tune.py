"""``tuner tune``: tune a model's tasks or one workload, embedded (nothing running) or on
a server.

Everything the command line names (target, tuner, template, workload, model, measure
options, URLs, the local device) is checked before anything starts. Ctrl-C cancels the
job and kills the trial being measured; a job that ends failed or cancelled exits 1."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from cli.common import (
    QCONFIG,
    QUANTIZE,
    check_server_url,
    fail,
    load_template,
    load_workload,
    measure_options,
    parse_target,
    quantized,
)
from cli.db import DATABASE_URL, resolve_url, sqlite_path
from cli.fleet import FINAL, FleetClient, FleetError
from schemas import Target, Workload
from tuner_server.search import DEFAULT_TUNER, TUNERS

if TYPE_CHECKING:
    from compiler.runtime import DeviceInfo

WAITING_WARN_S = 5.0  # a job waiting this long for a worker gets one warning
EMBEDDED = "embedded"  # the embedded run's token names and worker name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_device(target: Target, spec: str | None) -> DeviceInfo:
    """The local device that serves ``target`` (``spec`` if given), by the server's own
    rule for which worker gets which trial; else one line saying what there is."""
    from compiler.runtime import list_devices
    from compiler.runtime.device import preferred_device
    from tuner_server.queue import queue_matches
    from tuner_server.queue.base import queue_name

    try:
        devices = list_devices()
    except Exception as err:  # noqa: BLE001 - a broken driver: as if there were none
        devices, why = [], f" ({err})"
    else:
        why = ""
    have = ", ".join(f"{d.spec} ({d.target})" for d in devices) or f"none{why}"
    wanted = queue_name(target)
    serving = [d for d in devices if wanted in queue_matches(d.target)]
    if spec is not None:
        spec = spec if ":" in spec else f"{spec}:0"
        named = [d for d in devices if d.spec == spec]
        if not named:
            fail(f"--device: no local device {spec!r}; local devices: {have}", code=1)
        if named[0].spec not in {d.spec for d in serving}:
            fail(f"--device {spec} is a {str(named[0].target)!r} device, which does not "
                 f"serve {str(target)!r}; pick another --target or --device, or use "
                 f"--server to tune on a fleet", code=1)
        return named[0]
    if not serving:
        fail(f"no local device serves {str(target)!r}; local devices: {have}; use --server "
             f"to tune on a fleet", code=1)
    return preferred_device(serving) or serving[0]  # a GPU first, as `tuner worker` picks


def tokens_file(database_url: str) -> Path:
    """Where the embedded runs of this database keep their token pair: beside a SQLite
    file, else in the user's data directory under the URL's hash."""
    path = sqlite_path(database_url)
    if path is not None:
        return path.with_name(path.name + ".tokens.json")
    from tuner_server.settings import user_data_dir

    digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return user_data_dir() / f"embedded-{digest}.tokens.json"


def embedded_tokens(sessions: Any, database_url: str) -> dict[str, str]:
    """One client token and one (register-only) worker token for every embedded run of
    this database: the saved pair while the database still has it, else a new one."""
    from tuner_server.services.tokens import create_token, lookup

    path = tokens_file(database_url)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    tokens: dict[str, str] = {}
    with sessions.begin() as session:
        for role in ("client", "worker"):
            kept = saved.get(role)
            info = lookup(session, kept) if isinstance(kept, str) else None
            if info is None or info.role != role or info.worker_id is not None:
                kept = create_token(session, role, EMBEDDED)
            tokens[role] = str(kept)
    if tokens != saved:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(tokens, f)
        os.replace(tmp, path)
    return tokens


class WorkerStopped(RuntimeError):
    """The embedded worker's loop ended with an error."""


class EmbeddedFleet:
    """The server on SQLite plus one worker on the local device, in this process; built
    by :meth:`start`, so a Ctrl-C halfway through still finds what to :meth:`close`."""

    def __init__(self, database_url: str, device: str) -> None:
        self._database_url, self._device = database_url, device
        self._server: Any = None
        self._threads: list[threading.Thread] = []
        self.agent: Any = None
        self.failure: Exception | None = None
        self.url = ""
        self.client_token = ""

    def start(self) -> None:
        import uvicorn

        from tuner_server.app import create_app
        from tuner_server.db.session import make_engine, session_factory, upgrade
        from tuner_server.settings import Settings
        from workers.agent import WorkerAgent

        engine = make_engine(self._database_url)
        try:
            upgrade(engine)
            tokens = embedded_tokens(session_factory(engine), self._database_url)
        finally:
            engine.dispose()
        self.client_token = tokens["client"]
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        app = create_app(Settings(database_url=self._database_url))
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                     log_level="warning"))
        self._threads.append(threading.Thread(target=self._server.run, daemon=True))
        self._threads[0].start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline or not self._threads[0].is_alive():
                raise RuntimeError("the embedded server did not start")
            time.sleep(0.05)
        # One worker row for every embedded run: the server reuses the stopped row of a
        # worker of this name and target.
        self.agent = WorkerAgent(self.url, tokens["worker"], self._device, name=EMBEDDED,
                                 wait_s=1.0)
        self.agent.register()
        worker = threading.Thread(target=self._work, daemon=True)
        worker.start()
        self._threads.append(worker)

    def _work(self) -> None:
        try:
            self.agent.run()
        except Exception as err:  # noqa: BLE001 - reported by check(), in the main thread
            self.failure = err

    def check(self) -> None:
        """Raise :class:`WorkerStopped` if the worker thread died: the job would wait
        for it forever."""
        if self.failure is not None:
            raise WorkerStopped(f"the embedded worker stopped: {self.failure}")

    def close(self) -> None:
        """Stop the worker (it gives its lease back and deregisters), then the server."""
        if self.agent is not None:
            self.agent.stopping.set()
            if len(self._threads) > 1:
                self._threads[1].join(60)
            else:  # registered (or registering) but not serving: only its child to reap
                self.agent.abort()
                self.agent.deregister()
        if self._server is not None:
            self._server.should_exit = True
            self._threads[0].join(10)


def follow(client: FleetClient, job_id: int,
           check: Callable[[], None] | None = None) -> dict[str, Any]:
    """Show trials, best GFLOP/s and ETA until the job ends; warn once if it waits for a
    worker that serves its target; ``check`` raises if the job can no longer end."""
    columns = (TextColumn("[bold]job {task.fields[job]}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} trials"),
               TextColumn("best {task.fields[best]}"), TimeRemainingColumn())
    waiting_since: float | None = None
    warned = False
    with Progress(*columns) as progress:
        bar = None
        while True:
            job = client.job(job_id)
            total = sum(t["n_trial"] for t in job["tasks"])
            done = sum(t["trials_done"] for t in job["tasks"])
            best = max((t["best_gflops"] or 0.0 for t in job["tasks"]), default=0.0)
            fields = {"job": job_id, "best": f"{best:.2f} GFLOP/s" if best else "-"}
            if bar is None:
                bar = progress.add_task("tune", total=total, **fields)
            progress.update(bar, completed=done, total=total, **fields)
            if job["status"] in FINAL:
                return job
            if check is not None:
                check()
            if job.get("waiting_for_worker"):
                waiting_since = waiting_since or time.monotonic()
                if not warned and time.monotonic() - waiting_since > WAITING_WARN_S:
                    note = job.get("note") or "no live worker serves this job's target"
                    typer.echo(f"warning: job {job_id} is waiting: {note}", err=True)
                    warned = True
            else:
                waiting_since = None
            time.sleep(0.5)


def tune(
    model: Path | None = typer.Argument(None, exists=True, dir_okay=False,
                                        help="an .onnx model: tune all its conv2d/dense tasks"),
    target: str = typer.Option(..., "--target", help="e.g. 'opencl -model=pocl-cpu'"),
    template: str | None = typer.Option(None, "--template", help="one task: its template"),
    args: str | None = typer.Option(None, "--args", help="one task: AutoTVM args list as JSON"),
    trials: int = typer.Option(64, "--trials", min=1, max=1_000_000, help="trials per task"),
    tuner: str = typer.Option(DEFAULT_TUNER, "--tuner",
                              help="one of: " + ", ".join(sorted(TUNERS))),
    early_stopping: int | None = typer.Option(None, "--early-stopping", min=1, max=1_000_000,
                                              help="stop a task after this many trials "
                                                   "without a better config"),
    plan_size: int = typer.Option(16, "--plan-size", min=1, max=4096,
                                  help="configs planned at a time per task"),
    server: str | None = typer.Option(None, "--server", envvar="TUNER_SERVER"),
    token: str | None = typer.Option(None, "--token", envvar="TUNER_TOKEN"),
    database_url: str | None = DATABASE_URL,
    device: str | None = typer.Option(None, "--device", help="embedded worker's device"),
    number: int = typer.Option(3, "--number", min=1),
    repeat: int = typer.Option(3, "--repeat", min=1),
    min_repeat_ms: float = typer.Option(50.0, "--min-repeat-ms", min=0),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds per trial"),
    quantize: bool = QUANTIZE,
    qconfig: list[str] | None = QCONFIG,
) -> None:
    """Tune a model's tasks (MODEL) or one workload (--template, --args) as one job;
    without --server, runs the server and a worker in-process. With --quantize, the
    tasks of the int8 model (what `tuner compile --quantize` builds)."""
    tgt = parse_target(target)
    if tuner not in TUNERS:
        fail(f"--tuner: {tuner!r} is not one of {', '.join(sorted(TUNERS))}")
    measure = measure_options(number, repeat, min_repeat_ms, timeout)
    if server is not None:
        server = check_server_url(server)
        if device is not None:
            fail("--device: chooses the embedded worker's device; a server's workers "
                 "choose their own (drop --device or --server)")
    workloads = _workloads(model, target, template, args, quantize, qconfig)
    body = {"target": target, "tasks": [w.model_dump(mode="json") for w in workloads],
            "n_trial": trials, "tuner": tuner, "early_stopping": early_stopping,
            "plan_size": plan_size, "measure": measure.model_dump()}
    fleet: EmbeddedFleet | None = None
    best_target = target
    job_id: int | None = None
    try:
        if server is None:
            url = resolve_url(database_url)
            info = local_device(tgt, device)
            fleet = EmbeddedFleet(url, info.spec)
            best_target = str(info.target)
            fleet.start()
            server, token = fleet.url, fleet.client_token
        with FleetClient(server, token, timeout=60) as client:
            try:
                job_id = int(client.request("POST", "/api/v1/jobs", "jobs", json=body)["id"])
                job = follow(client, job_id, fleet.check if fleet else None)
                best = client.request("POST", "/api/v1/records/best", "records", json={
                    "target": best_target,
                    "workloads": [w.model_dump(mode="json") for w in workloads]})["items"]
            except KeyboardInterrupt:
                _interrupted(client, job_id, fleet)
            except WorkerStopped as err:
                client.cancel(job_id)  # type: ignore[arg-type]
                fail(f"{err}; job {job_id} cancelled: fix that and run `tuner tune` again",
                     code=1)
    except KeyboardInterrupt:  # before the server answered: nothing was submitted
        if fleet is not None and fleet.agent is not None:
            fleet.agent.abort()
        typer.echo("interrupted: no job was submitted", err=True)
        raise typer.Exit(130) from None
    finally:
        if fleet is not None:
            fleet.close()
    done = sum(t["trials_done"] for t in job["tasks"])
    top = max((t["best_gflops"] or 0.0 for t in job["tasks"]), default=0.0)
    typer.echo(f"job {job['id']} {job['status']}: {done} trials, best {top:.2f} GFLOP/s")
    if len(job["tasks"]) > 1:
        for i, (task, workload) in enumerate(zip(job["tasks"], workloads)):
            typer.echo(f"  task {i}: {task['trials_done']} trials, best "
                       f"{task['best_gflops'] or 0:.2f} GFLOP/s  {workload.key}")
    if len(workloads) == 1 and best[0]["record"]:
        typer.echo(json.dumps(best[0]["record"]))
    if job["status"] == "failed":
        fail(f"job {job['id']} failed: {job.get('error') or 'every task failed'}; see "
             f"`tuner job {job['id']}`", code=1)
    if job["status"] != "done":
        raise typer.Exit(1)


def _interrupted(client: FleetClient, job_id: int | None, fleet: EmbeddedFleet | None
                 ) -> NoReturn:
    """Ctrl-C: kill the trial being measured, cancel the job, say so in one line."""
    if fleet is not None:
        fleet.agent.abort()
    if job_id is None:
        typer.echo("interrupted: no job was submitted", err=True)
        raise typer.Exit(130)
    try:
        status = client.cancel(job_id).get("status")
        typer.echo(f"interrupted: job {job_id} cancelled" if status == "cancelled" else
                   f"interrupted: job {job_id} had already ended ({status})", err=True)
    except FleetError as err:
        typer.echo(f"interrupted: job {job_id} may still run ({err}); cancel it with "
                   f"`tuner cancel {job_id}`", err=True)
    raise typer.Exit(130)


def _workloads(model: Path | None, target: str, template: str | None,
               args: str | None, quantize: bool = False,
               qconfig: list[str] | None = None) -> list[Workload]:
    if model is not None:
        if template or args:
            fail("give MODEL or --template/--args, not both")
        from cli.models import import_model
        from compiler.passes import optimize
        from compiler.tasks import extract_tasks

        graph = quantized(import_model(model), quantize, qconfig)
        tasks = extract_tasks(optimize(graph), Target.parse(target))
        if not tasks:
            fail(f"{model}: no conv2d or dense layer to tune", code=1)
        typer.echo(f"{model.name}: {len(tasks)} tasks")
        return [t.workload for t in tasks]
    if template is None or args is None:
        fail("give MODEL, or --template and --args for one workload")
    if quantize or qconfig:
        fail("--quantize: quantizes a MODEL's layers (give an int8 template for one workload)")
    tmpl = load_template(template)
    return [load_workload(tmpl, args, flag="--args")]

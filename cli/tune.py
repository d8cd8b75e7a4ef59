"""``tuner tune``: tune a model's tasks or one workload, embedded (nothing running) or on
a server."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from cli.common import QCONFIG, QUANTIZE, fail, load_template, load_workload, quantized
from cli.db import DATABASE_URL, resolve_url
from schemas import MeasureOptions, Target, Workload
from tuner_server.search import DEFAULT_TUNER, TUNERS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedFleet:
    """The server on SQLite plus one worker on the local device, in this process."""

    def __init__(self, database_url: str, device: str | None) -> None:
        import uvicorn

        from tuner_server.app import create_app
        from tuner_server.db.session import make_engine, session_factory, upgrade
        from tuner_server.services.tokens import create_token
        from tuner_server.settings import Settings
        from workers.agent import WorkerAgent

        engine = make_engine(database_url)
        upgrade(engine)
        with session_factory(engine).begin() as session:
            self.client_token = create_token(session, "client", "embedded")
            worker_token = create_token(session, "worker", "embedded")
        engine.dispose()
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        app = create_app(Settings(database_url=database_url))
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                     log_level="warning"))
        self._threads = [threading.Thread(target=self._server.run, daemon=True)]
        self._threads[0].start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline:
                raise RuntimeError("the embedded server did not start")
            time.sleep(0.05)
        self.agent = WorkerAgent(self.url, worker_token, device, name="embedded", wait_s=1.0)
        self.agent.register()
        worker = threading.Thread(target=self.agent.run, daemon=True)
        worker.start()
        self._threads.append(worker)

    def close(self) -> None:
        self.agent.stopping.set()
        self._threads[1].join(60)
        self._server.should_exit = True
        self._threads[0].join(10)


def follow(client: httpx.Client, job_id: int) -> dict[str, Any]:
    """Show trials, best GFLOP/s and ETA until the job ends."""
    columns = (TextColumn("[bold]job {task.fields[job]}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} trials"),
               TextColumn("best {task.fields[best]}"), TimeRemainingColumn())
    with Progress(*columns) as progress:
        bar = None
        while True:
            job = client.get(f"/api/v1/jobs/{job_id}").raise_for_status().json()
            total = sum(t["n_trial"] for t in job["tasks"])
            done = sum(t["trials_done"] for t in job["tasks"])
            best = max((t["best_gflops"] or 0.0 for t in job["tasks"]), default=0.0)
            fields = {"job": job_id, "best": f"{best:.2f} GFLOP/s" if best else "-"}
            if bar is None:
                bar = progress.add_task("tune", total=total, **fields)
            progress.update(bar, completed=done, total=total, **fields)
            if job["status"] in ("done", "cancelled", "failed"):
                return job
            time.sleep(0.5)


def tune(
    model: Path | None = typer.Argument(None, exists=True, dir_okay=False,
                                        help="an .onnx model: tune all its conv2d/dense tasks"),
    target: str = typer.Option(..., "--target", help="e.g. 'opencl -model=pocl-cpu'"),
    template: str | None = typer.Option(None, "--template", help="one task: its template"),
    args: str | None = typer.Option(None, "--args", help="one task: AutoTVM args list as JSON"),
    trials: int = typer.Option(64, "--trials", min=1, help="trials per task"),
    tuner: str = typer.Option(DEFAULT_TUNER, "--tuner",
                              help="one of: " + ", ".join(sorted(TUNERS))),
    early_stopping: int | None = typer.Option(None, "--early-stopping", min=1,
                                              help="stop a task after this many trials "
                                                   "without a better config"),
    plan_size: int = typer.Option(16, "--plan-size", min=1,
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
    try:
        Target.parse(target)
    except ValueError as err:
        fail(f"--target: {err}")
    workloads = _workloads(model, target, template, args, quantize, qconfig)
    body = {"target": target, "tasks": [w.model_dump(mode="json") for w in workloads],
            "n_trial": trials, "tuner": tuner, "early_stopping": early_stopping,
            "plan_size": plan_size,
            "measure": MeasureOptions(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                      timeout_s=timeout).model_dump()}
    fleet = None
    if server is None:
        try:
            fleet = EmbeddedFleet(resolve_url(database_url), device)
        except RuntimeError as err:
            fail(str(err), code=1)
        server, token = fleet.url, fleet.client_token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=server, headers=headers, timeout=60) as client:
            response = client.post("/api/v1/jobs", json=body)
            if response.is_error:
                fail(f"server answered {response.status_code}: {response.json().get('detail')}",
                     code=1)
            job = follow(client, response.json()["id"])
            best = client.post("/api/v1/records/best", json={
                "target": str(fleet.agent._measurer.device_info.target) if fleet else target,
                "workloads": [w.model_dump(mode="json") for w in workloads]}).json()["items"]
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
    if job["status"] != "done":
        raise typer.Exit(1)


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

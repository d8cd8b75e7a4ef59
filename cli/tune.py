"""``tuner tune``: tune a model's tasks or one workload, embedded (nothing running) or on
a server, through ``tuner.tune``.

Everything the command line names (target, tuner, template, workload, model, measure
options, URLs, the local device) is checked before anything starts. Ctrl-C cancels the
job and kills the trial being measured; a job that ends failed or cancelled exits 1."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

import tuner as api
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
from cli.db import DATABASE_URL, resolve_url
from schemas import Target, Workload
from schemas.api import DEFAULT_TUNER, JobStatus

WAITING_WARN_S = 5.0  # a job waiting this long for a worker gets one warning
# A job field the server may refuse (its 422 names it) -> the flag that sets it.
FLAGS = {"tuner": "--tuner", "early_stopping": "--early-stopping", "n_trial": "--trials",
         "plan_size": "--plan-size", "verify_top": "--verify-top", "target": "--target"}


class WaitingWarning(api.Callback):
    """Warn once on stderr when the job has waited ``WAITING_WARN_S`` for a worker that
    serves its target, with the server's note on what to do."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.warned = False

    def on_update(self, job: api.JobView) -> None:
        if job.status.final or not job.waiting_for_worker:
            self.since = None
            return
        self.since = self.since or time.monotonic()
        if not self.warned and time.monotonic() - self.since > WAITING_WARN_S:
            note = job.note or "no live worker serves this job's target"
            typer.echo(f"warning: job {job.id} is waiting: {note}", err=True)
            self.warned = True


def tune(
    model: Path | None = typer.Argument(None, exists=True, dir_okay=False,
                                        help="an .onnx model: tune all its conv2d/dense tasks"),
    target: str = typer.Option(..., "--target", help="e.g. 'opencl -model=pocl-cpu'"),
    template: str | None = typer.Option(None, "--template", help="one task: its template"),
    args: str | None = typer.Option(None, "--args", help="one task: AutoTVM args list as JSON"),
    trials: int = typer.Option(64, "--trials", min=1, max=1_000_000, help="trials per task"),
    tuner: str = typer.Option(DEFAULT_TUNER, "--tuner",
                              help="the server's search strategy (lgbm, ga, random, grid)"),
    early_stopping: int | None = typer.Option(None, "--early-stopping", min=1, max=1_000_000,
                                              help="stop a task after this many trials "
                                                   "without a better config"),
    plan_size: int = typer.Option(16, "--plan-size", min=1, max=4096,
                                  help="configs planned at a time per task"),
    verify_top: int = typer.Option(3, "--verify-top", min=0, max=64,
                                   help="at each task's end, measure its this many best "
                                        "configs and the default again, interleaved; "
                                        "builds use those costs (0: no verification)"),
    server: str | None = typer.Option(None, "--server", envvar="TUNER_SERVER"),
    token: str | None = typer.Option(None, "--token", envvar="TUNER_TOKEN"),
    database_url: str | None = DATABASE_URL,
    device: str | None = typer.Option(None, "--device", help="embedded worker's device"),
    number: int = typer.Option(api.DEFAULT_MEASURE.number, "--number", min=1),
    repeat: int = typer.Option(api.DEFAULT_MEASURE.repeat, "--repeat", min=1),
    min_repeat_ms: float = typer.Option(api.DEFAULT_MEASURE.min_repeat_ms, "--min-repeat-ms",
                                        min=0),
    timeout: float = typer.Option(api.DEFAULT_MEASURE.timeout_s, "--timeout",
                                  help="seconds per trial"),
    cpu_cache_flush: bool = typer.Option(
        api.DEFAULT_MEASURE.enable_cpu_cache_flush, "--cpu-cache-flush/--no-cpu-cache-flush",
        help="on a CPU device, time each launch with its weight read from memory, as a "
             "layer in a model runs (AutoTVM's enable_cpu_cache_flush)"),
    quantize: bool = QUANTIZE,
    qconfig: list[str] | None = QCONFIG,
) -> None:
    """Tune a model's tasks (MODEL) or one workload (--template, --args) as one job;
    without --server, runs the server and a worker in-process. With --quantize, the
    tasks of the int8 model (what `tuner compile --quantize` builds)."""
    tgt = parse_target(target)
    measure = measure_options(number, repeat, min_repeat_ms, timeout, cpu_cache_flush)
    url = None
    if server is not None:
        server = check_server_url(server)
        if device is not None:
            fail("--device: chooses the embedded worker's device; a server's workers "
                 "choose their own (drop --device or --server)")
    tasks = _tasks(model, tgt, template, args, quantize, qconfig)
    workloads = [t.workload if isinstance(t, api.Task) else t for t in tasks]
    if server is None:
        url = resolve_url(database_url)
    try:
        result = api.tune(tasks, tgt, n_trial=trials, tuner=tuner,
                          early_stopping=early_stopping, server=server, token=token,
                          database_url=url, plan_size=plan_size, measure=measure,
                          device=device, model_name=model.name if model else None,
                          verify_top=verify_top,
                          callbacks=[api.callbacks.progress_bar(), WaitingWarning()])
    except api.NoLocalDevice as err:
        named = f"--{err}" if str(err).startswith("device") else str(err)  # --device's
        fail(f"{named}; pick another --target or --device, or use --server to tune on a "
             f"fleet", code=1)
    except api.InvalidRequest as err:  # the detail starts with the field: its flag
        field, _, why = err.detail.partition(": ")
        flag = FLAGS.get(field)
        fail(f"{flag}: {why}" if flag and why else str(err))
    except api.WorkerStopped as err:
        fail(f"{err}: fix that and run `tuner tune` again", code=1)
    except api.TuneInterrupted as err:
        typer.echo(f"interrupted: {err.outcome}", err=True)
        raise typer.Exit(130) from None
    job = result.job
    top = max((t.best_gflops or 0.0 for t in job.tasks), default=0.0)
    typer.echo(f"job {job.id} {job.status}: {job.trials_done} trials, best {top:.2f} GFLOP/s")
    if len(job.tasks) > 1:
        for i, (task, workload) in enumerate(zip(job.tasks, workloads, strict=True)):
            typer.echo(f"  task {i}: {task.trials_done} trials, best "
                       f"{task.best_gflops or 0:.2f} GFLOP/s  {workload.key}")
    record = result.best[0] if len(result.best) == 1 else None
    if record is not None:
        typer.echo(json.dumps(record.to_json()))
    if job.status == JobStatus.FAILED:
        fail(f"job {job.id} failed: {job.error or 'every task failed'}; see "
             f"`tuner job {job.id}`", code=1)
    if job.status != JobStatus.DONE:
        raise typer.Exit(1)


def _tasks(model: Path | None, target: Target, template: str | None,
           args: str | None, quantize: bool = False,
           qconfig: list[str] | None = None) -> list[api.Task] | list[Workload]:
    """MODEL's tasks (with the layers each serves), or the one workload named."""
    if model is not None:
        if template or args:
            fail("give MODEL or --template/--args, not both")
        from cli.models import import_model

        graph = quantized(import_model(model), quantize, qconfig)
        tasks = api.extract_tasks(graph, target)
        if not tasks:
            fail(f"{model}: no conv2d or dense layer to tune", code=1)
        typer.echo(f"{model.name}: {len(tasks)} tasks")
        return tasks
    if template is None or args is None:
        fail("give MODEL, or --template and --args for one workload")
    if quantize or qconfig:
        fail("--quantize: quantizes a MODEL's layers (give an int8 template for one workload)")
    tmpl = load_template(template)
    return [load_workload(tmpl, args, flag="--args")]

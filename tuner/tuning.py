"""``tuner.tune``: tune a model's tasks (or given ones) as one job, embedded (a local
server and an isolated worker in this process) or on a tuning server, calling the
callbacks with every trial as it is measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.ir import Graph
from compiler.records import MemorySource
from compiler.tasks import Task
from schemas import MeasureOptions, Record, Target, Workload
from schemas.api import DEFAULT_TUNER, JobStatus, JobView
from tuner.building import extract_tasks
from tuner.callbacks import Callback, Trial
from tuner.client import Client, InvalidRequest, TunerError
from tuner.embedded import (
    EmbeddedFleet,
    WorkerStopped,
    default_database_url,
    local_device,
)

# How a trial is timed unless told: what `tuner tune` defaults to as well. Unlike the
# contract's bare defaults, a repeat lasts at least 50 ms (steadier on a busy CPU), a
# trial may take a minute (a first build on a cold compiler cache), and a CPU trial reads
# its weight from memory as the layer does in a model (docs/BENCHMARKS.md, "Trials with
# cold weights").
DEFAULT_MEASURE = MeasureOptions.model_validate(
    {"number": 3, "repeat": 3, "min_repeat_ms": 50.0, "timeout_s": 60.0,
     "enable_cpu_cache_flush": True})


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C while tuning: the trial being measured was killed and the job cancelled;
    ``outcome`` says what became of the job, in words."""

    def __init__(self, job_id: int | None, outcome: str) -> None:
        super().__init__(outcome)
        self.job_id, self.outcome = job_id, outcome


@dataclass(frozen=True)
class TuneResult:
    """The job as it ended, and the best record each of its tasks measured in this job
    (in task order; None where no trial succeeded): the cheapest working trial, the
    first of equal costs."""

    job: JobView
    best: list[Record | None]

    @property
    def ok(self) -> bool:
        return self.job.status == JobStatus.DONE

    def records(self) -> MemorySource:
        """The best records as a source, for ``tuner.build``."""
        return MemorySource([r for r in self.best if r is not None],
                            origin=f"job {self.job.id}")


class _BestOfJob(Callback):
    """Each task's cheapest working trial of this job with its record (ties: the first
    measured), as the trials reach the callbacks."""

    def __init__(self, tasks: int) -> None:
        self.found: list[tuple[float, Record] | None] = [None] * tasks

    def on_trial(self, trial: Trial) -> None:
        if trial.error_no != 0 or trial.cost is None or trial.record is None:
            return
        held = self.found[trial.task]
        if held is None or trial.cost < held[0]:
            self.found[trial.task] = (trial.cost, trial.record)


TaskLike = Task | Workload
Tasks = Graph | str | Path | TaskLike | Sequence[TaskLike] | Any


def tune(model_or_tasks: Tasks, target: str | Target, n_trial: int = 64,
         tuner: str = DEFAULT_TUNER, early_stopping: int | None = None,
         server: str | Client | None = None, token: str | None = None,
         database_url: str | None = None,
         callbacks: Sequence[Callback | Callable[[Trial], object]] = (), *,
         plan_size: int = 16, measure: MeasureOptions = DEFAULT_MEASURE,
         device: str | None = None, model_name: str | None = None,
         verify_top: int | None = None) -> TuneResult:
    """Tune every conv2d/dense task of a model (an .onnx path, an onnx model or a
    graph), or the given tasks (``tuner.extract_tasks``' values or workloads), as one
    job of ``n_trial`` trials per task.

    Without ``server`` it runs embedded: a server on ``database_url`` (default:
    ``TUNER_DATABASE_URL``, else the embedded SQLite file) and a worker on the local
    device (``device``, else the one that serves ``target``, a GPU first), both in this
    process and stopped at the end. With ``server`` (a URL, with ``token``, or a
    :class:`Client`) the job runs on that server's fleet. A value the server refuses
    (an unknown ``tuner``) raises :class:`tuner.InvalidRequest` naming it. Ctrl-C
    cancels the job (:class:`TuneInterrupted`); a job that ends failed or cancelled is
    returned, not raised (see ``TuneResult.ok``). ``verify_top``: when a task's search
    ends, this many of its best configs and the default are measured again, interleaved,
    and builds rank them by those costs (None: the server's default, 3; 0: none).

    A job from a model (or from ``tuner.extract_tasks``' tasks) remembers the model's
    name (``model_name``, else the file's) and each task's layers, so the dashboard
    shows it as that model's tuning."""
    tgt = target if isinstance(target, Target) else Target.parse(target)
    workloads, layers = _workloads(model_or_tasks, tgt)
    model_name = model_name or _model_name(model_or_tasks)
    if server is not None and device is not None:
        raise ValueError("device: chooses the embedded worker's device; a server's workers "
                         "choose their own")
    fleet: EmbeddedFleet | None = None
    client: Client | None = None
    owned = not isinstance(server, Client)
    job_id: int | None = None
    try:
        if server is None:
            _check_tuner(tuner)  # before anything starts, as the server would refuse it
            info = local_device(tgt, device)
            fleet = EmbeddedFleet(database_url or default_database_url(), info.spec)
            fleet.start()
            client = Client(fleet.url, fleet.client_token, timeout=60)
        else:
            client = server if isinstance(server, Client) else Client(server, token, timeout=60)
        job_id = client.submit(workloads, tgt, n_trial=n_trial, tuner=tuner,
                               early_stopping=early_stopping, plan_size=plan_size,
                               measure=measure, model=model_name, layers=layers,
                               verify_top=verify_top)
        best = _BestOfJob(len(workloads))
        try:
            job = client.follow(job_id, [*callbacks, best],
                                check=fleet.check if fleet else None,
                                quiet=fleet.quiet if fleet else None)
        except WorkerStopped as err:
            client.cancel(job_id)
            raise WorkerStopped(f"{err}; job {job_id} cancelled") from None
        return TuneResult(job, [b[1] if b else None for b in best.found])
    except KeyboardInterrupt:
        if fleet is not None:
            fleet.abort()
        raise TuneInterrupted(job_id, _cancel(client, job_id)) from None
    finally:
        if client is not None and owned:
            client.close()
        if fleet is not None:
            fleet.close()


def _check_tuner(name: str) -> None:
    """Refuse a tuner the embedded server does not have (its search package is loaded
    for the run anyway) with the 422 a server answers."""
    from tuner_server.search import TUNERS

    if name not in TUNERS:
        detail = f"tuner: unknown tuner {name!r}; known: {', '.join(sorted(TUNERS))}"
        raise InvalidRequest(f"the tuning server refuses the job: {detail}", detail)


def _cancel(client: Client | None, job_id: int | None) -> str:
    if client is None or job_id is None:
        return "no job was submitted"
    try:
        status = client.cancel(job_id)
    except TunerError as err:
        return f"job {job_id} may still run ({err}); cancel it on the server"
    return (f"job {job_id} cancelled" if status == JobStatus.CANCELLED else
            f"job {job_id} had already ended ({status})")


def _model_name(model_or_tasks: Tasks) -> str | None:
    """The name a model's job is shown under: its file's name, else the ONNX graph's."""
    if isinstance(model_or_tasks, str | Path):
        return Path(model_or_tasks).name
    graph = getattr(model_or_tasks, "graph", None)  # an onnx ModelProto
    name = getattr(graph, "name", None)
    return name if isinstance(name, str) and name else None


def _workloads(model_or_tasks: Tasks, target: Target
               ) -> tuple[list[Workload], list[list[str]] | None]:
    """The workloads to tune and, where every one is a model's task with layers, the
    layers each serves (else None)."""
    items: Sequence[Any]
    if isinstance(model_or_tasks, Task | Workload):
        items = [model_or_tasks]
    elif isinstance(model_or_tasks, Sequence) and not isinstance(model_or_tasks, str):
        items = model_or_tasks
    else:
        items = extract_tasks(model_or_tasks, target)
        if not items:
            raise ValueError(f"{model_or_tasks}: no conv2d or dense layer to tune")
    workloads = [t.workload if isinstance(t, Task) else t for t in items]
    if not workloads or not all(isinstance(w, Workload) for w in workloads):
        raise ValueError("model_or_tasks: give a model, or tasks (tuner.extract_tasks' "
                         "values or schemas.Workload)")
    layers = ([list(t.layers) for t in items]
              if all(isinstance(t, Task) and t.layers for t in items) else None)
    return [w for w in workloads if isinstance(w, Workload)], layers

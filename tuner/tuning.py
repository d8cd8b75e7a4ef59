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
from schemas.api import JobView
from tuner.building import extract_tasks
from tuner.callbacks import Callback, Trial
from tuner.client import Client, TunerError
from tuner.embedded import (
    EmbeddedFleet,
    WorkerStopped,
    default_database_url,
    local_device,
)
from tuner_server.search import DEFAULT_TUNER, TUNERS


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C while tuning: the trial being measured was killed and the job cancelled;
    ``outcome`` says what became of the job, in words."""

    def __init__(self, job_id: int | None, outcome: str) -> None:
        super().__init__(outcome)
        self.job_id, self.outcome = job_id, outcome


@dataclass(frozen=True)
class TuneResult:
    """The job as it ended, and the best record of each of its tasks (in task order;
    None where no trial succeeded) for the target it was tuned on."""

    job: JobView
    best: list[Record | None]

    @property
    def ok(self) -> bool:
        return self.job.status == "done"

    def records(self) -> MemorySource:
        """The best records as a source, for ``tuner.build``."""
        return MemorySource([r for r in self.best if r is not None],
                            origin=f"job {self.job.id}")


TaskLike = Task | Workload
Tasks = Graph | str | Path | TaskLike | Sequence[TaskLike] | Any


def tune(model_or_tasks: Tasks, target: str | Target, n_trial: int = 64,
         tuner: str = DEFAULT_TUNER, early_stopping: int | None = None,
         server: str | Client | None = None, token: str | None = None,
         database_url: str | None = None,
         callbacks: Sequence[Callback | Callable[[Trial], object]] = (), *,
         plan_size: int = 16, measure: MeasureOptions | None = None,
         device: str | None = None) -> TuneResult:
    """Tune every conv2d/dense task of a model (an .onnx path, an onnx model or a
    graph), or the given tasks (``tuner.extract_tasks``' values or workloads), as one
    job of ``n_trial`` trials per task.

    Without ``server`` it runs embedded: a server on ``database_url`` (default:
    ``TUNER_DATABASE_URL``, else the embedded SQLite file) and a worker on the local
    device (``device``, else the one that serves ``target``, a GPU first), both in this
    process and stopped at the end. With ``server`` (a URL, with ``token``, or a
    :class:`Client`) the job runs on that server's fleet. Ctrl-C cancels the job
    (:class:`TuneInterrupted`); a job that ends failed or cancelled is returned, not
    raised (see ``TuneResult.ok``)."""
    tgt = target if isinstance(target, Target) else Target.parse(target)
    if tuner not in TUNERS:
        raise ValueError(f"tuner: {tuner!r} is not one of {', '.join(sorted(TUNERS))}")
    workloads = _workloads(model_or_tasks, tgt)
    if server is not None and device is not None:
        raise ValueError("device: chooses the embedded worker's device; a server's workers "
                         "choose their own")
    fleet: EmbeddedFleet | None = None
    client: Client | None = None
    owned = not isinstance(server, Client)
    job_id: int | None = None
    try:
        best_target = str(tgt)
        if server is None:
            info = local_device(tgt, device)
            fleet = EmbeddedFleet(database_url or default_database_url(), info.spec)
            best_target = str(info.target)  # the records the worker stores
            fleet.start()
            client = Client(fleet.url, fleet.client_token, timeout=60)
        else:
            client = server if isinstance(server, Client) else Client(server, token, timeout=60)
        before = [client.count_records(tgt, w) for w in workloads]  # the log's offsets
        job_id = client.submit(workloads, tgt, n_trial=n_trial, tuner=tuner,
                               early_stopping=early_stopping, plan_size=plan_size,
                               measure=measure)
        try:
            job = client.follow_from(job_id, before, callbacks,
                                     check=fleet.check if fleet else None)
        except WorkerStopped as err:
            client.cancel(job_id)
            raise WorkerStopped(f"{err}; job {job_id} cancelled") from None
        best = client.best(workloads, best_target)
        return TuneResult(job, [Record.from_json(b.record) if b.record else None
                                for b in best])
    except KeyboardInterrupt:
        if fleet is not None:
            fleet.abort()
        raise TuneInterrupted(job_id, _cancel(client, job_id)) from None
    finally:
        if client is not None and owned:
            client.close()
        if fleet is not None:
            fleet.close()


def _cancel(client: Client | None, job_id: int | None) -> str:
    if client is None or job_id is None:
        return "no job was submitted"
    try:
        status = client.cancel(job_id)
    except TunerError as err:
        return (f"job {job_id} may still run ({err}); cancel it with "
                f"`tuner cancel {job_id}`")
    return (f"job {job_id} cancelled" if status == "cancelled" else
            f"job {job_id} had already ended ({status})")


def _workloads(model_or_tasks: Tasks, target: Target) -> list[Workload]:
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
    return [w for w in workloads if isinstance(w, Workload)]

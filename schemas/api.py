"""The REST wire contract: every request and response body of the REST API and the
job, task and trial states, shared by the server's routes and ``tuner_client``.

Field names and shapes are the API's: changing one breaks every client. States are
str enums whose values are the strings stored in the database and sent as JSON.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from schemas.device import DeviceLimits
from schemas.measure import (
    MAX_INFO_CHARS,
    MeasureOptions,
    MeasureResult,
    check_info,
    check_measurement,
)
from schemas.target import Target
from schemas.text import check_text
from schemas.workload import Workload

# Ids are INTEGER columns (32 bits on PostgreSQL): a larger number matches nothing, so
# the API refuses it as a 422 naming the field instead of overflowing the driver.
MAX_ID = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=MAX_ID)]

# The search strategy a job gets unless it names one (the server's ``tuner_server.search``
# registers a tuner of this name).
DEFAULT_TUNER = "lgbm"
# POST /records/best answers at most this many workloads a request (a model's every
# layer on a fleet's every template; its body passes the Guard as an import's does).
MAX_BEST_WORKLOADS = 10_000
# POST /records/import names at most this many refused lines (``refused`` counts all).
MAX_REPORTED_ERRORS = 100
# A model job's names: the model (jobs.model is VARCHAR(255)) and each layer.
MAX_MODEL_CHARS = 255
MAX_LAYER_CHARS = 255
MAX_TASK_LAYERS = 10_000


# --------------------------------------------------------------------------- states

class JobStatus(StrEnum):
    """A job's state; a task goes through the same ones (:data:`TaskStatus`)."""

    QUEUED = "queued"  # submitted, nothing planned yet
    RUNNING = "running"  # trials planned
    # a task only (its job stays running): the search ended and its best configs and
    # the template's default are measured again side by side (verify_top), with its
    # layer's other templates' (it waits for their searches to end)
    VERIFYING = "verifying"
    DONE = "done"  # every task reached its budget or stopped early
    CANCELLED = "cancelled"
    FAILED = "failed"  # every trial of a task failed (``error`` says why)

    @property
    def final(self) -> bool:
        """It will not change again."""
        return self in FINAL


# A task lives a job's states: one enum, so one set of final states.
TaskStatus = JobStatus

FINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.DONE, JobStatus.CANCELLED, JobStatus.FAILED})
ACTIVE: frozenset[JobStatus] = frozenset(
    {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.VERIFYING})


class TrialStatus(StrEnum):
    """A trial's place in the dispatch queue."""

    QUEUED = "queued"  # waiting for a worker
    LEASED = "leased"  # a worker holds it until its lease deadline
    DONE = "done"  # its result is recorded (failures included)
    CANCELLED = "cancelled"  # its job was cancelled before it was measured


# --------------------------------------------------------------------------- errors

class ErrorBody(BaseModel):
    """Every refusal (4xx, 503): one line saying what is wrong and, where it can, what
    to do."""

    detail: str


# --------------------------------------------------------------------------- jobs

class JobRequest(BaseModel):
    """``POST /jobs``: tasks to tune on a target, and how."""

    target: Target
    tasks: list[Workload] = Field(min_length=1, max_length=1000)
    n_trial: int = Field(64, ge=1, le=1_000_000, description="trials per task")
    tuner: str = Field(DEFAULT_TUNER, max_length=32,
                       description="the server's search strategy (lgbm, ga, random, grid); "
                                   "a name it does not know is refused with the list")
    early_stopping: int | None = Field(None, ge=1, le=MAX_ID)
    plan_size: int = Field(16, ge=1, le=4096)
    measure: MeasureOptions = MeasureOptions()
    model: str | None = Field(None, min_length=1, max_length=MAX_MODEL_CHARS,
                              description="the model the tasks come from (its file name), "
                                          "for the dashboard's model view")
    layers: list[list[str]] | None = Field(
        None, description="per task, the names of the model's layers it serves (as many "
                          "lists as tasks); a task's layer count weighs it in the model's "
                          "estimated latency")

    @field_validator("model")
    @classmethod
    def _model_text(cls, value: str | None) -> str | None:
        return value if value is None else check_text(value, "model")

    @field_validator("layers")
    @classmethod
    def _layer_names(cls, value: list[list[str]] | None, info: ValidationInfo
                     ) -> list[list[str]] | None:
        if value is None:
            return None
        tasks = info.data.get("tasks")
        if tasks is not None and len(value) != len(tasks):
            raise ValueError(f"{len(value)} lists for {len(tasks)} tasks; give one list "
                             f"of layer names per task")
        for i, names in enumerate(value):
            if not 1 <= len(names) <= MAX_TASK_LAYERS:
                raise ValueError(f"[{i}]: a task serves 1 to {MAX_TASK_LAYERS} layers, "
                                 f"not {len(names)}")
            for k, name in enumerate(names):
                if not 1 <= len(name) <= MAX_LAYER_CHARS:
                    raise ValueError(f"[{i}][{k}]: a layer name has 1 to {MAX_LAYER_CHARS} "
                                     f"characters")
                check_text(name, f"layers[{i}][{k}]")
        return value
    verify_top: int = Field(
        3, ge=0, le=64,
        description="when a task's search ends, its this many best configs and the "
                    "template's default are measured again, interleaved, and the build "
                    "ranks them by those verified costs; 0: no verification")


class JobCreated(BaseModel):
    id: int


class CurvePoint(BaseModel):
    """A tuning curve's step: the trial that improved on every earlier one."""

    trial: int
    best_cost: float
    best_gflops: float | None


class TaskView(BaseModel):
    id: int
    template: str
    args: list[Any]
    status: TaskStatus
    trials_done: int
    trials_planned: int
    n_trial: int
    best_cost: float | None
    best_gflops: float | None
    error: str | None
    curve: list[CurvePoint] | None = Field(
        None, description="improvements in order; only where the job was asked with curves")
    layers: list[str] | None = Field(
        None, description="the model's layers this task serves (a job from a model)")


class JobView(BaseModel):
    """A job as ``GET /jobs[/{id}]`` shows it: progress, ETA, best GFLOP/s, and
    whether it waits for a worker (none alive serves its target)."""

    id: int
    target: str
    status: JobStatus
    tuner: str
    n_trial: int
    early_stopping: int | None
    error: str | None
    created_at: str | None = Field(description="ISO 8601")
    trials_done: int
    trials_total: int
    progress: float = Field(description="0..1; a task that stopped early counts as complete")
    eta_s: float | None = Field(description="seconds left at the recent pace; null: unknown")
    best_gflops: float | None
    waiting_for_worker: bool
    note: str | None = Field(description="what to do when it waits for a worker")
    tasks: list[TaskView]
    model: str | None = Field(None, description="the model the tasks come from, if any")


class ModelTask(BaseModel):
    """One task of a job as the model view's table shows it: the layers it serves, its
    default config's cost against its best, and its share of the model's latency."""

    id: int
    template: str
    args: list[Any]
    status: TaskStatus
    layers: list[str] = Field(description="the layers it serves; empty when unknown")
    layer_count: int = Field(description="how many layers run its kernel (1 when unknown)")
    trials_done: int
    n_trial: int
    default_cost: float | None = Field(
        description="mean seconds of the template's default config (what an untuned build "
                    "runs); null until measured, or when it failed")
    default_gflops: float | None
    best_cost: float | None = Field(description="the cheapest working trial's mean seconds")
    best_gflops: float | None
    speedup: float | None = Field(description="default_cost / best_cost")
    errors: int = Field(description="trials that failed")
    error_counts: dict[str, int] = Field(description="error_no -> failed trials")
    share: float | None = Field(
        description="best_cost x layer_count over the sum of that over the measured tasks")
    curve: list[CurvePoint] = Field(description="the task's improvements, for a sparkline")


class LatencyPoint(BaseModel):
    """The model's estimated latency from the moment it changed."""

    at_s: float = Field(description="seconds since the job was submitted")
    trial: int = Field(description="results stored in the job by then")
    latency_s: float = Field(description="sum over tasks of best cost x layer count")


class ModelView(BaseModel):
    """``GET /jobs/{id}/model``: a job as a model's tuning. The estimate is defined once
    every task has a working trial; the default build's once every default config is
    measured."""

    job_id: int
    model: str | None
    target: str
    status: JobStatus
    elapsed_s: float = Field(description="seconds from submission to now, or to the last "
                                         "result once the job ended")
    trials_done: int = Field(description="results stored in the job")
    tasks_measured: int = Field(description="tasks with a working trial")
    latency_s: float | None = Field(description="the estimate now; null until every task "
                                                "has a working trial")
    default_latency_s: float | None = Field(
        description="the default build's estimate; null until every default is measured")
    speedup: float | None
    error_counts: dict[str, int] = Field(description="error_no -> failed trials, job-wide")
    curve: list[LatencyPoint]
    tasks: list[ModelTask] = Field(description="by share of the latency, largest first")


class DashboardInfo(BaseModel):
    """``GET /dashboard``: how the page behaves on this server."""

    token_required: bool
    read_only: bool


class JobCancelled(BaseModel):
    """``POST /jobs/{id}/cancel``: the job's state after (a job that had ended
    keeps its state)."""

    id: int
    status: JobStatus


class TrialPoint(BaseModel):
    trial: int = Field(description="1-based, in the order results were stored")
    id: int = Field(description="the trial's id (what `after` takes)")
    gflops: float | None = Field(description="null when the trial failed")
    error_no: int = Field(description="AutoTVM's MeasureErrorNo; 0 is success")
    cost: float | None = Field(description="mean seconds; null when the trial failed")
    record: dict[str, Any] | None = Field(
        None, description="the trial's stored AutoTVM line (as GET /records returns it); "
        "null while the trial has no record; absent when asked with `records=false`")


class TrialPage(BaseModel):
    task_id: int
    status: TaskStatus
    trials_done: int
    items: list[TrialPoint]


# --------------------------------------------------------------------------- workers

class WorkerRegistration(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    target: Target
    limits: DeviceLimits = DeviceLimits()
    device: str | None = Field(None, min_length=1, max_length=255,
                               description="the device's own name, e.g. NVIDIA H200")

    @field_validator("name", "device")
    @classmethod
    def _printable(cls, value: str | None, info: ValidationInfo) -> str | None:
        # stored in VARCHAR columns and shown on terminals: PostgreSQL refuses NUL
        return value if value is None else check_text(value, str(info.field_name))


class Registered(BaseModel):
    """A registration's answer: the worker's id and the token that speaks for it alone."""

    id: int
    token: str


class Deregistered(BaseModel):
    id: int
    released: int = Field(description="leased trials given back to the queue")


class WorkerInfo(BaseModel):
    id: int
    name: str
    target: str
    device: str = Field(description="the device's name, else the target's model")
    last_heartbeat: float = Field(description="unix seconds of its last contact")
    alive: bool = Field(description="serving: not deregistered, and seen within the "
                                    "server's lease time")
    stopped: bool = Field(description="deregistered (the worker stopped)")
    trials_per_minute: float = Field(description="results in the last 10 minutes / 10")
    error_rate: float | None = Field(
        description="share of the last 10 minutes' results with error_no != 0; "
                    "null without results")
    trials_done: int


class LeaseRequest(BaseModel):
    max_trials: int = Field(1, ge=1, le=1024)
    wait_s: float = Field(10.0, ge=0, le=60, description="long-poll: wait this long for work")


class LeasedTrial(BaseModel):
    """One trial to measure. ``config`` and ``measure`` stay raw JSON here: a trial
    whose stored config or options do not decode is the worker's to report as that
    trial's failure (error 1), not a lease the server cannot answer."""

    trial_id: int
    task_id: int
    template: str
    args: list[Any]
    config: dict[str, Any] = Field(description="AutoTVM's config object")
    target: str = Field(description="the job's target")
    measure: dict[str, Any] = Field(description="the job's MeasureOptions")
    verify_round: int = Field(
        0, ge=0, description="0: a search trial; n > 0: the task's nth verification "
                             "round, which a worker times side by side with the other "
                             "verification trials of its batch")
    lease_deadline: float | None = Field(description="unix seconds; heartbeat before it")


class LeaseAnswer(BaseModel):
    trials: list[LeasedTrial]
    lease_seconds: float = Field(description="the server's lease: beat well inside it")


class TrialIds(BaseModel):
    trial_ids: list[Id] = Field(max_length=4096)


class TrialResult(BaseModel):
    trial_id: Id
    result: MeasureResult
    info: dict[str, Any] | None = Field(
        None, description=f"kept with the record; at most {MAX_INFO_CHARS} characters of JSON")

    @field_validator("info")
    @classmethod
    def _small(cls, info: dict[str, Any] | None) -> dict[str, Any] | None:
        return info if info is None else check_info(info)

    @field_validator("result")
    @classmethod
    def _measured(cls, result: MeasureResult) -> MeasureResult:
        check_measurement(result)  # the rule records import applies too
        return result


class Results(BaseModel):
    results: list[TrialResult] = Field(max_length=4096)


class ResultsAccepted(BaseModel):
    accepted: int = Field(description="results stored now")
    duplicates: int = Field(description="results stored before (a retry): ignored")


class HeartbeatAnswer(BaseModel):
    extended: int = Field(description="leases extended")


class Released(BaseModel):
    released: int = Field(description="trials given back to the queue")


# --------------------------------------------------------------------------- records

class RecordPage(BaseModel):
    """``GET /records``: records as AutoTVM JSON lines (objects), and how many
    match in all."""

    total: int
    items: list[dict[str, Any]]


class RecordSummary(BaseModel):
    """A record as the dashboard lists it: what it is for, how fast, which config."""

    id: int
    target: str
    template: str
    workload_key: str
    args: list[Any]
    error_no: int
    cost: float | None = Field(description="mean seconds; null when it failed")
    gflops: float | None = Field(description="null when it failed or FLOPs are unknown")
    config: dict[str, Any] = Field(description="AutoTVM's config object")
    knobs: dict[str, Any] = Field(description="knob name -> value")
    timestamp: float
    worker: str | None


class RecordSearchPage(BaseModel):
    total: int
    items: list[RecordSummary]


class BestRequest(BaseModel):
    target: str = Field(max_length=1000)
    workloads: list[Workload] = Field(min_length=1, max_length=MAX_BEST_WORKLOADS)


class BestItem(BaseModel):
    workload: Workload
    rule: str = Field(description="model, target_key:<key> or none")
    record: dict[str, Any] | None = Field(description="an AutoTVM JSON line; null: none")


class BestResponse(BaseModel):
    items: list[BestItem]


class LineError(BaseModel):
    line: int = Field(description="1-based line number in the body")
    error: str


class ImportResponse(BaseModel):
    accepted: int = Field(description="lines stored now")
    duplicates: int = Field(0, description="valid lines stored before (identical input, "
                                           "config and result): not stored again")
    refused: int = Field(description="lines refused; `errors` names the first "
                                     f"{MAX_REPORTED_ERRORS}")
    errors: list[LineError]


# --------------------------------------------------------------------------- health

class Health(BaseModel):
    """``/healthz``: the process answers."""

    status: str


class Readiness(BaseModel):
    """``/readyz``: ``ok``, or ``unavailable: <why>`` for the database and the queue."""

    status: str
    database: str
    queue: str

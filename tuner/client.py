"""``tuner.Client``: a tuning server's jobs, workers and records as Python values, over
``tuner_client`` (the one HTTP client of the API).

Every failure becomes a :class:`TunerError` whose message names the server, the status
and the server's own explanation, and says what to do, so a script (or the CLI) can show
it as one line."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Self

from schemas import MeasureOptions, Record, Target, Workload
from schemas.api import (
    BestItem,
    ImportResponse,
    JobRequest,
    JobStatus,
    JobView,
    RecordSummary,
    TaskView,
    TrialPage,
    WorkerInfo,
)
from tuner.callbacks import Callback, Trial, as_callback
from tuner_client import ApiError, BadAnswer, TunerClient, Unavailable

DEFAULT_SERVER = "http://127.0.0.1:8600"  # what `tuner serve` listens on by default
POLL_S = 0.5  # how often a followed job is polled
CallbackLike = Callback | Callable[[Trial], object]


class TunerError(Exception):
    """A failure to report as one line: the message says what to do about it."""


class Unreachable(TunerError):
    """The server did not answer at all (down, restarting, wrong address)."""


class Unauthorized(TunerError):
    """The server refused the token (none, unknown, or a role that may not do this)."""


class InvalidRequest(TunerError, ValueError):
    """The server refused a value (422); ``detail`` is its message, which starts with
    the field's name (``tuner: unknown tuner 'best'; known: ...``)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class Client:
    """A tuning server: ``url`` and ``token`` default to ``TUNER_SERVER`` and
    ``TUNER_TOKEN``, as the ``tuner`` command reads them. ``api`` is the typed REST
    client beneath, for what this one does not wrap (a worker's calls)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = 30.0) -> None:
        url = url or os.environ.get("TUNER_SERVER") or DEFAULT_SERVER
        self.token = token if token is not None else os.environ.get("TUNER_TOKEN") or None
        self.api = TunerClient(url, self.token, timeout=timeout)
        self.url = self.api.url

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _answering(self, what: str) -> Iterator[None]:
        """Turn the API's refusals into one-line TunerErrors; ``what`` names
        the thing asked for (``job 7``), for a 404."""
        try:
            yield
        except ApiError as err:
            raise _explain(err, self.url, what) from None

    # ------------------------------------------------------------------- jobs

    def submit(self, workloads: Sequence[Workload], target: str | Target, *,
               n_trial: int = 64, tuner: str | None = None,
               early_stopping: int | None = None, plan_size: int = 16,
               measure: MeasureOptions | None = None, model: str | None = None,
               layers: Sequence[Sequence[str]] | None = None,
               verify_top: int | None = None) -> int:
        """Submit one job tuning ``workloads`` on ``target``; its id. ``model`` (its
        name) and ``layers`` (per workload, the layers it serves) make it a model's job,
        shown as one in the dashboard; ``verify_top``: best configs of each task measured
        again at its end (None: the server's default, 0: none)."""
        chosen = {"tuner": tuner, "measure": measure, "model": model, "verify_top": verify_top,
                  "layers": [list(names) for names in layers] if layers is not None else None}
        body = JobRequest.model_validate({
            "target": Target.parse(str(target)), "tasks": list(workloads), "n_trial": n_trial,
            "early_stopping": early_stopping, "plan_size": plan_size,
            **{k: v for k, v in chosen.items() if v is not None}})  # None: the default
        with self._answering("jobs"):
            return self.api.submit_job(body)

    def job(self, job_id: int) -> JobView:
        """A job with its tasks and their tuning curves."""
        with self._answering(f"job {job_id}"):
            return self.api.job(job_id)

    def jobs(self, limit: int = 100) -> list[JobView]:
        """The newest ``limit`` jobs, newest first."""
        with self._answering("jobs"):
            return self.api.jobs(limit)

    def cancel(self, job_id: int) -> JobStatus:
        """Cancel a job; its status after (``cancelled``, or how it had already ended)."""
        with self._answering(f"job {job_id}"):
            return self.api.cancel_job(job_id).status

    def trials(self, job_id: int, task_id: int, after: int | None = None) -> TrialPage:
        """A task's measured trials (those stored after trial ``after``, if given)."""
        with self._answering(f"job {job_id} task {task_id}"):
            return self.api.trials(job_id, task_id, after)

    def workers(self) -> list[WorkerInfo]:
        """The registered workers: target, device, heartbeat, alive, rates."""
        with self._answering("workers"):
            return self.api.workers()

    def follow(self, job_id: int, callbacks: Sequence[CallbackLike] = (), *,
               check: Callable[[], None] | None = None,
               quiet: AbstractContextManager[object] | None = None) -> JobView:
        """Poll the job until it ends (every ``POLL_S``), handing each measured trial,
        with the record the server stored for it, to ``callbacks`` (those measured
        before first); ``check`` runs at every poll and raises if the job can no
        longer end. ``quiet`` is held through each poll's requests (not the callbacks):
        the embedded fleet's lock, so the server answers them between trials, not beside
        a kernel being timed."""
        hooks = [as_callback(c) for c in callbacks]
        hold = quiet or nullcontext()
        with hold:
            job = self.job(job_id)
        handed = _Handed(len(job.tasks))
        for hook in hooks:
            hook.on_start(job)
        try:
            while True:
                with hold:  # the callbacks run after: the worker goes on
                    trials = self._new_trials(job, handed)
                for trial in trials:
                    for hook in hooks:
                        hook.on_trial(trial)
                for hook in hooks:
                    hook.on_update(job)
                if job.status.final:
                    return job
                if check is not None:
                    check()
                time.sleep(POLL_S)
                with hold:
                    job = self.job(job_id)
        finally:
            for hook in hooks:
                hook.on_end(job)

    def _new_trials(self, job: JobView, handed: _Handed) -> list[Trial]:
        """The trials of ``job`` measured since those ``handed`` on (updated), a page at
        a time; a task whose count has not grown is not asked (a ResNet-50 job's 43
        trial lists cost the server 110-170 ms of CPU a poll, nearly all unchanged)."""
        found: list[Trial] = []
        for i, task in enumerate(job.tasks):
            if task.trials_done <= handed.trial[i]:
                continue
            workload = _workload(task)
            while True:
                points = self.trials(job.id, task.id, after=handed.id[i]).items
                if not points:
                    break
                found += [Trial(job.id, i, workload, p.trial, p.error_no, p.cost, p.gflops,
                                Record.from_json(p.record) if p.record else None)
                          for p in points]
                handed.id[i], handed.trial[i] = points[-1].id, points[-1].trial
                if points[-1].trial >= task.trials_done:
                    break
        return found

    # ---------------------------------------------------------------- records

    def records(self, target: str | Target | None = None,
                workload: Workload | None = None) -> list[Record]:
        """Every stored record (of a target's kind, or kind and model; of a workload),
        oldest first."""
        with self._answering("records"):
            return [Record.from_json(item)
                    for item in self.api.iter_records(target, workload=workload)]

    def search(self, target: str | Target | None = None, template: str | None = None,
               workload: str | None = None, best: bool = True,
               limit: int = 100) -> list[RecordSummary]:
        """The dashboard's search (``workload``: a substring of the key, e.g. 1,64,56,56);
        ``best``: only the best record per device model and workload."""
        with self._answering("records"):
            return self.api.search_records(target, template, workload, best, limit).items

    def best(self, target: str | Target, workloads: Sequence[Workload]) -> list[BestItem]:
        """The server's best record of each workload for ``target`` (AutoTVM's
        ApplyHistoryBest rule), in the order asked."""
        with self._answering("records"):
            return self.api.best(target, workloads)

    def import_log(self, path: str | Path) -> ImportResponse:
        """Store an AutoTVM log file as imported records (lines already stored count as
        duplicates)."""
        return self.import_lines(Path(path).read_text().splitlines())

    def import_lines(self, lines: str | Iterable[str]) -> ImportResponse:
        """Store AutoTVM log lines (a text, or its lines) as imported records; line
        numbers in the answer count from the first line given."""
        with self._answering("records"):
            return self.api.import_records(lines)

    def export(self, target: str | Target | None = None) -> str:
        """Every stored record (of a target's kind, or kind and model) as AutoTVM lines."""
        return "".join(r.to_line() + "\n" for r in self.records(target))

    def pretuned_log(self, target: str | Target) -> str:
        """The target's pretuned log: its best record per workload, AutoTVM lines."""
        with self._answering(f"pretuned log of {target}"):
            return self.api.pretuned_log(target).text or ""


def _explain(err: ApiError, server: str, what: str) -> TunerError:
    """One sentence for a refusal, with the server's ``detail``, saying what to do."""
    status, detail, method, path = err.status, err.detail, err.method, err.path
    if isinstance(err, Unavailable):
        if status is None:
            return Unreachable(f"cannot reach the tuning server at {server}: {detail}")
        return Unreachable(f"the tuning server at {server} is unavailable ({status}: "
                           f"{detail}); try again in a moment")
    if isinstance(err, BadAnswer):
        return TunerError(f"{server}{path} did not answer JSON of this version's API: "
                          f"{detail}")
    if status == 401:
        return Unauthorized(f"the server refused the token ({status}: {detail}); use a "
                            f"client token")
    if status == 403:
        return Unauthorized(f"forbidden ({status}: {detail}); use a client or admin token")
    if status in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
        # FastAPI's own answer for a route it does not have: an older or other server
        return TunerError(f"{server} has no {method} {path} ({status}); is it a tuning "
                          f"server of this version?")
    if status == 404:
        return TunerError(f"{detail if what in detail else f'{what}: {detail}'} "
                          f"(on {server})")
    if status == 422:
        return InvalidRequest(f"the server refused {method} {path}: {detail}", detail)
    return TunerError(f"the server answered {status} to {method} {path}: {detail}")


class _Handed:
    """Per task of a followed job, the last trial handed to the callbacks: its id (where
    the next page starts) and its number (the task's count it reached)."""

    def __init__(self, tasks: int) -> None:
        self.id: list[int | None] = [None] * tasks
        self.trial: list[int] = [0] * tasks


def _workload(task: TaskView) -> Workload:
    return Workload.model_validate({"template": task.template, "args": task.args})

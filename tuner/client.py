"""``tuner.Client``: a tuning server's jobs, workers and records as Python values, over
``tuner_client`` (the one HTTP client of the API).

Every failure becomes a :class:`TunerError` whose message names the server, the status
and the server's own explanation, and says what to do, so a script (or the CLI) can show
it as one line."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
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
    TrialPoint,
    WorkerInfo,
)
from tuner.callbacks import Callback, Trial, as_callback
from tuner_client import RECORDS_PAGE, ApiError, BadAnswer, TunerClient, Unavailable

DEFAULT_SERVER = "http://127.0.0.1:8600"  # what `tuner serve` listens on by default
POLL_S = 0.5  # how often a followed job is polled
CallbackLike = Callback | Callable[[Trial], object]


class TunerError(Exception):
    """A failure to report as one line: the message says what to do about it."""


class Unreachable(TunerError):
    """The server did not answer at all (down, restarting, wrong address)."""


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
               measure: MeasureOptions | None = None) -> int:
        """Submit one job tuning ``workloads`` on ``target``; its id."""
        chosen = {"tuner": tuner, "measure": measure}  # None: the contract's default
        body = JobRequest.model_validate({
            "target": Target.parse(str(target)), "tasks": list(workloads), "n_trial": n_trial,
            "early_stopping": early_stopping, "plan_size": plan_size,
            **{k: v for k, v in chosen.items() if v is not None}})
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
               check: Callable[[], None] | None = None) -> JobView:
        """Poll the job until it ends (every ``POLL_S``), handing its measured trials,
        each with its stored record, to ``callbacks`` (those measured before first);
        ``check`` runs at every poll and raises if the job can no longer end."""
        job = self.job(job_id)
        counts = [self.count_records(job.target, _workload(t)) for t in job.tasks]
        done = [t.trials_done for t in self.job(job_id).tasks]
        # each task's last `done` records are taken as its trials'; counting before
        # reading `done` can only start earlier, and others' records are passed over
        before = [max(c - d, 0) for c, d in zip(counts, done, strict=True)]
        return self.follow_from(job_id, before, callbacks, check=check)

    def follow_from(self, job_id: int, before: Sequence[int],
                    callbacks: Sequence[CallbackLike] = (), *,
                    check: Callable[[], None] | None = None) -> JobView:
        """:meth:`follow` for a job submitted when each task's workload had ``before[i]``
        records on the job's target (what ``tuner.tune`` counts as it submits)."""
        hooks = [as_callback(c) for c in callbacks]
        job = self.job(job_id)
        feed = _TrialFeed(self, job, before)
        for hook in hooks:
            hook.on_start(job)
        try:
            while True:
                for trial in feed.new_trials(job):
                    for hook in hooks:
                        hook.on_trial(trial)
                for hook in hooks:
                    hook.on_update(job)
                if job.status.final:
                    return job
                if check is not None:
                    check()
                time.sleep(POLL_S)
                job = self.job(job_id)
        finally:
            for hook in hooks:
                hook.on_end(job)

    # ---------------------------------------------------------------- records

    def records(self, target: str | Target | None = None, workload: Workload | None = None,
                offset: int = 0) -> list[Record]:
        """Every stored record (of a target's kind, or kind and model; of a workload),
        oldest first, from the ``offset``-th on."""
        found: list[Record] = []
        with self._answering("records"):
            while True:
                page = self.api.records(target, workload=workload, limit=RECORDS_PAGE,
                                        offset=offset + len(found))
                found += [Record.from_json(item) for item in page.items]
                if not page.items or offset + len(found) >= page.total:
                    return found

    def count_records(self, target: str | Target | None = None,
                      workload: Workload | None = None) -> int:
        """How many records ``records`` with these filters would list."""
        with self._answering("records"):
            return self.api.records(target, workload=workload, limit=1).total

    def search(self, target: str | None = None, template: str | None = None,
               workload: str | None = None, best: bool = True,
               limit: int = 100) -> list[RecordSummary]:
        """The dashboard's search (``workload``: a substring of the key, e.g. 1,64,56,56);
        ``best``: only the best record per device model and workload."""
        with self._answering("records"):
            return self.api.search_records(target, template, workload, best, limit).items

    def best(self, workloads: Sequence[Workload], target: str | Target) -> list[BestItem]:
        """The server's best record of each workload for ``target`` (AutoTVM's
        ApplyHistoryBest rule), in the order asked."""
        with self._answering("records"):
            return self.api.best(target, workloads)

    def import_log(self, log: str | Path | Iterable[str]) -> ImportResponse:
        """Store AutoTVM log lines (a file, its text, or lines) as imported records."""
        text = log.read_text() if isinstance(log, Path) else log
        with self._answering("records"):
            return self.api.import_records(text)

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
            return Unreachable(f"cannot reach the tuning server at {server}: {detail} "
                               f"(--server or TUNER_SERVER)")
        return Unreachable(f"the tuning server at {server} is unavailable ({status}: "
                           f"{detail}); try again in a moment")
    if isinstance(err, BadAnswer):
        return TunerError(f"{server}{path} did not answer JSON of this version's API: "
                          f"{detail}")
    if status == 401:
        return TunerError(f"the server refused the token ({status}: {detail}); pass a client "
                          f"token with --token or TUNER_TOKEN (`tuner token create --role "
                          f"client`)")
    if status == 403:
        return TunerError(f"forbidden ({status}: {detail}); use a client or admin token")
    if status in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
        # FastAPI's own answer for a route it does not have: an older or other server
        return TunerError(f"{server} has no {method} {path} ({status}); is it a tuning "
                          f"server of this version?")
    if status == 404:
        return TunerError(f"{detail if what in detail else f'{what}: {detail}'} "
                          f"(on {server})")
    return TunerError(f"the server answered {status} to {method} {path}: {detail}")


def _workload(task: TaskView) -> Workload:
    return Workload.model_validate({"template": task.template, "args": task.args})


class _TrialFeed:
    """A job's newly measured trials, each with its stored record: the record listing
    of each task's workload on the job's target, read from where it stood before the
    job, paired in storage order with the task's trials (a record another job stored in
    between does not match a trial's outcome and is passed over)."""

    def __init__(self, client: Client, job: JobView, before: Sequence[int]) -> None:
        self.client, self.target = client, job.target
        self.workloads = [_workload(t) for t in job.tasks]
        self.seen = [0] * len(job.tasks)  # trials handed on, per task
        self.last: list[int | None] = [None] * len(job.tasks)  # their last trial id
        self.offset = list(before)  # records of the workload read, per task

    def new_trials(self, job: JobView) -> list[Trial]:
        found: list[Trial] = []
        for i, task in enumerate(job.tasks):
            while task.trials_done > self.seen[i]:  # a page at a time
                points = self.client.trials(job.id, task.id, after=self.last[i]).items
                if not points:
                    break
                records = self.client.records(self.target, self.workloads[i], self.offset[i])
                for point in points:
                    record = self._match(i, point, records)
                    found.append(Trial(job.id, i, self.workloads[i], point.trial,
                                       point.error_no, point.cost, point.gflops, record))
                self.seen[i] = points[-1].trial
                self.last[i] = points[-1].id
        return found

    def _match(self, task: int, point: TrialPoint, records: list[Record]) -> Record | None:
        while records:
            record = records.pop(0)
            self.offset[task] += 1
            if _same(point, record):
                return record
        return None


def _same(point: TrialPoint, record: Record) -> bool:
    """Whether ``record`` is the outcome ``point`` reports (error number, mean cost)."""
    if int(record.result.error_no) != point.error_no:
        return False
    if point.cost is None:
        return True
    return abs(record.result.mean_cost - point.cost) <= 1e-9 * max(point.cost, 1e-30)

"""The tuning fleet end to end: an embedded `tuner tune`; a real server process with real
worker processes on SQLite/sql and PostgreSQL/Redis; a worker SIGKILLed mid-lease and a
server SIGKILLed mid-job (nothing lost, nothing twice); idempotent results; expired
leases requeued then given up (error 8); the role matrix for every endpoint; malformed
requests (4xx naming the field, never 5xx); cancel; the Prometheus metrics."""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import (
    REDIS_UNREACHABLE,
    REDIS_URL,
    clear_redis,
    empty_database,
    free_port,
    kill_group,
    make_tokens,
    migrate,
    opencl_target,
    wait_until,
)
from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from compiler.templates import get_template
from schemas import (
    MeasureErrorNo,
    MeasureInput,
    MeasureResult,
    Record,
    Target,
    Workload,
)
from schemas.api import FINAL
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow

pytestmark = pytest.mark.timeout(180)

TUNER = Path(sys.executable).with_name("tuner")
LEASE_S = 3.0  # the fleet's lease: short, so a lost worker's trials come back quickly
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs: the divisors of 256
CONV = "conv2d_nchw.cuda"
CONV_ARGS: list[Any] = [["TENSOR", [1, 16, 8, 8], "float32"],
                        ["TENSOR", [16, 16, 3, 3], "float32"],
                        [1, 1], [1, 1, 1, 1], [1, 1], "float32"]  # ~0.3-1.5 s a trial here
FAST = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
FLEETS = [pytest.param("sqlite", "sql", id="sqlite-sql"),
          pytest.param("postgresql", "redis", id="postgresql-redis")]


TARGET, NO_DEVICE = opencl_target()
if TARGET is not None and not TUNER.exists():
    TARGET, NO_DEVICE = None, f"the tuner command is not installed beside {sys.executable}"
needs_device = pytest.mark.skipif(TARGET is None, reason=NO_DEVICE)
# In-process tests never run a kernel: their fake workers say they are PoCL.
FAKE_TARGET = "opencl -model=pocl-cpu"


def job_body(template: str = DENSE, args: list[Any] | None = None, n_trial: int = 6,
             target: str | None = None, **extra: Any) -> dict[str, Any]:
    """A POST /api/v1/jobs body for one task, timed as cheaply as possible."""
    return {"target": target or FAKE_TARGET,
            "tasks": [{"template": template, "args": DENSE_ARGS if args is None else args}],
            "n_trial": n_trial, "measure": FAST,
            "verify_top": 0, **extra}  # exact trial counts: tests/test_verify.py verifies


def good_result(cost: float = 2e-5) -> dict[str, Any]:
    return MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                         timestamp=time.time()).model_dump(mode="json")


def reader(url: str) -> Engine:
    """An engine for the test's own reads: no pool, and no write lock taken on SQLite."""
    return create_engine(url, poolclass=NullPool)


def job_trials(engine: Engine, job_id: int) -> list[TrialRow]:
    with Session(engine) as session:
        return list(session.scalars(
            select(TrialRow).join(TaskRow, TaskRow.id == TrialRow.task_id)
            .where(TaskRow.job_id == job_id).order_by(TrialRow.id)))


def job_records(engine: Engine, job_id: int) -> list[tuple[int, Record]]:
    """(trial id, record) for every record a trial of the job produced."""
    with Session(engine) as session:
        rows = session.execute(
            select(RecordRow.trial_id, RecordRow.line)
            .join(TrialRow, TrialRow.id == RecordRow.trial_id)
            .join(TaskRow, TaskRow.id == TrialRow.task_id)
            .where(TaskRow.job_id == job_id).order_by(RecordRow.id)).all()
    return [(int(t), Record.from_json(line)) for t, line in rows]


def assert_exactly_once(engine: Engine, job_id: int, n_trial: int) -> list[tuple[int, Record]]:
    """Every trial of the job is done and has exactly one record: nothing lost, nothing
    twice. Returns the records."""
    trials = job_trials(engine, job_id)
    records = job_records(engine, job_id)
    assert [t.status for t in trials] == ["done"] * n_trial, [(t.id, t.status) for t in trials]
    record_trials = [t for t, _ in records]
    assert len(records) == n_trial, f"{len(records)} records for {n_trial} trials"
    assert len(set(record_trials)) == len(record_trials), f"a trial recorded twice: {records}"
    assert set(record_trials) == {t.id for t in trials}
    return records


def parse_metrics(text: str) -> dict[str, float]:
    return {name: float(value) for name, _, value in
            (line.partition(" ") for line in text.splitlines() if line and line[0] != "#")}


# --------------------------------------------------------------------------------------
# Real processes: `tuner serve` and `tuner worker`.

def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    return {**env, **extra}


@dataclass
class Fleet:
    """A `tuner serve` process over one database and queue, and `tuner worker` processes."""

    directory: Path
    database_url: str
    queue_url: str
    redis_prefix: str
    port: int = field(default_factory=free_port)
    tokens: dict[str, str] = field(default_factory=dict)
    server: subprocess.Popen[bytes] | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker_logs: dict[str, Path] = field(default_factory=dict)
    _started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        migrate(self.database_url)
        self.tokens = make_tokens(self.database_url)
        self.db = reader(self.database_url)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = self.directory / f"{log_name}-{len(self._started)}.log"
        self._logs.append(log)
        env = _clean_env({"TUNER_LEASE_SECONDS": str(LEASE_S),
                          "TUNER_REDIS_PREFIX": self.redis_prefix,
                          "TUNER_SCHEDULER_INTERVAL": "0.1",
                          "XDG_DATA_HOME": str(self.directory / "xdg")})
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(TUNER), *argv], stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        self._started.append(proc)
        return proc

    def start_server(self) -> None:
        self.server = self._spawn(["serve", "--port", str(self.port), "--database-url",
                                   self.database_url, "--queue-url", self.queue_url], "server")

        def healthy() -> bool:
            assert self.server is not None
            if self.server.poll() is not None:
                pytest.fail(f"tuner serve exited with {self.server.returncode}\n{self.logs()}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 30, "the server's /healthz", diagnose=self.logs)

    def kill_server(self) -> None:
        assert self.server is not None
        self.server.send_signal(signal.SIGKILL)
        self.server.wait(10)

    def start_worker(self, name: str, batch: int = 1) -> subprocess.Popen[bytes]:
        proc = self._spawn(["worker", "--server", self.url, "--token", self.tokens["worker"],
                            "--device", "opencl:0", "--name", name, "--batch", str(batch)],
                           f"worker-{name}")
        self.workers[name] = proc
        self.worker_logs[name] = self._logs[-1]
        return proc

    def worker_id(self, name: str) -> int | None:
        with Session(self.db) as session:
            return session.scalar(select(WorkerRow.id).where(WorkerRow.name == name))

    def wait_registered(self, *names: str) -> None:
        def registered() -> bool:
            for name in names:
                if self.workers[name].poll() is not None:
                    pytest.fail(f"worker {name} exited early\n{self.logs()}")
            return all(self.worker_id(n) is not None for n in names)

        wait_until(registered, 60, f"workers {', '.join(names)} to register",
                   every=0.1, diagnose=self.logs)

    def client(self, role: str = "client") -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {self.tokens[role]}"})

    def submit(self, body: dict[str, Any]) -> int:
        """Submit a job for the local device's target (what the workers serve)."""
        with self.client() as client:
            response = client.post("/api/v1/jobs", json={**body, "target": TARGET})
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def wait_job(self, job_id: int, timeout: float = 90) -> dict[str, Any]:
        """Follow GET /api/v1/jobs/{id} until the job ends (retrying while the server is
        down); returns its last description."""
        last: dict[str, Any] = {}

        def ended() -> bool:
            nonlocal last
            try:
                with self.client() as client:
                    last = client.get(f"/api/v1/jobs/{job_id}").raise_for_status().json()
            except httpx.TransportError:
                return False
            return last["status"] in FINAL

        wait_until(ended, timeout, f"job {job_id} to end", every=0.2,
                   diagnose=lambda: f"last seen: {json.dumps(last)[:2000]}\n{self.logs()}")
        return last

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=10).text)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in self._logs if p.exists())

    def close(self) -> None:
        for proc in self._started:
            kill_group(proc)
        self.db.dispose()


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Callable[[str, str], Fleet]]:
    """Build fleets on (database backend, queue); every process, database and Redis key
    they made is gone after the test."""
    with ExitStack() as stack:
        def make(backend: str, queue: str) -> Fleet:
            if TARGET is None:
                pytest.skip(NO_DEVICE)
            if queue == "redis" and REDIS_UNREACHABLE:
                pytest.skip(REDIS_UNREACHABLE)
            url = stack.enter_context(empty_database(backend, tmp_path))
            prefix = f"tunertest-{secrets.token_hex(6)}"
            if queue == "redis":
                stack.callback(clear_redis, prefix)
            fleet = Fleet(tmp_path, url, REDIS_URL if queue == "redis" else "sql", prefix)
            stack.callback(fleet.close)
            return fleet

        yield make


# --------------------------------------------------------------------------------------
# 1-5: real processes.

@needs_device
def test_embedded_tune_end_to_end(tmp_path: Path) -> None:
    """`tuner tune` with nothing running: exits 0, prints a good record, stores 6."""
    url = f"sqlite:///{tmp_path / 'embedded.db'}"
    proc = subprocess.run(
        [str(TUNER), "tune", "--database-url", url, "--target", str(TARGET),
         "--template", DENSE, "--args", json.dumps(DENSE_ARGS), "--trials", "6",
         "--number", "1", "--repeat", "1", "--min-repeat-ms", "0", "--device", "opencl:0",
         "--verify-top", "0"],  # stores exactly its 6 trials
        check=False, capture_output=True, text=True, timeout=150,
        env=_clean_env({"XDG_DATA_HOME": str(tmp_path / "xdg")}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no record line in:\n{proc.stdout}"
    record = Record.from_line(lines[-1])
    assert record.result.error_no == MeasureErrorNo.NO_ERROR
    assert record.workload == Workload(template=DENSE, args=DENSE_ARGS)
    assert record.result.mean_cost > 0 and record.target == Target.parse(str(TARGET))
    assert "job 1 done: 6 trials" in proc.stdout
    engine = reader(url)
    try:
        with Session(engine) as session:
            stored = session.execute(select(RecordRow.trial_id, RecordRow.error_no)).all()
    finally:
        engine.dispose()
    assert len(stored) == 6 and len({t for t, _ in stored}) == 6, stored
    assert all(t is not None for t, _ in stored)


def test_fleet_job_on_postgres_and_redis(make_fleet: Callable[[str, str], Fleet]) -> None:
    """Server process + one worker process on PostgreSQL/Redis: the job is done with its
    budget measured once each, a best cost and a tuning curve."""
    fleet = make_fleet("postgresql", "redis")
    fleet.start_server()
    fleet.start_worker("solo")
    job_id = fleet.submit(job_body(n_trial=6))
    job = fleet.wait_job(job_id, timeout=60)
    assert job["status"] == "done", job
    [task] = job["tasks"]
    assert task["status"] == "done"
    assert task["trials_done"] == task["n_trial"] == 6
    assert task["best_cost"] is not None and 0 < task["best_cost"] < 1
    curve = task["curve"]
    assert curve, task
    costs = [point["best_cost"] for point in curve]
    assert costs == sorted(costs, reverse=True) and costs[-1] == task["best_cost"]
    assert all(1 <= point["trial"] <= 6 for point in curve)
    records = assert_exactly_once(fleet.db, job_id, 6)
    assert {r.info["worker"] for _, r in records if r.info} == {"solo"}
    with fleet.client() as client:
        page = client.get("/api/v1/records", params={"template": DENSE}).json()
    assert page["total"] == 6


@pytest.mark.parametrize("backend,queue", FLEETS)
def test_two_workers_share_a_job(make_fleet: Callable[[str, str], Fleet], backend: str,
                                 queue: str) -> None:
    """Two worker processes on one job: both measure, each trial is recorded once."""
    fleet = make_fleet(backend, queue)
    fleet.start_server()
    fleet.start_worker("alpha")
    fleet.start_worker("beta")
    fleet.wait_registered("alpha", "beta")
    n_trial = 10
    job_id = fleet.submit(job_body(CONV, CONV_ARGS, n_trial=n_trial))
    job = fleet.wait_job(job_id, timeout=90)
    assert job["status"] == "done", job
    records = assert_exactly_once(fleet.db, job_id, n_trial)
    by_worker = {r.info["worker"] for _, r in records if r.info}
    assert by_worker == {"alpha", "beta"}, by_worker
    assert job["tasks"][0]["trials_done"] == n_trial


@pytest.mark.parametrize("backend,queue", FLEETS)
def test_worker_sigkilled_mid_lease(make_fleet: Callable[[str, str], Fleet], backend: str,
                                    queue: str) -> None:
    """A worker SIGKILLed while holding a lease of 4: after the lease expires its trials
    are measured by a second worker, and each trial ends with exactly one record."""
    fleet = make_fleet(backend, queue)
    fleet.start_server()
    victim = fleet.start_worker("victim", batch=4)
    fleet.wait_registered("victim")
    victim_id = fleet.worker_id("victim")
    n_trial = 10
    job_id = fleet.submit(job_body(CONV, CONV_ARGS, n_trial=n_trial))

    def held() -> list[int]:
        return [t.id for t in job_trials(fleet.db, job_id)
                if t.status == "leased" and t.worker_id == victim_id]

    wait_until(lambda: len(held()) >= 2, 30, "the victim to lease trials", every=0.02,
               diagnose=fleet.logs)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    lost = held()  # what it held when it died: nobody reports these now
    assert lost, "the victim had reported everything before it was killed"
    killed_at = time.time()

    fleet.start_worker("rescuer")
    job = fleet.wait_job(job_id, timeout=90)
    assert job["status"] == "done", job
    records = dict(assert_exactly_once(fleet.db, job_id, n_trial))
    trials = {t.id: t for t in job_trials(fleet.db, job_id)}
    for trial_id in lost:
        record = records[trial_id]
        assert record.info and record.info["worker"] == "rescuer", (trial_id, record.info)
        assert record.result.error_no == MeasureErrorNo.NO_ERROR, record.result
        assert trials[trial_id].attempts >= 2, "a lost trial was not leased again"
        # measured again only after the lease ran out
        assert record.result.timestamp >= killed_at, (record.result.timestamp, killed_at)
    if queue == "sql":  # Redis may hand an expired ticket straight over (XAUTOCLAIM),
        # before the scheduler's reclaim, which is what this counter counts
        assert fleet.metrics()["tuner_lease_expiries_total"] >= len(lost)


def test_worker_sigterm_finishes_the_trial_in_hand_and_returns_the_rest(
        make_fleet: Callable[[str, str], Fleet]) -> None:
    """SIGTERM: the worker reports the trial it is measuring, gives the rest of its lease
    back unmeasured (queued again, not counted as a failed attempt) and exits 0."""
    fleet = make_fleet("sqlite", "sql")
    fleet.start_server()
    worker = fleet.start_worker("leaver", batch=4)
    fleet.wait_registered("leaver")
    worker_id = fleet.worker_id("leaver")
    job_id = fleet.submit(job_body(CONV, CONV_ARGS, n_trial=10))

    def held() -> list[int]:
        return [t.id for t in job_trials(fleet.db, job_id)
                if t.status == "leased" and t.worker_id == worker_id]

    log = fleet.worker_logs["leaver"]

    def measuring() -> bool:  # leased in the database is not yet in hand: wait for both
        return len(held()) >= 3 and "measuring trial" in log.read_text(errors="replace")

    wait_until(measuring, 30, "the worker to lease trials and start measuring one",
               every=0.02, diagnose=fleet.logs)
    holding = held()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, fleet.logs()
    recorded = [trial_id for trial_id, _record in job_records(fleet.db, job_id)]
    assert len(recorded) == len(set(recorded)), "a trial was recorded twice"
    records = set(recorded)
    trials = {t.id: t for t in job_trials(fleet.db, job_id)}
    measured = [t for t in holding if t in records]
    returned = [t for t in holding if t not in records]
    assert measured, "the trial in hand was not reported"
    assert returned, "nothing was left to give back"
    for trial_id in returned:
        trial = trials[trial_id]
        assert (trial.status, trial.worker_id, trial.attempts) == ("queued", None, 0), (
            trial_id, trial.status, trial.worker_id, trial.attempts)


@pytest.mark.parametrize("backend,queue", FLEETS)
def test_server_sigkilled_and_restarted_mid_job(make_fleet: Callable[[str, str], Fleet],
                                                backend: str, queue: str) -> None:
    """The server dies (SIGKILL) mid-job and comes back on the same database: the worker
    retries through the outage, the job resumes and every trial is recorded once."""
    fleet = make_fleet(backend, queue)
    fleet.start_server()
    worker = fleet.start_worker("steady")
    n_trial = 10
    job_id = fleet.submit(job_body(CONV, CONV_ARGS, n_trial=n_trial))
    wait_until(lambda: len(job_records(fleet.db, job_id)) >= 3, 60, "3 records",
               every=0.1, diagnose=fleet.logs)
    fleet.kill_server()
    log = fleet.worker_logs["steady"]

    def retrying() -> bool:
        if worker.poll() is not None:
            pytest.fail(f"the worker gave up on the dead server\n{fleet.logs()}")
        return "server unavailable" in log.read_text(errors="replace")

    wait_until(retrying, 30, "the worker to retry the dead server", every=0.1,
               diagnose=fleet.logs)
    done_before = len(job_records(fleet.db, job_id))
    assert done_before < n_trial
    fleet.start_server()
    job = fleet.wait_job(job_id, timeout=90)
    assert job["status"] == "done", job
    records = assert_exactly_once(fleet.db, job_id, n_trial)
    assert {r.info["worker"] for _, r in records if r.info} == {"steady"}
    assert worker.poll() is None, "the worker exited instead of serving on"


# --------------------------------------------------------------------------------------
# 6-11: the app in-process (fastapi's TestClient), for speed and determinism. Fake
# workers speak the HTTP API; the scheduler's pass is run by hand.

def own(worker_id: int) -> str:
    """The key of a worker's own token (its registration's) in ``Api.tokens``."""
    return f"worker {worker_id}"


@dataclass
class Api:
    """An app over a fresh database, one token per role plus each registered worker's
    own, and helpers."""

    client: Any
    app: Any
    tokens: dict[str, str]
    db: Engine

    def headers(self, role: str | None) -> dict[str, str]:
        if role is None:
            return {}
        token = self.tokens.get(role, f"tun_bogus_{role}")
        return {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, role: str | None = "admin",
             **kwargs: Any) -> httpx.Response:
        headers = {**self.headers(role), **kwargs.pop("headers", {})}
        response: httpx.Response = self.client.request(method, path, headers=headers,
                                                       **kwargs)
        return response

    def ok(self, method: str, path: str, role: str = "admin", **kwargs: Any) -> Any:
        response = self.call(method, path, role, **kwargs)
        assert response.status_code in (200, 201), (path, response.status_code, response.text)
        return response.json()

    def submit(self, body: dict[str, Any]) -> int:
        return int(self.ok("POST", "/api/v1/jobs", json=body)["id"])

    def register(self, name: str) -> int:
        """Register with the fleet's worker token; keep the worker's own token."""
        answer = self.ok("POST", "/api/v1/workers", role="worker",
                         json={"name": name, "target": FAKE_TARGET})
        worker_id = int(answer["id"])
        self.tokens[own(worker_id)] = answer["token"]
        return worker_id

    def lease(self, worker_id: int, max_trials: int = 1,
              wait_s: float = 2.0) -> list[dict[str, Any]]:
        """Long-poll as a worker does: returns as soon as a trial is there, or [] after
        ``wait_s`` (a Redis lease may first spend its call on stale tickets)."""
        trials: list[dict[str, Any]] = self.ok(
            "POST", f"/api/v1/workers/{worker_id}/lease", role=own(worker_id),
            json={"max_trials": max_trials, "wait_s": wait_s})["trials"]
        return trials

    def report(self, worker_id: int, trial_id: int, cost: float = 2e-5) -> dict[str, Any]:
        answer: dict[str, Any] = self.ok(
            "POST", f"/api/v1/workers/{worker_id}/results", role=own(worker_id),
            json={"results": [{"trial_id": trial_id, "result": good_result(cost)}]})
        return answer

    def run_pass(self) -> Any:
        """One scheduler pass: reclaim expired leases, plan, finish tasks and jobs."""
        return self.app.state.scheduler.run_pass()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.client.get("/metrics").text)


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Apps on fresh databases (``backend`` "sqlite" or "postgresql", ``queue`` "sql" or
    "redis"); databases, Redis keys and engines are gone after the test."""
    from fastapi.testclient import TestClient

    from tuner_server.app import create_app
    from tuner_server.settings import Settings

    with ExitStack() as stack:
        def make(queue: str = "sql", lease_seconds: float = 120.0,
                 backend: str = "sqlite") -> Api:
            if queue == "redis" and REDIS_UNREACHABLE:
                pytest.skip(REDIS_UNREACHABLE)
            url = stack.enter_context(empty_database(backend, tmp_path))
            migrate(url)
            tokens = make_tokens(url)
            prefix = f"tunertest-{secrets.token_hex(6)}"
            if queue == "redis":
                stack.callback(clear_redis, prefix)
            settings = Settings(database_url=url, queue_url=REDIS_URL if queue == "redis"
                                else "sql", redis_prefix=prefix, require_auth=True,
                                run_scheduler=False, lease_seconds=lease_seconds)
            app = create_app(settings)
            stack.callback(app.state.engine.dispose)
            db = reader(url)
            stack.callback(db.dispose)
            return Api(TestClient(app, raise_server_exceptions=False), app, tokens, db)

        yield make


QUEUES = ["sql", "redis"]


@pytest.mark.parametrize("queue", QUEUES)
def test_results_are_idempotent(make_api: Callable[..., Api], queue: str) -> None:
    """The same result posted twice by its worker is a duplicate: one record, the first
    result kept, trials_done counted once. Another worker's post of it is refused, as
    is a batch naming an unknown trial: nothing stored."""
    api = make_api(queue)
    job_id = api.submit(job_body(n_trial=3))
    api.run_pass()
    w1, w2 = api.register("w1"), api.register("w2")
    [trial] = api.lease(w1)
    tid = trial["trial_id"]
    assert api.report(w1, tid, cost=2e-5) == {"accepted": 1, "duplicates": 0}
    assert api.report(w1, tid, cost=1e-6) == {"accepted": 0, "duplicates": 1}
    other = api.call("POST", f"/api/v1/workers/{w2}/results", role=own(w2),
                     json={"results": [{"trial_id": tid, "result": good_result(1e-6)}]})
    assert other.status_code == 409 and f"trial {tid} is done" in other.json()["detail"]
    mixed = api.call("POST", f"/api/v1/workers/{w1}/results", role=own(w1), json={"results": [
        {"trial_id": tid, "result": good_result()},
        {"trial_id": 999_999, "result": good_result()}]})
    assert mixed.status_code == 409, mixed.text
    assert "trial 999999 does not exist" in mixed.json()["detail"]
    records = job_records(api.db, job_id)
    assert [t for t, _ in records] == [tid]
    assert records[0][1].result.costs == (2e-5,)  # the first report stands
    assert records[0][1].info and records[0][1].info["worker"] == "w1"
    task = api.ok("GET", f"/api/v1/jobs/{job_id}")["tasks"][0]
    assert task["trials_done"] == 1 and task["best_cost"] == pytest.approx(2e-5)
    assert api.metrics()["tuner_trials_recorded_total"] == 1


@pytest.mark.parametrize("queue", QUEUES)
def test_expired_lease_is_requeued_then_given_up(make_api: Callable[..., Api],
                                                 queue: str) -> None:
    """A lease nobody reports goes back on the queue (attempts + 1) for another worker;
    the second expiry (it lost two workers) records error 8, and the job still
    finishes."""
    # long enough that the "held: not handed out twice" check runs inside the lease even
    # on a loaded machine
    api = make_api(queue, lease_seconds=1.0)
    job_id = api.submit(job_body(n_trial=2, plan_size=1))
    workers = {"w1": api.register("w1"), "w2": api.register("w2")}
    assert api.run_pass().planned == 1
    [trial_id] = [t.id for t in job_trials(api.db, job_id)]
    for attempt, (name, other) in enumerate([("w1", "w2"), ("w2", "w1")], 1):
        leased = api.lease(workers[name], max_trials=4)
        assert [t["trial_id"] for t in leased] == [trial_id], (attempt, leased)
        [row] = job_trials(api.db, job_id)
        assert (row.status, row.attempts, row.worker_id) == ("leased", attempt, workers[name])
        assert api.lease(workers[other], wait_s=0) == []  # held: not handed out twice
        time.sleep(max(leased[0]["lease_deadline"] - time.time(), 0) + 0.05)
        stats = api.run_pass()
        row = {t.id: t for t in job_trials(api.db, job_id)}[trial_id]
        if attempt < 2:
            assert (stats.requeued, stats.given_up, stats.planned) == (1, 0, 0)
            assert (row.status, row.worker_id) == ("queued", None)
        else:  # given up; the same pass plans the task's next trial
            assert (stats.requeued, stats.given_up, stats.planned) == (0, 1, 1)
            assert (row.status, row.error_no) == ("done", 8)
    [(tid, record)] = job_records(api.db, job_id)
    assert tid == trial_id and record.result.error_no == MeasureErrorNo.UNKNOWN_ERROR
    assert "lease expired twice: it lost 2 workers" in (record.result.error_msg or "")
    assert api.metrics()["tuner_lease_expiries_total"] == 2
    # the job goes on: the next trial is measured and the job is done
    [second] = api.lease(workers["w2"])
    assert second["trial_id"] != trial_id
    assert api.report(workers["w2"], second["trial_id"])["accepted"] == 1
    api.run_pass()
    job = api.ok("GET", f"/api/v1/jobs/{job_id}")
    assert job["status"] == "done", job
    assert job["tasks"][0]["trials_done"] == 2
    assert job["tasks"][0]["best_cost"] == pytest.approx(2e-5)


def test_expired_leases_taken_over_by_redis_stop_at_two(make_api: Callable[..., Api]) -> None:
    """Redis hands an expired lease straight to the next worker (XAUTOCLAIM), before any
    scheduler pass reclaims it: still, a trial that lost two workers that way is failed
    (error 8) when a third asks, not measured by it."""
    api = make_api("redis", lease_seconds=0.5)
    job_id = api.submit(job_body(n_trial=1, plan_size=1))
    w1, w2, w3 = (api.register(n) for n in ("w1", "w2", "w3"))
    api.run_pass()
    [trial_id] = [t.id for t in job_trials(api.db, job_id)]
    for attempt, worker_id in enumerate((w1, w2), 1):
        [leased] = api.lease(worker_id)
        assert leased["trial_id"] == trial_id
        [row] = job_trials(api.db, job_id)
        assert (row.attempts, row.worker_id) == (attempt, worker_id)
        time.sleep(max(leased["lease_deadline"] - time.time(), 0) + 0.6)  # idle past it
    assert api.lease(w3, wait_s=1.0) == []
    [row] = job_trials(api.db, job_id)
    assert (row.status, row.error_no, row.worker_id) == (
        "done", int(MeasureErrorNo.UNKNOWN_ERROR), None)  # not w3's failure
    [(tid, record)] = job_records(api.db, job_id)
    assert tid == trial_id
    assert "lease expired twice: it lost 2 workers" in (record.result.error_msg or "")
    late = api.call("POST", f"/api/v1/workers/{w2}/results", own(w2), json={"results": [
        {"trial_id": trial_id, "result": good_result()}]})
    assert late.status_code == 409 and f"trial {trial_id} is done" in late.text


# Every endpoint: (name, method, path, request kwargs, roles allowed besides admin, success).
# Roles: "worker" is the fleet's worker token (it registers), "own" the token worker
# ``worker_id``'s registration returned, "other" another registered worker's.
ANY_WORKER = {"worker", "own", "other"}


def _endpoints(job_id: int, worker_id: int) -> list[tuple[str, str, str, dict[str, Any],
                                                          set[str], int]]:
    wl = {"template": DENSE, "args": DENSE_ARGS}
    line = Record.from_measure(
        MeasureInput(target=Target.parse(FAKE_TARGET), workload=Workload(**wl),
                     config={"index": 0, "code_hash": None,
                             "entity": [["tile_k", "sp", [-1, 1]]]}),
        MeasureResult.model_validate(good_result())).to_line()
    workers = f"/api/v1/workers/{worker_id}"
    return [
        ("submit job", "POST", "/api/v1/jobs", {"json": job_body(n_trial=1)}, {"client"}, 201),
        ("list jobs", "GET", "/api/v1/jobs", {}, {"client"}, 200),
        ("get job", "GET", f"/api/v1/jobs/{job_id}", {}, {"client"}, 200),
        ("cancel job", "POST", f"/api/v1/jobs/{job_id}/cancel", {}, {"client"}, 200),
        ("list workers", "GET", "/api/v1/workers", {}, {"client"}, 200),
        ("register worker", "POST", "/api/v1/workers",
         {"json": {"name": "w", "target": FAKE_TARGET}}, ANY_WORKER, 201),
        ("lease", "POST", f"{workers}/lease", {"json": {"max_trials": 1, "wait_s": 0}},
         {"own"}, 200),
        ("heartbeat", "POST", f"{workers}/heartbeat", {"json": {"trial_ids": []}},
         {"own"}, 200),
        ("results", "POST", f"{workers}/results", {"json": {"results": []}}, {"own"}, 200),
        ("release", "POST", f"{workers}/release", {"json": {"trial_ids": []}}, {"own"}, 200),
        ("deregister", "DELETE", workers, {}, {"own"}, 200),
        ("list records", "GET", "/api/v1/records", {}, {"client"}, 200),
        ("best records", "POST", "/api/v1/records/best",
         {"json": {"target": FAKE_TARGET, "workloads": [wl]}}, {"client", *ANY_WORKER}, 200),
        ("import records", "POST", "/api/v1/records/import",
         {"content": line + "\n", "headers": {"content-type": "text/plain"}}, {"client"}, 200),
        ("pretuned log", "GET", "/api/v1/logs/opencl%20-model=pocl-cpu", {},
         {"client", *ANY_WORKER}, 200),
    ]


def test_auth_role_matrix(make_api: Callable[..., Api]) -> None:
    """Every endpoint x (no token, unknown token, admin, client, the fleet's worker token,
    the worker's own token, another worker's): 401 without a known token, 403 for a
    caller not allowed (a worker speaks only for itself), the success code otherwise."""
    api = make_api()
    job_id = api.submit(job_body(n_trial=2))
    worker_id, other_id = api.register("matrix"), api.register("other")

    def own_tokens() -> None:
        api.tokens["own"], api.tokens["other"] = api.tokens[own(worker_id)], api.tokens[
            own(other_id)]

    own_tokens()
    wrong = []
    for name, method, path, kwargs, allowed, success in _endpoints(job_id, worker_id):
        for role in (None, "bogus", "client", "worker", "other", "own", "admin"):
            response = api.call(method, path, role, **dict(kwargs))
            if role in (None, "bogus"):
                want = 401
            elif role == "admin" or role in allowed:
                want = success
            else:
                want = 403
            if response.status_code != want:
                wrong.append(f"{name} as {role}: {response.status_code} (want {want}) "
                             f"{response.text[:200]}")
            elif want == 401:
                if response.headers.get("www-authenticate") != "Bearer":
                    wrong.append(f"{name} as {role}: 401 without WWW-Authenticate: Bearer")
            elif want == 403 and ("worker" if role in ANY_WORKER else str(role)) not in (
                    response.json()["detail"]):
                wrong.append(f"{name} as {role}: 403 does not name the role: {response.text}")
            if method == "DELETE" and response.status_code == 200:
                # deregistered, its token revoked: registering again brings it back
                assert api.register("matrix") == worker_id
                own_tokens()
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_malformed_requests_are_4xx_naming_the_field(make_api: Callable[..., Api],
                                                     backend: str) -> None:
    """Bad bodies, ids, shapes, templates, tuners, targets and types: a 4xx whose detail
    names the field; never a 5xx; nothing stored."""
    api = make_api(backend=backend)
    job_id = api.submit(job_body(n_trial=2))
    wid = api.register("w")
    w, me = f"/api/v1/workers/{wid}", own(wid)
    api.run_pass()
    [leased] = api.lease(wid)
    as_json = {"content-type": "application/json"}
    res = good_result()
    bad_dense = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 128], "float32"],
                 None, "float32"]
    bad_conv = [["TENSOR", [1, 16, 8, 8], "float32"], ["TENSOR", [16, 16, 13, 13], "float32"],
                [1, 1], [0, 0, 0, 0], [1, 1], "float32"]
    nan_result = ('{"results": [{"trial_id": ' + str(leased["trial_id"]) + ', "result": '
                  '{"costs": [NaN], "error_no": 0, "all_cost": 0.1, "timestamp": 1.0}}]}')
    big = 2**40  # past PostgreSQL's INTEGER ids; 2**64 is past SQLite's too
    # (what, method, path, role, kwargs, status, words the detail must contain)
    cases: list[tuple[str, str, str, str, dict[str, Any], int, tuple[str, ...]]] = [
        ("bad JSON", "POST", "/api/v1/jobs", "client",
         {"content": b'{"target": "opencl", ', "headers": as_json}, 422, ("body", "JSON")),
        ("body not an object", "POST", "/api/v1/jobs", "client", {"json": [1, 2]}, 422,
         ("body",)),
        ("unknown template", "POST", "/api/v1/jobs", "client",
         {"json": job_body("nope.cuda")}, 422, ("tasks[0]", "nope.cuda")),
        ("impossible dense shape", "POST", "/api/v1/jobs", "client",
         {"json": job_body(args=bad_dense)}, 422, ("tasks[0]", "weight")),
        ("kernel bigger than the input", "POST", "/api/v1/jobs", "client",
         {"json": job_body(CONV, bad_conv)}, 422, ("tasks[0]", "13x13")),
        ("unknown tuner", "POST", "/api/v1/jobs", "client",
         {"json": job_body(tuner="xgb9")}, 422, ("tuner", "xgb9")),
        ("n_trial 0", "POST", "/api/v1/jobs", "client", {"json": job_body(n_trial=0)}, 422,
         ("n_trial",)),
        ("n_trial a string", "POST", "/api/v1/jobs", "client",
         {"json": job_body(n_trial="many")}, 422, ("n_trial",)),
        ("bad target", "POST", "/api/v1/jobs", "client",
         {"json": job_body(target="opencl model=x")}, 422, ("target", "model=x")),
        ("target a number", "POST", "/api/v1/jobs", "client",
         {"json": {**job_body(), "target": 42}}, 422, ("target",)),
        ("no tasks", "POST", "/api/v1/jobs", "client", {"json": {**job_body(), "tasks": []}},
         422, ("tasks",)),
        ("no target", "POST", "/api/v1/jobs", "client",
         {"json": {k: v for k, v in job_body().items() if k != "target"}}, 422, ("target",)),
        ("args not a list", "POST", "/api/v1/jobs", "client",
         {"json": {**job_body(), "tasks": [{"template": DENSE, "args": 5}]}}, 422,
         ("args",)),
        ("measure.number 0", "POST", "/api/v1/jobs", "client",
         {"json": job_body(measure={"number": 0})}, 422, ("measure.number",)),
        ("job id not a number", "GET", "/api/v1/jobs/abc", "client", {}, 422, ("job_id",)),
        ("unknown job", "GET", "/api/v1/jobs/99999", "client", {}, 404, ("99999",)),
        ("cancel unknown job", "POST", "/api/v1/jobs/99999/cancel", "client", {}, 404,
         ("99999",)),
        ("job id past INTEGER", "GET", f"/api/v1/jobs/{big}", "client", {}, 422,
         ("job_id",)),
        ("job id past 64 bits", "POST", f"/api/v1/jobs/{2**64}/cancel", "client", {}, 422,
         ("job_id",)),
        ("offset past INTEGER", "GET", f"/api/v1/jobs?offset={big**2}", "client", {}, 422,
         ("offset",)),
        ("register without a name", "POST", "/api/v1/workers", "worker",
         {"json": {"name": "", "target": FAKE_TARGET}}, 422, ("name",)),
        ("register with a bad target", "POST", "/api/v1/workers", "worker",
         {"json": {"name": "x", "target": "-x"}}, 422, ("target",)),
        ("register with a NUL in the name", "POST", "/api/v1/workers", "worker",
         {"json": {"name": "a\x00b", "target": FAKE_TARGET}}, 422, ("name", "control")),
        ("register with a newline in the device", "POST", "/api/v1/workers", "worker",
         {"json": {"name": "x", "target": FAKE_TARGET, "device": "a\nb"}}, 422,
         ("device", "control")),
        ("a 20 kB info", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": leased["trial_id"], "result": res,
                                "info": {"log": "x" * 20000}}]}}, 422, ("info",)),
        ("lease for an unknown worker", "POST", "/api/v1/workers/424242/lease", "admin",
         {"json": {"wait_s": 0}}, 404, ("worker 424242",)),
        ("lease for an unknown worker, own token", "POST", "/api/v1/workers/424242/lease",
         me, {"json": {"wait_s": 0}}, 403, (f"worker {wid}", "worker 424242")),
        ("heartbeat for an unknown worker", "POST", "/api/v1/workers/424242/heartbeat",
         "admin", {"json": {"trial_ids": []}}, 404, ("worker 424242",)),
        ("results for an unknown worker", "POST", "/api/v1/workers/424242/results", "admin",
         {"json": {"results": []}}, 404, ("worker 424242",)),
        ("release for an unknown worker", "POST", "/api/v1/workers/424242/release", "admin",
         {"json": {"trial_ids": []}}, 404, ("worker 424242",)),
        ("deregister an unknown worker", "DELETE", "/api/v1/workers/424242", "admin", {},
         404, ("worker 424242",)),
        ("worker id past INTEGER", "POST", f"/api/v1/workers/{big}/lease", me,
         {"json": {"wait_s": 0}}, 422, ("worker_id",)),
        ("results for a trial nobody leased", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": 424242, "result": res}]}}, 409,
         ("trial 424242 does not exist", "nothing stored")),
        ("heartbeat a trial nobody leased", "POST", f"{w}/heartbeat", me,
         {"json": {"trial_ids": [leased["trial_id"], 424242]}}, 409,
         ("trial 424242 does not exist", "nothing extended")),
        ("release a trial nobody leased", "POST", f"{w}/release", me,
         {"json": {"trial_ids": [leased["trial_id"], 424242]}}, 409,
         ("trial 424242 does not exist", "nothing released")),
        ("max_trials a string", "POST", f"{w}/lease", me,
         {"json": {"max_trials": "x"}}, 422, ("max_trials",)),
        ("max_trials 0", "POST", f"{w}/lease", me, {"json": {"max_trials": 0}}, 422,
         ("max_trials",)),
        ("wait_s too long", "POST", f"{w}/lease", me, {"json": {"wait_s": 3600}}, 422,
         ("wait_s",)),
        ("trial_ids not a list", "POST", f"{w}/heartbeat", me,
         {"json": {"trial_ids": "1"}}, 422, ("trial_ids",)),
        ("trial id past INTEGER", "POST", f"{w}/release", me,
         {"json": {"trial_ids": [big]}}, 422, ("trial_ids",)),
        ("trial_id a string", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": "abc", "result": res}]}}, 422, ("trial_id",)),
        ("result trial id past INTEGER", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": big, "result": res}]}}, 422, ("trial_id",)),
        ("result trial id past 64 bits", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": 2**64, "result": res}]}}, 422, ("trial_id",)),
        ("an infinite cost", "POST", f"{w}/results", me,
         {"content": nan_result.replace("NaN", "Infinity"), "headers": as_json}, 422,
         ("costs",)),
        ("error_no 42", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": leased["trial_id"],
                                "result": {**res, "error_no": 42}}]}}, 422, ("error_no",)),
        ("costs a string", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": leased["trial_id"],
                                "result": {**res, "costs": "fast"}}]}}, 422, ("costs",)),
        ("a NaN cost", "POST", f"{w}/results", me,
         {"content": nan_result, "headers": as_json}, 422, ("costs",)),
        ("a negative cost", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": leased["trial_id"],
                                "result": {**res, "costs": [-1.0]}}]}}, 422, ("costs",)),
        ("no result", "POST", f"{w}/results", me,
         {"json": {"results": [{"trial_id": leased["trial_id"]}]}}, 422, ("result",)),
        ("records limit a string", "GET", "/api/v1/records?limit=abc", "client", {}, 422,
         ("limit",)),
        ("best with a bad target", "POST", "/api/v1/records/best", "client",
         {"json": {"target": "", "workloads": [{"template": DENSE, "args": DENSE_ARGS}]}},
         422, ("target",)),
    ]
    wrong = []
    for what, method, path, role, kwargs, status, words in cases:
        response = api.call(method, path, role, **kwargs)
        try:
            detail = str(response.json().get("detail"))
        except (ValueError, AttributeError):
            detail = response.text
        if response.status_code != status or not all(w in detail for w in words):
            wrong.append(f"{what}: {response.status_code} {response.text[:300]} "
                         f"(want {status} naming {words})")
    assert not wrong, "\n".join(wrong)
    # nothing above was stored: one job, no record, the leased trial still leased
    assert [j["id"] for j in api.ok("GET", "/api/v1/jobs")] == [job_id]
    assert job_records(api.db, job_id) == []
    assert [t.status for t in job_trials(api.db, job_id)].count("leased") == 1
    # a timer that reads 0 would rank first for every device: refused (the rule records
    # import applies too); the tiniest real cost is stored and the job describes itself
    body = {"results": [{"trial_id": leased["trial_id"], "result": {
        "costs": [0.0], "error_no": 0, "all_cost": 0.1, "timestamp": 1.0}}]}
    zero = api.call("POST", f"/api/v1/workers/{wid}/results", json=body)
    assert zero.status_code == 422 and "> 0" in zero.json()["detail"], zero.text
    assert job_records(api.db, job_id) == []
    assert api.report(wid, leased["trial_id"], cost=1e-12)["accepted"] == 1
    assert api.call("GET", f"/api/v1/jobs/{job_id}").status_code == 200


@pytest.mark.parametrize("queue", QUEUES)
def test_cancel_stops_leasing(make_api: Callable[..., Api], queue: str) -> None:
    """Cancel: the job and its tasks are cancelled, queued trials are withdrawn and no
    worker leases another trial of it, even after further scheduler passes."""
    api = make_api(queue)
    job_id = api.submit(job_body(n_trial=9))
    wid = api.register("w")
    assert api.run_pass().planned == 9
    held = api.lease(wid, max_trials=2)
    assert len(held) == 2
    answer = api.ok("POST", f"/api/v1/jobs/{job_id}/cancel", role="client")
    assert answer == {"id": job_id, "status": "cancelled"}
    job = api.ok("GET", f"/api/v1/jobs/{job_id}", role="client")
    assert job["status"] == "cancelled"
    assert [t["status"] for t in job["tasks"]] == ["cancelled"]
    statuses = sorted(t.status for t in job_trials(api.db, job_id))
    assert statuses == ["cancelled"] * 7 + ["leased"] * 2
    assert api.metrics()["tuner_queue_depth"] == 0
    assert api.lease(wid, max_trials=9, wait_s=0.3) == []
    # a result measured before the cancel is kept; the job stays cancelled, nothing new
    assert api.report(wid, held[0]["trial_id"])["accepted"] == 1
    stats = api.run_pass()
    assert stats.planned == 0
    assert api.lease(wid, max_trials=9, wait_s=0.3) == []
    assert api.ok("GET", f"/api/v1/jobs/{job_id}")["status"] == "cancelled"
    # cancelling again, or a finished job, changes nothing
    assert api.ok("POST", f"/api/v1/jobs/{job_id}/cancel")["status"] == "cancelled"
    with Session(api.db) as session:
        assert session.scalar(select(JobRow.status).where(JobRow.id == job_id)) == "cancelled"


def test_metrics(make_api: Callable[..., Api]) -> None:
    """GET /metrics: queue depth, trials per second, lease expiries and live workers
    follow what happens."""
    api = make_api(lease_seconds=0.3)
    response = api.client.get("/metrics")
    assert response.status_code == 200
    for name in ("tuner_queue_depth", "tuner_trials_per_second", "tuner_lease_expiries_total",
                 "tuner_workers_alive"):
        assert f"# TYPE {name} " in response.text, name
    start = parse_metrics(response.text)
    assert (start["tuner_queue_depth"], start["tuner_trials_per_second"],
            start["tuner_lease_expiries_total"], start["tuner_workers_alive"]) == (0, 0, 0, 0)
    api.submit(job_body(n_trial=4))
    api.run_pass()
    assert api.metrics()["tuner_queue_depth"] == 4
    wid = api.register("w")
    assert api.metrics()["tuner_workers_alive"] == 1
    first, second = api.lease(wid, max_trials=2)
    assert api.metrics()["tuner_queue_depth"] == 2
    api.report(wid, first["trial_id"])
    assert api.metrics()["tuner_trials_per_second"] > 0
    time.sleep(max(second["lease_deadline"] - time.time(), 0) + 0.05)
    api.run_pass()  # the unreported lease expires and is requeued
    after = api.metrics()
    assert after["tuner_lease_expiries_total"] == 1
    assert after["tuner_queue_depth"] == 3
    assert after["tuner_records"] == 1 and not math.isnan(after["tuner_trials_per_second"])


def test_first_plan_starts_with_the_templates_default_config(
        make_api: Callable[..., Api]) -> None:
    """What an untuned build runs is always measured, so tuning never makes it slower."""
    api = make_api("sql")
    job_id = api.submit(job_body(n_trial=4))
    assert api.run_pass().planned == 4
    trials = job_trials(api.db, job_id)
    template = get_template(DENSE)
    workload = Workload(template=DENSE, args=DENSE_ARGS)
    assert trials[0].config_index == template.default_config(workload).index
    assert len({t.config_index for t in trials}) == 4


def test_early_stopping_ends_the_task_and_withdraws_its_plan(
        make_api: Callable[..., Api]) -> None:
    """early_stopping=2: after two trials that do not beat the best, the task is done
    before its budget and the rest of its queued plan is withdrawn."""
    api = make_api("sql")
    job_id = api.submit(job_body(n_trial=9, early_stopping=2))
    wid = api.register("w")
    assert api.run_pass().planned == 9
    for cost in (1e-5, 2e-5, 3e-5):  # the best first, then two that are worse
        [trial] = api.lease(wid)
        assert api.report(wid, trial["trial_id"], cost)["accepted"] == 1
    api.run_pass()
    job = api.ok("GET", f"/api/v1/jobs/{job_id}", role="client")
    assert job["status"] == "done", job
    assert job["tasks"][0]["trials_done"] == 3
    assert job["tasks"][0]["best_cost"] == pytest.approx(1e-5)
    statuses = sorted(t.status for t in job_trials(api.db, job_id))
    assert statuses == ["cancelled"] * 6 + ["done"] * 3
    assert api.lease(wid, wait_s=0) == []

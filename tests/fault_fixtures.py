"""Fault-injection harness: a redis-server and a PostgreSQL of our own on free ports in
a temp dir, a `tuner serve` process and `tuner worker` processes, each of which can be
SIGKILLed (or stopped in immediate mode) and started again on the same port. Only what
this module started is ever stopped: the shared servers on 5432/6379 are never touched.

The fault sequence (one job living through a worker kill, a server kill, a Redis kill
and a PostgreSQL immediate stop, each timed) is here too, so tests/test_faults.py asserts
on it and bench/faults.py prints its recovery times from the same code."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from server_fixtures import free_port, kill_group, make_tokens, migrate, wait_until
from server_fixtures import opencl_target as local_opencl_target
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from schemas import Record
from schemas.api import FINAL
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow

TUNER = Path(sys.executable).with_name("tuner")
# One conv on 4x4 images, 4 channels, 1x1 kernel: 18,000 configs, each kernel a PoCL
# compile of ~0.3 s cold and ~0.03 s from PoCL's cache; timed once, checked against numpy.
CONV = "conv2d_nchw.cuda"
CONV_ARGS: list[Any] = [["TENSOR", [1, 4, 4, 4], "float32"],
                        ["TENSOR", [4, 4, 1, 1], "float32"],
                        [1, 1], [0, 0, 0, 0], [1, 1], "float32"]
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs
FAST = {"number": 1, "repeat": 1, "min_repeat_ms": 0, "timeout_s": 20}


class Unavailable(RuntimeError):
    """A tool the harness needs is not installed: the caller skips, saying why."""


def _which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise Unavailable(f"{name} not found on PATH")
    return path


def pg_bindir() -> Path:
    """The newest /usr/lib/postgresql/*/bin with initdb and pg_ctl, else PATH's."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    for bindir in reversed(candidates):
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "pg_ctl").exists():
        return Path(initdb).resolve().parent
    raise Unavailable("PostgreSQL's initdb/pg_ctl not found (/usr/lib/postgresql/*/bin or "
                      "PATH): install postgresql")


def opencl_target() -> str:
    """The target OpenCL device 0 serves (what `tuner worker --device opencl:0` runs)."""
    if not TUNER.exists():
        raise Unavailable(f"the tuner command is not installed beside {sys.executable}")
    target, why = local_opencl_target()
    if target is None:
        raise Unavailable(why)
    return target


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None
           ) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


# --------------------------------------------------------------------------------------
# Redis

@dataclass
class RedisServer:
    """A redis-server of our own without persistence: a restart comes back empty, so
    every ticket it held is gone (the harshest Redis outage)."""

    directory: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.binary = _which("redis-server")
        self.log = self.directory / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        import redis

        try:
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except redis.RedisError:
            return False

    def start(self) -> None:
        self.proc = _spawn([self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                            "--dir", str(self.directory), "--save", "", "--appendonly", "no"],
                           self.log)
        wait_until(self.ping, 20, f"redis-server on port {self.port}",
                 diagnose=lambda: self.log.read_text(errors="replace")[-2000:])

    def kill(self) -> None:
        """SIGKILL: what an OOM killer or a crashed host does."""
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None


# --------------------------------------------------------------------------------------
# PostgreSQL

class PostgresServer:
    """initdb + pg_ctl in a temp dir, trust auth, listening on 127.0.0.1:<free port> and a
    socket in that dir. As root, every PostgreSQL command runs as an unprivileged user
    (``runuser``) who owns the dir (PostgreSQL refuses to run as root)."""

    def __init__(self) -> None:
        self.bindir = pg_bindir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tuner-faults-pg-"))
        self.data, self.sockets = self.root / "data", self.root / "sockets"
        self.sockets.mkdir()
        self.log = self.root / "postgres.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
            if user is None or shutil.which("runuser") is None:
                shutil.rmtree(self.root, ignore_errors=True)
                raise Unavailable("running as root needs runuser and a 'postgres' or "
                                  "'nobody' user to run PostgreSQL")
            entry = pwd.getpwnam(user)
            for path in (self.root, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            self._as = ["runuser", "-u", user, "--"]
        self.initialized = False

    def _run(self, *argv: str, timeout: float = 120, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self._as, *argv], capture_output=True, text=True, check=False,
                              timeout=timeout, cwd=self.root)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}"
                               f"{proc.stderr}\n{self.log_tail()}")
        return proc

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def start(self) -> None:
        if not self.initialized:
            self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                      "--auth=trust", "-E", "UTF8", "--no-sync")
            self.initialized = True
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.sockets} "
                   "-c fsync=off -c full_page_writes=off -c max_connections=200")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-o", options, "-w", "-t", "60", "start")

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: every backend dies, no checkpoint; the next start
        runs crash recovery."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                  "-w", "stop")

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        """Stop our server (only ours: its own data dir) and remove the dir."""
        if self.initialized and (self.data / "postmaster.pid").exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                      "-w", "stop", check=False)
            pid_file = self.data / "postmaster.pid"
            if pid_file.exists():  # pg_ctl failed: kill the postmaster it started
                try:
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
                except (ValueError, IndexError, ProcessLookupError, PermissionError):
                    pass
        shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# --------------------------------------------------------------------------------------
# The tuner's own processes

def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    return {**env, **extra}


@dataclass
class Fleet:
    """A `tuner serve` process on one database and queue, `tuner worker` processes on the
    local OpenCL device, and a reader of the database for the test's own checks."""

    directory: Path
    database_url: str
    queue_url: str = "sql"
    lease_s: float = 4.0
    port: int = field(default_factory=free_port)
    tokens: dict[str, str] = field(default_factory=dict)
    server: subprocess.Popen[bytes] | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        migrate(self.database_url)  # `tuner db upgrade`, in-process
        self.tokens = make_tokens(self.database_url)
        self.db: Engine = create_engine(self.database_url, poolclass=NullPool)
        self.env = _clean_env({
            "TUNER_DATABASE_URL": self.database_url, "TUNER_QUEUE_URL": self.queue_url,
            "TUNER_LEASE_SECONDS": str(self.lease_s), "TUNER_SCHEDULER_INTERVAL": "0.1",
            "XDG_DATA_HOME": str(self.directory / "xdg")})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = self.directory / f"{log_name}-{len(self._started)}.log"
        self._logs.append(log)
        proc = _spawn([str(TUNER), *argv], log, self.env)
        self._started.append(proc)
        return proc

    # -- the server ---------------------------------------------------------------------
    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def readyz(self) -> int | None:
        """/readyz's status code (200 ready, 503 a backend down); None: no answer."""
        try:
            return httpx.get(f"{self.url}/readyz", timeout=10).status_code
        except httpx.TransportError:
            return None

    def start_server(self) -> None:
        """`tuner serve` on this fleet's port (the same one after a kill); returns once
        /healthz answers."""
        self.server = self._spawn(["serve", "--port", str(self.port), "--database-url",
                                   self.database_url, "--queue-url", self.queue_url],
                                  "server")
        server = self.server

        def up() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"tuner serve exited with {server.returncode}\n"
                                     f"{self.logs()}")
            return self.healthy()

        wait_until(up, 60, "the server's /healthz", every=0.05, diagnose=self.logs)

    def kill_server(self) -> None:
        assert self.server is not None
        kill_group(self.server)

    # -- workers ------------------------------------------------------------------------
    def start_worker(self, name: str, batch: int = 1) -> subprocess.Popen[bytes]:
        """`tuner worker` with the fleet's worker token (it registers with it and uses the
        token bound to it that the answer hands back)."""
        proc = self._spawn(["worker", "--server", self.url, "--token", self.tokens["worker"],
                            "--device", "opencl:0", "--name", name, "--batch", str(batch)],
                           f"worker-{name}")
        self.workers[name] = proc
        return proc

    def kill_worker(self, name: str) -> None:
        kill_group(self.workers[name])

    def worker_id(self, name: str) -> int | None:
        with Session(self.db) as session:
            return session.scalar(select(WorkerRow.id).where(WorkerRow.name == name)
                                  .order_by(WorkerRow.id.desc()).limit(1))

    def wait_registered(self, *names: str, timeout: float = 90) -> None:
        def registered() -> bool:
            for name in names:
                proc = self.workers[name]
                if proc.poll() is not None:
                    raise AssertionError(f"worker {name} exited with {proc.returncode}\n"
                                         f"{self.logs()}")
            return all(self.worker_id(n) is not None for n in names)

        wait_until(registered, timeout, f"workers {', '.join(names)} to register", every=0.1,
                 diagnose=self.logs)

    def dead_workers(self) -> dict[str, int]:
        """Workers we did not kill that exited anyway: name -> exit code."""
        return {name: proc.returncode for name, proc in self.workers.items()
                if proc.poll() is not None and proc.returncode != -signal.SIGKILL}

    # -- the API ------------------------------------------------------------------------
    def client(self, role: str = "client") -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {self.tokens[role]}"})

    def submit(self, body: dict[str, Any]) -> int:
        with self.client() as client:
            response = client.post("/api/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    # -- the database, read directly (None while it is down) ----------------------------
    def read(self, query: Callable[[Session], Any]) -> Any:
        try:
            with Session(self.db) as session:
                return query(session)
        except OperationalError:
            return None

    def job_status(self, job_id: int) -> str | None:
        return self.read(lambda s: s.scalar(select(JobRow.status).where(JobRow.id == job_id)))

    def _follow(self, job_id: int, done: Callable[[], Any], what: str, stall_s: float) -> Any:
        """Poll ``done`` while the job keeps storing records; fail once it stored none
        for ``stall_s`` seconds (a stuck job fails fast, a slow machine does not)."""
        last, since = -1, time.monotonic()
        while True:
            value = done()
            if value:
                return value
            count = self.record_count(job_id)
            if count is not None and count != last:
                last, since = count, time.monotonic()
            if time.monotonic() - since > stall_s:
                raise AssertionError(f"waiting for {what}: job {job_id} stored no record "
                                     f"for {stall_s:g} s\n{self.describe(job_id)}")
            time.sleep(0.1)

    def wait_records(self, job_id: int, count: int, stall_s: float = 60) -> int:
        """Wait until the job has ``count`` records; returns how many it has."""
        return int(self._follow(job_id, lambda: (self.record_count(job_id) or 0) >= count
                                and self.record_count(job_id), f"{count} records", stall_s))

    def wait_job(self, job_id: int, stall_s: float = 60) -> str:
        """Wait until the job ends; returns its status."""
        return str(self._follow(job_id, lambda: (self.job_status(job_id) or "") in FINAL
                                and self.job_status(job_id), f"job {job_id} to end", stall_s))

    def trials(self, job_id: int) -> list[TrialRow]:
        return list(self.read(lambda s: s.scalars(
            select(TrialRow).join(TaskRow, TaskRow.id == TrialRow.task_id)
            .where(TaskRow.job_id == job_id).order_by(TrialRow.id)).all()) or [])

    def record_count(self, job_id: int) -> int | None:
        return self.read(lambda s: s.scalar(
            select(func.count()).select_from(RecordRow)
            .join(TrialRow, TrialRow.id == RecordRow.trial_id)
            .join(TaskRow, TaskRow.id == TrialRow.task_id).where(TaskRow.job_id == job_id)))

    def first_record_after(self, job_id: int, moment: float,
                           workers: set[str] | None = None) -> float | None:
        """When the server stored the job's first record after ``moment`` (epoch s),
        measured by one of ``workers`` when given."""
        after = datetime.fromtimestamp(moment, UTC)
        rows = self.read(lambda s: s.execute(
            select(RecordRow.created_at, RecordRow.line)
            .join(TrialRow, TrialRow.id == RecordRow.trial_id)
            .join(TaskRow, TaskRow.id == TrialRow.task_id)
            .where(TaskRow.job_id == job_id, RecordRow.created_at > after)
            .order_by(RecordRow.created_at)).all()) or []
        for created_at, line in rows:
            info = Record.from_json(line).info or {}
            if workers is None or info.get("worker") in workers:
                return _epoch(created_at)
        return None

    def recorded_at(self, trial_ids: list[int]) -> float | None:
        """When the last of these trials was recorded; None until all of them are."""
        row = self.read(lambda s: s.execute(
            select(func.count(), func.max(RecordRow.created_at))
            .where(RecordRow.trial_id.in_(trial_ids))).one())
        return _epoch(row[1]) if row is not None and row[0] == len(trial_ids) else None

    def records(self, job_id: int) -> list[tuple[int, Record]]:
        """(trial id, record) of every record a trial of the job produced."""
        rows = self.read(lambda s: s.execute(
            select(RecordRow.trial_id, RecordRow.line)
            .join(TrialRow, TrialRow.id == RecordRow.trial_id)
            .join(TaskRow, TaskRow.id == TrialRow.task_id)
            .where(TaskRow.job_id == job_id).order_by(RecordRow.id)).all()) or []
        return [(int(t), Record.from_json(line)) for t, line in rows]

    def describe(self, job_id: int) -> str:
        trials = self.trials(job_id)
        statuses = Counter(t.status for t in trials)
        return (f"job {job_id}: {self.job_status(job_id)}, {len(trials)} trials {dict(statuses)}"
                f", {self.record_count(job_id)} records\n{self.logs()}")

    def logs(self, tail: int = 2500) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in self._logs if p.exists())

    def close(self) -> None:
        for proc in self._started:
            kill_group(proc)
        self.db.dispose()


def _epoch(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    if moment.tzinfo is None:  # SQLite hands back naive UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def assert_exactly_once(fleet: Fleet, job_id: int, n_trial: int) -> list[tuple[int, Record]]:
    """Every trial of the job is done and has exactly one record, every config was
    measured once: nothing lost, nothing twice. Returns the records."""
    trials = fleet.trials(job_id)
    records = fleet.records(job_id)
    assert len(trials) == n_trial, f"{len(trials)} trials planned for {n_trial}"
    not_done = [(t.id, t.status) for t in trials if t.status != "done"]
    assert not not_done, f"trials not done: {not_done[:20]}"
    assert len(records) == n_trial, f"{len(records)} records for {n_trial} trials"
    per_trial = Counter(t for t, _ in records)
    assert max(per_trial.values()) == 1, f"trials recorded twice: {per_trial.most_common(5)}"
    assert set(per_trial) == {t.id for t in trials}
    per_config = Counter((r.workload.key, r.config.index) for _, r in records)
    assert max(per_config.values()) == 1, f"configs recorded twice: {per_config.most_common(5)}"
    return records


# --------------------------------------------------------------------------------------
# The fault sequence

@dataclass
class FaultTiming:
    """One fault: when it hit, how long the component was down, and how long after it
    came back the job stored its next record."""

    fault: str
    records_before: int
    outage_s: float
    recovery_s: float
    note: str = ""
    ready_during: int | None = None  # /readyz's status while it was down (None: no answer)
    ready_after: int | None = None  # ... once the job stored its next record


@dataclass
class FaultCluster:
    """Our own PostgreSQL and Redis under one fleet."""

    postgres: PostgresServer
    redis: RedisServer
    fleet: Fleet


@contextmanager
def fault_cluster(directory: Path, lease_s: float = 4.0) -> Iterator[FaultCluster]:
    """PostgreSQL + Redis of our own, migrated, with a server running (no workers yet);
    every process it started is killed and the PostgreSQL dir removed on the way out,
    also when starting failed half-way. Unavailable (nothing started) when redis-server
    or PostgreSQL is not installed."""
    redis = RedisServer(directory)
    postgres = PostgresServer()
    fleet: Fleet | None = None
    try:
        postgres.start()
        redis.start()
        fleet = Fleet(directory, postgres.create_database("tuner"), redis.url,
                      lease_s=lease_s)
        fleet.start_server()
        yield FaultCluster(postgres, redis, fleet)
    finally:
        try:
            if fleet is not None:
                fleet.close()
        finally:
            try:
                redis.kill()
            finally:
                postgres.close()


def fault_job(n_trial: int, plan_size: int, target: str) -> dict[str, Any]:
    return {"target": target, "tasks": [{"template": CONV, "args": CONV_ARGS}],
            "n_trial": n_trial, "tuner": "random", "plan_size": plan_size, "measure": FAST,
            "verify_top": 0}  # exactly n_trial trials, each once


def run_fault_sequence(cluster: FaultCluster, target: str, n_trial: int = 200,
                       plan_size: int = 32, workers: int = 2, batch: int = 2,
                       log: Callable[[str], None] = lambda _line: None
                       ) -> tuple[int, list[FaultTiming]]:
    """One job of ``n_trial`` trials lives through, in turn and each after a fifth of it
    is recorded: (a) every worker SIGKILLed while holding a lease (new ones started),
    (b) the server SIGKILLed and restarted, (c) Redis SIGKILLed when a plan is due and
    restarted empty, (d) PostgreSQL stopped in immediate mode and restarted. Returns the
    job id (ended or not: the caller checks) and each fault's timing."""
    fleet, timings = cluster.fleet, []
    names = [f"w{i}" for i in range(workers)]
    for name in names:
        fleet.start_worker(name, batch)
    fleet.wait_registered(*names)
    job_id = fleet.submit(fault_job(n_trial, plan_size, target))
    submitted = time.time()
    step = n_trial // 5

    def progress_to(count: int) -> int:
        return fleet.wait_records(job_id, count)

    def recovered(fault: str, before: int, hit: float, back: float, note: str = "",
                  first: float | None = None, ready_during: int | None = None) -> None:
        if first is None:
            first = wait_until(lambda: fleet.first_record_after(job_id, back), 60,
                             f"a record after {fault}", every=0.1,
                             diagnose=lambda: fleet.describe(job_id))
        timing = FaultTiming(fault, before, back - hit, first - back, note, ready_during,
                             fleet.readyz())
        timings.append(timing)
        log(f"{time.time() - submitted:5.1f} s: {fault}: at {before} records, down "
            f"{timing.outage_s:.1f} s, recovered {timing.recovery_s:.2f} s after it came "
            f"back{'; ' + note if note else ''}")

    # (a) workers SIGKILLed mid-lease
    before = progress_to(step)
    ids = {fleet.worker_id(n) for n in names}

    def holding() -> list[int]:
        trials = fleet.trials(job_id)
        held = {t.worker_id for t in trials if t.status == "leased"}
        return [t.id for t in trials if t.status == "leased"] if ids <= held else []

    lost = wait_until(holding, 30, "every worker to hold a lease", every=0.02,
                    diagnose=lambda: fleet.describe(job_id))
    hit = time.time()
    for name in names:
        fleet.kill_worker(name)
    names = [f"w{i}" for i in range(workers, 2 * workers)]
    for name in names:
        fleet.start_worker(name, batch)
    # a result already on the wire may still land: recovery is the first record of a
    # new worker; the trials the killed ones held come back when their leases run out
    first = wait_until(lambda: fleet.first_record_after(job_id, hit, set(names)), 60,
                     "a record from the new workers", every=0.1,
                     diagnose=lambda: fleet.describe(job_id))
    recovered("workers SIGKILLed", before, hit, hit, first=first)
    killed_at = hit

    # (b) the server SIGKILLed and restarted on the same port
    before = progress_to(2 * step)
    hit = time.time()
    fleet.kill_server()
    fleet.start_server()
    recovered("server SIGKILLed", before, hit, time.time())

    # (c) Redis SIGKILLed when the scheduler is about to plan, restarted empty
    before = progress_to(3 * step)

    def plan_due() -> bool:
        trials = fleet.trials(job_id)
        outstanding = sum(t.status in ("queued", "leased") for t in trials)
        return (len(trials) < n_trial and outstanding <= plan_size
                and any(t.status == "leased" for t in trials))

    try:
        wait_until(plan_due, 30, "a plan to be due", every=0.02)
    except AssertionError:
        pass  # kill it anyway: its restart still empties the queue
    planned = len(fleet.trials(job_id))
    hit = time.time()
    cluster.redis.kill()
    try:  # down until the scheduler planned without it (or 6 s)
        wait_until(lambda: len(fleet.trials(job_id)) > planned, 6, "a plan", every=0.05)
    except AssertionError:
        pass
    time.sleep(max(0.0, hit + 2.0 - time.time()))
    without = len(fleet.trials(job_id)) - planned
    ready = fleet.readyz()
    cluster.redis.start()
    recovered("Redis SIGKILLed", before, hit, time.time(),
              f"{without} trials planned while it was down", ready_during=ready)

    # (d) PostgreSQL stopped in immediate mode and restarted
    before = progress_to(4 * step)
    hit = time.time()
    cluster.postgres.stop_immediate()
    time.sleep(3.0)
    ready = fleet.readyz()
    cluster.postgres.start()
    recovered("PostgreSQL stopped (immediate)", before, hit, time.time(), ready_during=ready)
    again = wait_until(lambda: fleet.recorded_at(lost), 120, "the killed workers' trials",
                     every=0.1, diagnose=lambda: fleet.describe(job_id))
    timings[0].note = (f"the {len(lost)} trials they held: all recorded by "
                       f"{again - killed_at:.1f} s after the kill")
    log(f"workers SIGKILLed: {timings[0].note}")
    return job_id, timings

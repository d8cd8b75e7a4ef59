"""Server dispatch throughput and best-record lookup latency, against a real server.

Starts ``tuner serve`` as a subprocess on 127.0.0.1 with a fresh database, submits a job
whose tasks (ResNet-50 convolutions, ``conv2d_nchw.cuda``) have spaces far larger than
the run can use, and drives it with N simulated workers: each loops lease (B trials)
-> POST results with a fixed fake cost; no kernel is built or run. Then, on another
fresh database holding ``--records`` records (1,000 workloads, several device models),
times the best-record lookup (``TunerClient.best``) for one workload per request.

    .venv/bin/python bench/server.py                        # both backends, defaults
    .venv/bin/python bench/server.py --backends sqlite --workers 8 --batch 32 --seconds 20

Backends: ``sqlite`` = SQLite file + the SQL queue; ``postgres`` = PostgreSQL (a new
database ``bench_<hex>`` on postgresql+psycopg://postgres@127.0.0.1:5432, dropped at the
end) + the Redis Streams queue (redis://127.0.0.1:6379/0, keys under a random prefix,
deleted at the end).

What is measured:
  dispatched/s  trials handed out by lease calls that completed inside the window
  recorded/s    trials accepted by results calls that completed inside the window
  lease/results p50/p99  client-side latency of each HTTP call (loopback, keep-alive),
                lease calls that came back empty (queue drained) included
  best p50/p99  client-side latency of one best-record lookup, one workload each,
                half the requests answered by the device-model rule, half by the
                target-key rule (no record for that model); each paired with the same
                request on a bare keep-alive HTTP/1.1 connection (the endpoint's own
                latency, printed beside it)

Every call goes through ``tuner_client`` (the one REST client): the latencies include
its pydantic encoding and parsing, as every real client's do.

The load generator (worker processes) runs on the same machine as the server and the
database, so on a 2-core box they compete for the same CPUs: the figures are a floor.

``--load`` (PostgreSQL + Redis only; the phases above are not run): ``--load-workers``
(1,000) simulated workers, a quarter on each of 4 targets with a job each, long-poll
(``wait_s`` ``--load-wait``, ``max_trials`` ``--load-batch``), sleep ``--load-measure-s``
a trial in place of measuring, report synthetic costs, for ``--load-seconds`` (60) after
the ramp and warm-up. asyncio in ``--load-procs`` processes, one keep-alive HTTP/1.1
connection per worker written by hand (httpx's shared pool costs O(workers) per call);
request bodies have the ``schemas.api`` models' wire shape and go to
``TunerClient.url_of`` routes, as tuner_client's do, but not through its sync client.
Printed: dispatch and record rates, lease and results p50/p99, error rate, trials
leased twice at once (a lease of a trial another unexpired lease held, or of a trial
whose result was accepted) and lost results (accepted, but no record in the database
after the run); each must be 0 (the exit status is 1 otherwise); CPU of the server
processes and of the load generator over the window, from /proc, in cores and per call
(the dispatch phase prints the server's too).

    .venv/bin/python bench/server.py --load                              # 1,000 x 60 s
    .venv/bin/python bench/server.py --load --load-workers 200 --load-seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from schemas import MeasureErrorNo, MeasureResult, Target, Workload
from schemas.api import (
    BestRequest,
    JobRequest,
    LeaseAnswer,
    LeaseRequest,
    Registered,
    Results,
    TrialResult,
    WorkerRegistration,
)
from tuner_client import ApiError, TunerClient

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TUNER = str(BIN / "tuner")

PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
REDIS_URL = "redis://127.0.0.1:6379/0"

UVICORN_WORKERS = [0]  # --uvicorn-workers
TARGET_TRIALS_PER_S = 2000.0  # the targets, PostgreSQL + Redis
# best-lookup p99 by the records stored: <= 5 ms at 100,000, <= 10 ms at 1,000,000
TARGET_BEST_P99_MS = {100_000: 5.0, 1_000_000: 10.0}


def best_target_ms(n_records: int) -> float:
    """The issue's p99 bound for a lookup over ``n_records`` (the nearest size it names at
    or above, the largest past them)."""
    sizes = sorted(TARGET_BEST_P99_MS)
    return TARGET_BEST_P99_MS[next((n for n in sizes if n_records <= n), sizes[-1])]

JOB_TARGET = "opencl -model=pocl-cpu"
TEMPLATE = "conv2d_nchw.cuda"
# (in channels, height = width, out channels, stride): ResNet-50's 3x3 convolutions
LAYERS = [(64, 56, 64, 1), (128, 28, 128, 1), (256, 14, 256, 1), (512, 7, 512, 1),
          (128, 56, 128, 2), (256, 28, 256, 2), (512, 14, 512, 2), (64, 56, 64, 2)]

# Records for the best lookup: (target string, device model) of the records ...
RECORD_TARGETS = ["cuda -model=h200 -arch=sm_90", "cuda -model=a100 -arch=sm_80",
                  "cuda -model=t4 -arch=sm_75", "rocm -model=mi300x",
                  "opencl -model=pocl-cpu", "llvm -model=xeon"]
# ... and the targets asked: a model that has records (model rule) or one that has none
# (falls back to the target's keys: cuda -> "cuda" then "gpu", vulkan -> "gpu").
QUERY_MODEL = ["cuda -model=h200", "cuda -model=a100", "rocm -model=mi300x",
               "opencl -model=pocl-cpu", "llvm -model=xeon"]
QUERY_KEY = ["cuda -model=l4", "cuda -model=rtx4090", "vulkan -model=arc",
             "opencl -model=mali", "llvm -model=epyc"]


def conv_args(c: int, hw: int, co: int, stride: int, batch: int = 1) -> list[Any]:
    return [["TENSOR", [batch, c, hw, hw], "float32"], ["TENSOR", [co, c, 3, 3], "float32"],
            [stride, stride], [1, 1, 1, 1], [1, 1], "float32"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(q / 100 * (len(values) - 1))))
    return values[k]


# --------------------------------------------------------------------- environments

@contextmanager
def database(backend: str, workdir: Path) -> Iterator[tuple[str, str]]:
    """(database url, queue url) of a fresh database; removed afterwards."""
    if backend == "sqlite":
        path = workdir / f"bench-{secrets.token_hex(4)}.db"
        try:
            yield f"sqlite:///{path}", "sql"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    import psycopg

    name = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.format(name=name), REDIS_URL
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare(url: str) -> dict[str, str]:
    """Migrate the schema and create one token per role."""
    env = dict(os.environ, TUNER_DATABASE_URL=url)
    subprocess.run([TUNER, "db", "upgrade"], env=env, check=True, capture_output=True)
    tokens = {}
    for role in ("admin", "client", "worker"):
        out = subprocess.run([TUNER, "token", "create", "--role", role], env=env, check=True,
                             capture_output=True, text=True).stdout
        tokens[role] = out.strip().splitlines()[-1]
    return tokens


def wait_answering(proc: subprocess.Popen[bytes], base: str, log: Path, timeout_s: float,
                   what: str = "server") -> None:
    """Return once the server ``proc`` started at ``base`` answers its health check;
    raise (pointing at ``log``) if it exits or stays silent ``timeout_s``."""
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log}")
        try:
            with TunerClient(base, timeout=1, retries=0) as probe:
                probe.health()
            return
        except ApiError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"{what} did not answer within {timeout_s:g} s; see {log}")
        time.sleep(0.2)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process started with ``start_new_session`` and its group, SIGKILL after
    20 s; reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


@contextmanager
def server(url: str, queue_url: str, log: Path, extra_env: dict[str, str] | None = None,
           serve_args: list[str] | None = None) -> Iterator[str]:
    port = free_port()
    prefix = f"bench-{secrets.token_hex(4)}"
    env = dict(os.environ, TUNER_REDIS_PREFIX=prefix, **(extra_env or {}))
    cmd = [TUNER, "serve", "--host", "127.0.0.1", "--port", str(port),
           "--database-url", url, "--queue-url", queue_url, *(serve_args or [])]
    if UVICORN_WORKERS[0] > 1:  # several server processes on one port (PostgreSQL)
        cmd += ["--workers", str(UVICORN_WORKERS[0])]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_answering(proc, base, log, 60)
        yield base
    finally:
        stop_group(proc)
        if queue_url.startswith("redis://"):
            import redis

            r = redis.Redis.from_url(queue_url)
            keys = list(r.scan_iter(f"{prefix}:*", count=1000))
            if keys:
                r.delete(*keys)


def metrics(base: str) -> dict[str, float]:
    """The server's Prometheus counters (not part of the REST API)."""
    answer = httpx.get(f"{base}/metrics", timeout=60)
    if answer.status_code != 200:  # e.g. 503: the database refused the server's connection
        raise SystemExit(f"{base}/metrics answered {answer.status_code}: {answer.text[:300]}")
    text = answer.text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


# ------------------------------------------------------------------------- dispatch

def worker_proc(base: str, token: str, names: list[str], batch: int, t_stop: float,
                cost: float, out: Any) -> None:
    """One process running ``len(names)`` simulated workers as threads; sends back
    [(kind, t_end, latency_s, trials)] per call."""
    log: list[tuple[str, float, float, int]] = []
    lock = threading.Lock()
    errors: list[str] = []

    def run(name: str) -> None:
        mine: list[tuple[str, float, float, int]] = []
        with TunerClient(base, token, timeout=60, retries=0) as api:
            step = "register"
            try:
                registered = api.register_worker(
                    WorkerRegistration(name=name, target=Target.parse(JOB_TARGET),
                                       device=None))
                wid = registered.id
                api.use_token(registered.token)  # the worker's own
                while time.time() < t_stop:
                    step = "lease"
                    t0 = time.perf_counter()
                    trials = api.lease(wid, max_trials=batch, wait_s=0.5).trials
                    t1 = time.perf_counter()
                    mine.append(("lease", time.time(), t1 - t0, len(trials)))
                    if not trials:
                        continue
                    result = MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR,
                                           all_cost=0.0, timestamp=time.time())
                    results = [TrialResult(trial_id=t.trial_id, result=result, info={})
                               for t in trials]
                    step = "results"
                    t0 = time.perf_counter()
                    accepted = api.report_results(wid, results).accepted
                    t1 = time.perf_counter()
                    mine.append(("results", time.time(), t1 - t0, accepted))
            except ApiError as err:
                errors.append(f"{step} {err.status} {err.detail[:200]}")
        with lock:
            log.extend(mine)

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.send((log, errors))
    out.close()


@dataclass
class DispatchResult:
    dispatched_s: float
    recorded_s: float
    lease_ms: tuple[float, float]
    results_ms: tuple[float, float]
    empty_leases: int
    server_leased_s: float
    server_recorded_s: float
    server_cores: float  # CPU of the server processes over the window, from /proc
    calls: int  # lease and results calls completed in the window
    errors: list[str] = field(default_factory=list)


def run_dispatch(base: str, tokens: dict[str, str], args: argparse.Namespace) -> DispatchResult:
    job = JobRequest(target=Target.parse(JOB_TARGET), n_trial=args.n_trial, tuner="random",
                     plan_size=args.plan_size, early_stopping=None,
                     tasks=[Workload(template=TEMPLATE, args=tuple(conv_args(*layer)))
                            for layer in LAYERS[:args.tasks]])
    with TunerClient(base, tokens["admin"], timeout=60, retries=0) as admin:
        admin.submit_job(job)
    # let the scheduler fill the queue before the workers start
    deadline = time.time() + 30
    while time.time() < deadline:
        if metrics(base).get("tuner_queue_depth", 0) >= min(args.plan_size, 64):
            break
        time.sleep(0.2)
    t_start = time.time() + 1.0  # worker processes start and register in this second
    t_measure = t_start + args.warmup
    t_end = t_measure + args.seconds
    names = [f"sim-{i}" for i in range(args.workers)]
    procs_n = max(1, min(args.procs, args.workers))
    groups = [names[i::procs_n] for i in range(procs_n)]
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for group in groups:
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=worker_proc, args=(base, tokens["worker"], group, args.batch,
                                                  t_end, args.cost, send), daemon=True)
        p.start()
        send.close()
        pipes.append(recv)
        procs.append(p)
    # server-side counters (and the server's CPU) at the window's edges, as a cross-check
    server_pids = _server_pids(int(base.rsplit(":", 1)[1]))
    while time.time() < t_measure:
        time.sleep(0.01)
    m0, tm0, cpu0 = metrics(base), time.time(), _cpu_s(server_pids)
    while time.time() < t_end:
        time.sleep(0.01)
    m1, tm1, cpu1 = metrics(base), time.time(), _cpu_s(server_pids)
    log: list[tuple[str, float, float, int]] = []
    errors: list[str] = []
    for recv, p in zip(pipes, procs):
        if recv.poll(args.seconds + args.warmup + 120):
            part, errs = recv.recv()
            log += part
            errors += errs
        p.join(30)
        if p.is_alive():
            p.kill()
    window = [e for e in log if t_measure <= e[1] < t_end]
    leases = [e for e in window if e[0] == "lease"]
    results = [e for e in window if e[0] == "results"]
    lease_lat = [e[2] * 1e3 for e in leases]
    res_lat = [e[2] * 1e3 for e in results]
    span = tm1 - tm0
    return DispatchResult(
        dispatched_s=sum(e[3] for e in leases) / args.seconds,
        recorded_s=sum(e[3] for e in results) / args.seconds,
        lease_ms=(pct(lease_lat, 50), pct(lease_lat, 99)),
        results_ms=(pct(res_lat, 50), pct(res_lat, 99)),
        empty_leases=sum(1 for e in leases if e[3] == 0),
        server_leased_s=(m1["tuner_trials_leased_total"] - m0["tuner_trials_leased_total"]) / span,
        server_recorded_s=(m1["tuner_trials_recorded_total"]
                           - m0["tuner_trials_recorded_total"]) / span,
        server_cores=(cpu1 - cpu0) / span, calls=len(leases) + len(results), errors=errors)


# ---------------------------------------------------------------------- best lookup

def record_workloads(n: int) -> list[list[Any]]:
    """``n`` distinct conv2d workloads (batch x channels x size x stride)."""
    out = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128):
        for c in (16, 32, 64, 96, 128, 192, 256, 384, 512, 1024):
            for hw in (7, 14, 28, 56, 112):
                for stride in (1, 2):
                    for co_mul in (1, 2):
                        out.append(conv_args(c, hw, c * co_mul, stride, batch))
                        if len(out) == n:
                            return out
    raise ValueError(f"at most {len(out)} workloads")


def fill_records(url: str, n_records: int, n_workloads: int, seed: int = 0,
                 make_workloads: Callable[[int], list[list[Any]]] | None = None
                 ) -> dict[str, Any]:
    """Insert ``n_records`` records straight into the database (services.records) over
    ``make_workloads(n_workloads)`` (default ``record_workloads``)."""
    from sqlalchemy import func, select

    from compiler.templates import get_template
    from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target, Workload
    from tuner_server.db.models import RecordRow
    from tuner_server.db.session import make_engine, session_factory
    from tuner_server.services.records import add_records

    rng = random.Random(seed)
    template = get_template(TEMPLATE)
    workloads = [Workload(template=TEMPLATE, args=tuple(a))
                 for a in (make_workloads or record_workloads)(n_workloads)]
    targets = [Target.parse(t) for t in RECORD_TARGETS]
    configs: dict[str, list[Config]] = {}
    for w in workloads:
        space = template.space(w)
        configs[w.key] = [space.sample(rng) for _ in range(4)]
    engine = make_engine(url)
    sessions = session_factory(engine)
    t0 = time.time()
    chunk: list[Record] = []
    done = 0
    with sessions() as session:
        for i in range(n_records):
            w = workloads[i % len(workloads)]
            bad = rng.random() < 0.1
            result = MeasureResult(
                costs=(1e9,) if bad else (rng.uniform(1e-5, 1e-2),),
                error_no=MeasureErrorNo.RUNTIME_DEVICE if bad else MeasureErrorNo.NO_ERROR,
                all_cost=0.5, timestamp=1.7e9 + i)
            chunk.append(Record(target=rng.choice(targets), workload=w,
                                config=rng.choice(configs[w.key]), result=result))
            if len(chunk) == 5000:
                done += add_records(session, chunk)
                session.commit()
                chunk = []
        done += add_records(session, chunk)
        session.commit()
        count = session.scalar(select(func.count()).select_from(RecordRow))
    if engine.dialect.name == "postgresql":
        # as autovacuum leaves a table in service: statistics, and the visibility map
        # that lets a lookup read its candidates from the index alone (a table loaded in
        # one go has none until autovacuum comes round); and the load's dirty pages
        # written out, not by a checkpoint in the middle of the timed requests
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE records")
            conn.exec_driver_sql("CHECKPOINT")
    engine.dispose()
    return {"inserted": done, "count": count, "seconds": time.time() - t0,
            "workloads": [w.args_json() for w in workloads]}


def run_best(base: str, token: str, workloads: list[list[Any]], n_requests: int,
             seed: int = 1) -> dict[str, Any]:
    """Single lookups through ``TunerClient.best`` (p50, p99: what a client sees, its
    own encoding and parsing included), each paired with the same request on a bare
    keep-alive HTTP/1.1 connection (``endpoint_p50``, ``endpoint_p99``: the endpoint's
    own latency, its body encoded before the clock starts), the pair's order
    alternating; the bare answer must name the rule the client's did."""
    rng = random.Random(seed)
    lat: list[float] = []
    bare: list[float] = []
    rules: dict[str, int] = {}
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    with TunerClient(base, token, timeout=60, retries=0) as api:
        path = urlsplit(api.url_of("records/best")).path
        for i in range(n_requests + 50):  # the first 50 warm up
            target = rng.choice(QUERY_MODEL if i % 2 == 0 else QUERY_KEY)
            workload = Workload(template=TEMPLATE, args=tuple(rng.choice(workloads)))
            body = BestRequest(target=target, workloads=[workload]).model_dump_json()
            seconds: dict[str, float] = {}
            for how in (("client", "bare") if i % 2 == 0 else ("bare", "client")):
                t0 = time.perf_counter()
                if how == "client":
                    (item,) = api.best(target, [workload])
                else:
                    conn.request("POST", path, body, headers)
                    answer = conn.getresponse()
                    raw = answer.read()
                seconds[how] = time.perf_counter() - t0
            if answer.status != 200 or json.loads(raw)["items"][0]["rule"] != item.rule:
                raise SystemExit(f"records/best answered {answer.status} on a bare "
                                 f"connection: {raw[:300]!r}")
            if i >= 50:
                lat.append(seconds["client"] * 1e3)
                bare.append(seconds["bare"] * 1e3)
                rule = item.rule
                kind = "none" if rule == "none" else rule.split(":")[0]
                rules[kind] = rules.get(kind, 0) + 1
    conn.close()
    return {"p50": pct(lat, 50), "p99": pct(lat, 99), "mean": statistics.fmean(lat),
            "endpoint_p50": pct(bare, 50), "endpoint_p99": pct(bare, 99),
            "n": len(lat), "rules": rules}


# ------------------------------------------------- best for many workloads at once

def many_workloads(n: int) -> list[list[Any]]:
    """``n`` distinct conv2d workloads, past ``record_workloads``'s 1,600: batch sizes
    1..n/100 over 10 channel counts x 5 sizes x 2 strides."""
    out = []
    for batch in range(1, n // 100 + 2):
        for c in (16, 32, 64, 96, 128, 192, 256, 384, 512, 1024):
            for hw in (7, 14, 28, 56, 112):
                for stride in (1, 2):
                    out.append(conv_args(c, hw, c, stride, batch))
                    if len(out) == n:
                        return out
    raise AssertionError("unreachable: the loops make more than n")


def run_best_batch(base: str, token: str, workloads: list[list[Any]],
                   repeats: int) -> dict[str, Any]:
    """Seconds of one records/best request naming every workload, client-side
    (the client's encoding and parsing included), for a model with records (model
    rule) and one without (target-key rule); each the median of ``repeats`` after one
    warm-up."""
    asked = [Workload(template=TEMPLATE, args=tuple(a)) for a in workloads]
    out: dict[str, Any] = {"workloads": len(asked)}
    with TunerClient(base, token, timeout=600, retries=0) as api:
        for label, target in (("model", QUERY_MODEL[0]), ("key", QUERY_KEY[0])):
            times = []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                items = api.best(target, asked)
                if i:
                    times.append(time.perf_counter() - t0)
            found = sum(1 for item in items if item.record is not None)
            out[label] = {"s": statistics.median(times), "found": found}
    return out


def bench_best_batch(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The batch phase: ``--batch-records`` records over ``--batch-workloads`` workloads
    (10 a workload by default), every workload asked in one request."""
    log = workdir / f"server-{backend}.log"
    workloads = many_workloads(args.batch_workloads)
    with database(backend, workdir) as (url, queue_url):
        tokens = prepare(url)
        filled = fill_records(url, args.batch_records, args.batch_workloads,
                              make_workloads=many_workloads)
        with server(url, queue_url, log, {"TUNER_RUN_SCHEDULER": "false"},
                    list(args.serve_arg or [])) as base:
            result = run_best_batch(base, tokens["client"], workloads, args.batch_repeats)
    result["records"] = filled["count"]
    print(f"  [{backend}] best for {result['workloads']} workloads in one request "
          f"({result['records']} records): model rule {result['model']['s']:.2f} s "
          f"({result['model']['found']} found), target-key rule {result['key']['s']:.2f} s "
          f"({result['key']['found']} found)", flush=True)
    return result


# ------------------------------------------ before/after: two servers, one database

def run_best_ab(bases: dict[str, str], token: str, workloads: list[list[Any]],
                n_requests: int, seed: int = 1) -> dict[str, dict[str, float]]:
    """``run_best``'s single lookups, each asked of every server in turn (the order
    alternating), so that both see the same load: p50/p99 ms per server."""
    rng = random.Random(seed)
    lat: dict[str, list[float]] = {name: [] for name in bases}
    clients = {name: TunerClient(base, token, timeout=60, retries=0)
               for name, base in bases.items()}
    try:
        for i in range(n_requests + 50):  # the first 50 warm up
            target = rng.choice(QUERY_MODEL if i % 2 == 0 else QUERY_KEY)
            workload = Workload(template=TEMPLATE, args=tuple(rng.choice(workloads)))
            order = list(clients) if i % 2 == 0 else list(reversed(clients))
            for name in order:
                t0 = time.perf_counter()
                clients[name].best(target, [workload])
                if i >= 50:
                    lat[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        for client in clients.values():
            client.close()
    return {name: {"p50": pct(v, 50), "p99": pct(v, 99)} for name, v in lat.items()}


def run_batch_ab(bases: dict[str, str], token: str, workloads: list[list[Any]],
                 repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of one ``TunerClient.best`` call naming every workload (the client sends
    MAX_BEST_WORKLOADS a request), per server and rule, servers taking turns; the first
    call of each (a cold server) is kept apart as ``cold``."""
    asked = [Workload(template=TEMPLATE, args=tuple(a)) for a in workloads]
    out: dict[str, dict[str, list[float]]] = {name: {} for name in bases}
    for i in range(repeats + 1):
        names = list(bases) if i % 2 == 0 else list(reversed(bases))
        for name in names:
            with TunerClient(bases[name], token, timeout=600, retries=0) as api:
                for label, target in (("model", QUERY_MODEL[0]), ("key", QUERY_KEY[0])):
                    t0 = time.perf_counter()
                    api.best(target, asked)
                    key = f"{label} cold" if i == 0 else label
                    out[name].setdefault(key, []).append(time.perf_counter() - t0)
    return out


def bench_best_ab(backend: str, args: argparse.Namespace, workdir: Path) -> None:
    """Phase ab: single lookups at ``--records`` records over ``--workloads`` workloads,
    then ``--batch-workloads`` workloads in one client call over ``--batch-records``
    records, each database served by this tree ("after") and by the packages under
    ``--baseline`` ("before", put first on PYTHONPATH), requests alternating."""
    log = workdir / f"server-{backend}.log"
    sides = {"after": {"TUNER_RUN_SCHEDULER": "false"},
             "before": {"TUNER_RUN_SCHEDULER": "false", "PYTHONPATH": args.baseline}}
    for phase, n_records, n_workloads, make in (
            ("single", args.records, args.workloads, record_workloads),
            ("batch", args.batch_records, args.batch_workloads, many_workloads)):
        with database(backend, workdir) as (url, queue_url), ExitStack() as stack:
            tokens = prepare(url)
            filled = fill_records(url, n_records, n_workloads, make_workloads=make)
            bases = {name: stack.enter_context(server(url, queue_url, log, env))
                     for name, env in sides.items()}
            if phase == "single":
                single = run_best_ab(bases, tokens["client"], filled["workloads"],
                                     args.best_requests)
                print(f"  [{backend}] best p50/p99 ms over {args.best_requests} single "
                      f"lookups, {filled['count']} records, {n_workloads} workloads: "
                      + "; ".join(f"{name} {v['p50']:.2f}/{v['p99']:.2f}"
                                  for name, v in single.items())
                      + f"; p99 before/after {single['before']['p99'] / single['after']['p99']:.1f}x",
                      flush=True)
            else:
                batch = run_batch_ab(bases, tokens["client"], make(n_workloads),
                                     args.batch_repeats)
                for name, times in batch.items():
                    print(f"  [{backend}] {name}: best for {n_workloads} workloads in one "
                          f"call ({filled['count']} records), seconds: "
                          + ", ".join(f"{label} {statistics.median(v):.2f}"
                                      for label, v in times.items()), flush=True)


# ------------------------------------------------ idle long-polls, before and after

IDLE_TARGET = "opencl -model=pocl-cpu"


async def _idle_worker(http: httpx.AsyncClient, api: TunerClient, token: str, name: str,
                       wait_s: float, t_stop: float, calls: list[tuple[float, float, int]]
                       ) -> None:
    """Register, then lease (max_trials 1, ``wait_s``) until ``t_stop``, reporting each
    trial at once; logs (t_end, latency_s, trials) per lease. ``api`` names the routes."""
    answer = await http.post(api.url_of("workers"), headers={"Authorization": f"Bearer {token}"},
                             json=WorkerRegistration(name=name, target=Target.parse(IDLE_TARGET))
                             .model_dump(mode="json"))
    answer.raise_for_status()
    me = Registered.model_validate_json(answer.content)
    headers = {"Authorization": f"Bearer {me.token}"}
    result = MeasureResult(costs=(1e-3,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.0,
                           timestamp=time.time())
    lease_url, results_url = (api.url_of(f"workers/{me.id}/lease"),
                              api.url_of(f"workers/{me.id}/results"))
    body = LeaseRequest(max_trials=1, wait_s=wait_s).model_dump(mode="json")
    while time.time() < t_stop:
        t0 = time.perf_counter()
        try:
            answer = await http.post(lease_url, headers=headers, json=body,
                                     timeout=wait_s + 120)
            answer.raise_for_status()
        except httpx.HTTPError:  # logged as a failed call (-1 trials); go on
            calls.append((time.time(), time.perf_counter() - t0, -1))
            await asyncio.sleep(1.0)
            continue
        trials = LeaseAnswer.model_validate_json(answer.content).trials
        calls.append((time.time(), time.perf_counter() - t0, len(trials)))
        if trials:
            report = Results(results=[TrialResult(trial_id=t.trial_id, result=result)
                                      for t in trials])
            await http.post(results_url, headers=headers, json=report.model_dump(mode="json"),
                            timeout=120)


def _idle_load(base: str, token: str, n: int, wait_s: float, t_stop: float, out: Any) -> None:
    """The load process: ``n`` idle workers on one event loop, a connection each."""
    calls: list[tuple[float, float, int]] = []
    api = TunerClient(base, token)

    async def main() -> None:
        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            await asyncio.gather(*(_idle_worker(http, api, token, f"idle-{i}", wait_s,
                                                t_stop, calls) for i in range(n)))

    asyncio.run(main())
    api.close()
    out.send(calls)
    out.close()


def run_idle(base: str, tokens: dict[str, str], n: int, wait_s: float, idle_s: float,
             trickle_s: float) -> dict[str, float]:
    """``n`` workers long-polling with ``wait_s``: ``idle_s`` with nothing queued (the
    server's CPU), then ``trickle_s`` while a job plans one trial per task (4 tasks) per
    scheduler pass: leases that got a trial (latency), empty ones (beyond ``wait_s``)."""
    port = int(base.rsplit(":", 1)[1])
    register_s = 10 + n / 10  # registration under load, generously
    t_idle = time.time() + register_s
    t_trickle = t_idle + idle_s
    t_stop = t_trickle + trickle_s
    recv, send = mp.get_context("fork").Pipe(duplex=False)
    proc = mp.get_context("fork").Process(
        target=_idle_load, args=(base, tokens["worker"], n, wait_s, t_stop, send), daemon=True)
    proc.start()
    send.close()
    pids = _server_pids(port)
    while time.time() < t_idle:
        time.sleep(0.05)
    cpu0 = _cpu_s(pids)
    time.sleep(idle_s)
    idle_cpu = (_cpu_s(pids) - cpu0) / idle_s
    with TunerClient(base, tokens["admin"], timeout=60, retries=0) as admin:
        admin.submit_job(JobRequest(
            target=Target.parse(IDLE_TARGET), n_trial=1_000_000, tuner="random", plan_size=1,
            early_stopping=None, tasks=[Workload(template=TEMPLATE, args=tuple(conv_args(*layer)))
                                        for layer in LAYERS[:4]]))
    calls = recv.recv() if recv.poll(trickle_s + wait_s + 300) else []
    proc.join(30)
    if proc.is_alive():
        proc.kill()
    idle = [c for c in calls if t_idle + wait_s <= c[0] < t_trickle and c[2] >= 0]
    window = [c for c in calls if t_trickle + 2 <= c[0] < t_stop and c[2] >= 0]
    got = [c[1] * 1e3 for c in window if c[2]]
    beyond = [(c[1] - wait_s) * 1e3 for c in idle + window if not c[2]]
    return {"idle_cpu": idle_cpu, "idle_leases_s": len(idle) / max(idle_s - wait_s, 1e-9),
            "errors": sum(1 for c in calls if c[2] < 0),
            "got_p50": pct(got, 50), "got_p99": pct(got, 99), "leased_s": len(got) / (trickle_s - 2),
            "beyond_p50": pct(beyond, 50), "beyond_p99": pct(beyond, 99)}


def bench_idle(backend: str, args: argparse.Namespace, workdir: Path) -> None:
    """Phase idle: for each of ``--idle-workers``, a fresh database served by this tree
    ("after") and then by ``--baseline`` ("before"), one at a time."""
    log = workdir / f"server-{backend}.log"
    sides = {"after": {}} | ({"before": {"PYTHONPATH": args.baseline}} if args.baseline else {})
    for n in args.idle_workers:
        for name, env in sides.items():
            with database(backend, workdir) as (url, queue_url):
                tokens = prepare(url)
                with server(url, queue_url, log, env) as base:
                    r = run_idle(base, tokens, n, args.idle_wait, args.idle_seconds,
                                 args.idle_seconds)
            print(f"  [{backend}] {name}: {n} workers, wait_s={args.idle_wait:g}: idle server "
                  f"CPU {r['idle_cpu']:.2f} cores ({r['idle_leases_s']:.0f} empty leases/s); "
                  f"trickle {r['leased_s']:.1f} trials/s, lease with a trial p50/p99 "
                  f"{r['got_p50']:.0f}/{r['got_p99']:.0f} ms; empty leases beyond wait_s "
                  f"p50/p99 {r['beyond_p50']:.0f}/{r['beyond_p99']:.0f} ms; failed calls "
                  f"{r['errors']}", flush=True)


# ---------------------------------------------------------------------------- main

LABELS = {"sqlite": "SQLite + sql queue", "postgres": "PostgreSQL + Redis"}


def bench_backend(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": backend}
    extra = {"TUNER_SCHEDULER_INTERVAL": str(args.scheduler_interval)}
    serve_args = list(args.serve_arg or [])
    log = workdir / f"server-{backend}.log"
    if "dispatch" in args.phases:
        with database(backend, workdir) as (url, queue_url):
            tokens = prepare(url)
            with server(url, queue_url, log, extra, serve_args) as base:
                d = run_dispatch(base, tokens, args)
        out["dispatch"] = d
        print(f"  [{backend}] dispatched {d.dispatched_s:.0f}/s, recorded {d.recorded_s:.0f}/s "
              f"(server counters: {d.server_leased_s:.0f}/s, {d.server_recorded_s:.0f}/s); "
              f"lease p50/p99 {d.lease_ms[0]:.1f}/{d.lease_ms[1]:.1f} ms, results "
              f"{d.results_ms[0]:.1f}/{d.results_ms[1]:.1f} ms; empty leases "
              f"{d.empty_leases}", flush=True)
        print(f"  [{backend}] server CPU {d.server_cores:.2f} cores: "
              f"{d.server_cores * args.seconds / max(d.calls, 1) * 1e3:.2f} ms a call, "
              f"{d.server_cores / max(d.dispatched_s, 1e-9) * 1e3:.2f} ms a trial "
              f"(leased and recorded)", flush=True)
        for e in d.errors[:5]:
            print(f"  [{backend}] worker error: {e}", flush=True)
    if "best" in args.phases:
        with database(backend, workdir) as (url, queue_url):
            tokens = prepare(url)
            filled = fill_records(url, args.records, args.workloads)
            print(f"  [{backend}] inserted {filled['inserted']} records "
                  f"({filled['count']} in the table) in {filled['seconds']:.1f} s", flush=True)
            with server(url, queue_url, log, dict(extra, TUNER_RUN_SCHEDULER="false"),
                        serve_args) as base:
                b = run_best(base, tokens["client"], filled["workloads"], args.best_requests)
        b["records"] = filled["count"]
        out["best"] = b
        print(f"  [{backend}] best p50/p99 {b['p50']:.2f}/{b['p99']:.2f} ms over "
              f"{b['n']} requests, rules {b['rules']}; the endpoint on a bare connection "
              f"{b['endpoint_p50']:.2f}/{b['endpoint_p99']:.2f} ms", flush=True)
    return out


def verdict(value: float, target: float, higher_is_better: bool, unit: str) -> str:
    if math.isnan(value):
        return "not measured"
    if (value >= target) if higher_is_better else (value <= target):
        return "target met"
    gap = target - value if higher_is_better else value - target
    return f"missed by {gap:.{0 if unit == '/s' else 2}f}{unit} ({gap / target:.0%})"


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    head = (f"{'backend':<20} {'dispatched/s':>12} {'recorded/s':>10} {'lease p50/p99 ms':>17} "
            f"{'results p50/p99 ms':>19} {'best p50/p99 ms':>16}")
    print()
    print(f"workers={args.workers} (in {min(args.procs, args.workers)} processes) "
          f"batch={args.batch} plan_size={args.plan_size} tasks={args.tasks} "
          f"window={args.seconds:g} s after {args.warmup:g} s warm-up; "
          f"best: {args.best_requests} requests over {args.records} records, "
          f"{args.workloads} workloads")
    print(head)
    print("-" * len(head))
    for row in rows:
        d, b = row.get("dispatch"), row.get("best")
        cells = [f"{LABELS[row['backend']]:<20}"]
        if d:
            cells += [f"{d.dispatched_s:>12.0f}", f"{d.recorded_s:>10.0f}",
                      f"{d.lease_ms[0]:>8.1f} / {d.lease_ms[1]:<6.1f}",
                      f"{d.results_ms[0]:>9.1f} / {d.results_ms[1]:<7.1f}"]
        else:
            cells += [f"{'-':>12}", f"{'-':>10}", f"{'-':>17}", f"{'-':>19}"]
        cells.append(f"{b['p50']:>7.2f} / {b['p99']:<6.2f}" if b else f"{'-':>16}")
        print(" ".join(cells))
    pg = next((r for r in rows if r["backend"] == "postgres"), None)
    if pg:
        print()
        if pg.get("dispatch"):
            v = pg["dispatch"].recorded_s
            print(f"PostgreSQL + Redis trials recorded/s {v:.0f} vs >= "
                  f"{TARGET_TRIALS_PER_S:.0f}: {verdict(v, TARGET_TRIALS_PER_S, True, '/s')}")
        if pg.get("best"):
            v, bound = pg["best"]["p99"], best_target_ms(pg["best"]["records"])
            print(f"PostgreSQL + Redis best-lookup p99 {v:.2f} ms at {pg['best']['records']:,} "
                  f"records vs <= {bound:g} ms: {verdict(v, bound, False, ' ms')}")
            e = pg["best"]["endpoint_p99"]
            print(f"  the endpoint alone (bare HTTP/1.1, the client library's own encoding "
                  f"and parsing left out): p99 {e:.2f} ms: {verdict(e, bound, False, ' ms')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="sqlite,postgres",
                   help="comma-separated: sqlite (SQLite + sql queue), "
                        "postgres (PostgreSQL + Redis)")
    p.add_argument("--phases", default="dispatch,best",
                   help="comma-separated: dispatch, best, batch (records/best for "
                        "--batch-workloads in one call), ab (best and batch, this tree "
                        "beside --baseline), idle (long-polls)")
    p.add_argument("--workers", type=int, default=8, help="simulated workers")
    p.add_argument("--procs", type=int, default=4,
                   help="client processes the workers are spread over (threads in each)")
    p.add_argument("--batch", type=int, default=32, help="max_trials per lease")
    p.add_argument("--seconds", type=float, default=20.0, help="measured window")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before the window")
    p.add_argument("--tasks", type=int, default=8, choices=range(1, len(LAYERS) + 1),
                   metavar=f"1..{len(LAYERS)}", help="tasks in the job")
    p.add_argument("--plan-size", type=int, default=256, help="the job's plan_size")
    p.add_argument("--n-trial", type=int, default=1_000_000, help="the job's trials per task")
    p.add_argument("--cost", type=float, default=1e-3, help="fake cost every result reports")
    p.add_argument("--scheduler-interval", type=float, default=0.2,
                   help="TUNER_SCHEDULER_INTERVAL for the server")
    p.add_argument("--records", type=int, default=100_000, help="records for the best lookup")
    p.add_argument("--workloads", type=int, default=1000, help="workloads they spread over")
    p.add_argument("--best-requests", type=int, default=2000)
    p.add_argument("--batch-workloads", type=int, default=10_000,
                   help="phase batch: workloads asked in one records/best request")
    p.add_argument("--batch-records", type=int, default=100_000,
                   help="phase batch: records over those workloads")
    p.add_argument("--batch-repeats", type=int, default=3,
                   help="phase batch: timed requests per rule (the median is shown)")
    p.add_argument("--idle-workers", type=lambda v: [int(x) for x in v.split(",")],
                   default=[200, 1000], help="phase idle: comma-separated worker counts")
    p.add_argument("--idle-wait", type=float, default=1.0, help="phase idle: wait_s")
    p.add_argument("--idle-seconds", type=float, default=10.0,
                   help="phase idle: seconds idle, then as long with trials trickling in")
    p.add_argument("--baseline", default=None,
                   help="phase ab: a directory holding an older copy of the packages "
                        "(tuner_server, schemas, ...), served beside this tree's")
    p.add_argument("--serve-arg", action="append",
                   help="extra argument for `tuner serve` (repeatable)")
    p.add_argument("--uvicorn-workers", type=int, default=0,
                   help="run `tuner serve --workers N` (N server processes, PostgreSQL "
                        "only; /metrics sums their counters)")
    load = p.add_argument_group("load", "--load: simulated workers long-polling a server "
                                "on PostgreSQL + Redis (the other phases are not run)")
    load.add_argument("--load", action="store_true")
    load.add_argument("--load-workers", type=int, default=1000)
    load.add_argument("--load-seconds", type=float, default=60.0, help="measured window")
    load.add_argument("--load-ramp", type=float, default=5.0,
                      help="seconds over which the workers start")
    load.add_argument("--load-wait", type=float, default=1.0, help="each lease's wait_s")
    load.add_argument("--load-batch", type=int, default=8, help="each lease's max_trials")
    load.add_argument("--load-measure-s", type=float, default=1.0,
                      help="seconds a simulated worker takes per trial before it reports")
    load.add_argument("--load-procs", type=int, default=1,
                      help="load generator processes (asyncio, one connection a worker)")
    args = p.parse_args(argv)
    UVICORN_WORKERS[0] = args.uvicorn_workers
    if args.load:
        workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
        print(f"bench/server.py --load on {platform.node()}: {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}",
              flush=True)
        try:
            r = bench_load(args, workdir)
        finally:
            if os.environ.get("BENCH_KEEP_LOGS"):
                print(f"server log in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        return 1 if r.double_leases or r.lost or r.recorded_twice else 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in LABELS:
            p.error(f"--backends: {b!r} is not one of {', '.join(LABELS)}")
    args.phases = {x.strip() for x in args.phases.split(",")}
    if "ab" in args.phases and not args.baseline:
        p.error("--phases ab needs --baseline DIR (idle takes one too, for a before)")
    print(f"bench/server.py on {platform.node()}: {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    rows = []
    try:
        for backend in backends:
            rows.append(bench_backend(backend, args, workdir))
            if "batch" in args.phases:
                bench_best_batch(backend, args, workdir)
            if "ab" in args.phases:
                bench_best_ab(backend, args, workdir)
            if "idle" in args.phases:
                bench_idle(backend, args, workdir)
    finally:
        keep = os.environ.get("BENCH_KEEP_LOGS")
        if keep:
            print(f"server logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows, args)
    return 0


# ---------------------------------------------------------------------------- load
# `--load`: many simulated workers long-polling a real server on PostgreSQL + Redis,
# each measuring nothing (it sleeps as long as a measurement would take and reports a
# synthetic cost), with every lease and result logged so that double leases and lost
# results are counted, not assumed away. The load generator is asyncio + httpx in
# `--load-procs` processes on the same cores as the server, PostgreSQL and Redis.

LOAD_TARGETS = ["cuda -model=h200 -arch=sm_90", "cuda -model=a100 -arch=sm_80",
                "rocm -model=mi300x", "opencl -model=pocl-cpu"]


@dataclass
class LoadLog:
    """What one load process saw: calls as (kind, t_end, latency_s, trials, ok), leases
    as (trial_id, worker_id, t_answered, lease_deadline), results accepted as
    (trial_id, worker_id, t_answered), and error messages."""

    calls: list[tuple[str, float, float, int, bool]] = field(default_factory=list)
    leases: list[tuple[int, int, float, float]] = field(default_factory=list)
    reported: list[tuple[int, int, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def audit_leases(leases: list[tuple[int, int, float, float]],
                 reported: list[tuple[int, int, float]]) -> tuple[int, list[int]]:
    """(trials leased twice at once, their ids): a trial handed out again while an
    earlier lease of it had not expired, or after its result had been accepted."""
    accepted = {trial: t for trial, _, t in reported}
    by_trial: dict[int, list[tuple[float, float]]] = {}
    for trial, _, t, deadline in leases:
        by_trial.setdefault(trial, []).append((t, deadline))
    twice = []
    for trial, held in by_trial.items():
        held.sort()
        done_at = accepted.get(trial, math.inf)
        for (_, deadline), (again, _) in itertools.pairwise(held):
            if again < deadline or again > done_at:
                twice.append(trial)
                break
    return len(twice), sorted(twice)


def audit_records(url: str, reported: list[tuple[int, int, float]]
                  ) -> tuple[list[int], list[int]]:
    """(trials whose accepted result has no record: lost, trials with more than one
    record), read from the database after the run."""
    from sqlalchemy import func, select

    from tuner_server.db.models import RecordRow
    from tuner_server.db.session import make_engine, session_factory

    want = {trial for trial, _, _ in reported}
    engine = make_engine(url)
    try:
        with session_factory(engine)() as session:
            counts: dict[int, int] = {int(trial): int(n) for trial, n in session.execute(
                select(RecordRow.trial_id, func.count()).where(RecordRow.trial_id.is_not(None))
                .group_by(RecordRow.trial_id))}
    finally:
        engine.dispose()
    lost = sorted(t for t in want if counts.get(t, 0) == 0)
    twice = sorted(t for t, n in counts.items() if n > 1)
    return lost, twice


class _Http:
    """One simulated worker's keep-alive HTTP/1.1 connection: a request is one write of
    prepared bytes, an answer is read by its Content-Length. httpx's shared pool looked
    at every connection on every request (O(workers) per call): at 1,000 workers that
    was two thirds of the load generator's CPU, so its latencies were its own queueing."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n".encode()
        self._auth = b""
        self._io: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def use_token(self, token: str) -> None:
        self._auth = f"Authorization: Bearer {token}\r\n".encode()

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """(status, body) of a POST; raises OSError, EOFError or TimeoutError, the
        connection then closed (the next call opens another)."""
        try:
            async with asyncio.timeout(timeout):
                if self._io is None:
                    self._io = await asyncio.open_connection(self._host, self._port)
                reader, writer = self._io
                writer.write(b"POST %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
                    path.encode(), self._head, self._auth, len(body), body))
                head = await reader.readuntil(b"\r\n\r\n")
                status, length, close = int(head[9:12]), -1, False
                for line in head.lower().split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection":
                        close = value.strip() == b"close"
                if length < 0:
                    raise EOFError(f"answer without Content-Length: {head[:200]!r}")
                answer = await reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, answer

    def close(self) -> None:
        if self._io is not None:
            self._io[1].close()
            self._io = None


HTTP_FAILED = (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
               TimeoutError, ValueError)


async def _sim_worker(api: TunerClient, name: str, target: str, token: str,
                      args: argparse.Namespace, t_start: float, t_stop: float,
                      log: LoadLog, rng: random.Random) -> None:
    """Register at ``t_start``, then lease (long-poll ``--load-wait``), "measure" for
    ``--load-measure-s`` a trial, report, until ``t_stop``; the last batch is reported.
    Bodies are built from the ``schemas.api`` models once and filled in per call; an
    answer is read as JSON for what the checks need (ids, deadlines, counts)."""
    await asyncio.sleep(max(t_start - time.time(), 0))
    url = urlsplit(api.url_of(""))
    http = _Http(url.hostname or "127.0.0.1", url.port or 80)
    http.use_token(token)
    try:
        await _sim_worker_on(http, url.path.rstrip("/"), name, target, args, t_stop, log,
                             rng)
    finally:
        http.close()


async def _sim_worker_on(http: _Http, api: str, name: str, target: str,
                         args: argparse.Namespace, t_stop: float, log: LoadLog,
                         rng: random.Random) -> None:
    body = WorkerRegistration(name=name, target=Target.parse(target)).model_dump_json()
    try:
        status, answer = await http.post(f"{api}/workers", body.encode(), 60)
    except HTTP_FAILED as err:
        log.errors.append(f"register {type(err).__name__} {err}"[:200])
        return
    if status != 201:
        log.errors.append(f"register {status} {answer[:200]!r}")
        return
    me = Registered.model_validate_json(answer)
    http.use_token(me.token)
    lease_body = LeaseRequest(max_trials=args.load_batch,
                              wait_s=args.load_wait).model_dump_json().encode()
    one = TrialResult(trial_id=1, result=MeasureResult(
        costs=(1e-4,), error_no=MeasureErrorNo.NO_ERROR, all_cost=args.load_measure_s,
        timestamp=time.time())).model_dump(mode="json")  # the wire shape, filled per trial
    lease_path, results_path = f"{api}/workers/{me.id}/lease", f"{api}/workers/{me.id}/results"
    while time.time() < t_stop:
        t0 = time.perf_counter()
        try:
            status, answer = await http.post(lease_path, lease_body, args.load_wait + 60)
        except HTTP_FAILED as err:
            log.calls.append(("lease", time.time(), time.perf_counter() - t0, 0, False))
            log.errors.append(f"lease {type(err).__name__} {err}"[:200])
            await asyncio.sleep(1.0)
            continue
        latency, now = time.perf_counter() - t0, time.time()
        if status != 200:
            log.calls.append(("lease", now, latency, 0, False))
            log.errors.append(f"lease {status} {answer[:200]!r}")
            await asyncio.sleep(1.0)
            continue
        trials = [(t["trial_id"], t["lease_deadline"]) for t in json.loads(answer)["trials"]]
        log.calls.append(("lease", now, latency, len(trials), True))
        log.leases += [(trial, me.id, now, deadline if deadline is not None else math.inf)
                       for trial, deadline in trials]
        if not trials:
            continue
        await asyncio.sleep(args.load_measure_s * len(trials))
        stamp = time.time()
        body = json.dumps({"results": [
            dict(one, trial_id=trial, result=dict(one["result"], timestamp=stamp,
                                                  costs=[rng.uniform(1e-4, 1e-3)]))
            for trial, _deadline in trials]}).encode()
        t0 = time.perf_counter()
        try:
            status, answer = await http.post(results_path, body, 60)
        except HTTP_FAILED as err:
            log.calls.append(("results", time.time(), time.perf_counter() - t0, 0, False))
            log.errors.append(f"results {type(err).__name__} {err}"[:200])
            continue
        latency, now = time.perf_counter() - t0, time.time()
        if status != 200:
            log.calls.append(("results", now, latency, 0, False))
            log.errors.append(f"results {status} {answer[:200]!r}")
            continue
        log.calls.append(("results", now, latency, int(json.loads(answer)["accepted"]), True))
        log.reported += [(trial, me.id, now) for trial, _deadline in trials]


def load_proc(base: str, token: str, workers: list[tuple[str, str, float]],
              args: argparse.Namespace, t_stop: float, out: Any) -> None:
    """One load process: ``workers`` as (name, target, start time) coroutines on one
    event loop, a connection each (they long-poll at once)."""
    log = LoadLog()
    api = TunerClient(base, token)  # names the routes; requests go through ``_Http``

    async def main() -> None:
        rng = random.Random(os.getpid())
        await asyncio.gather(*(_sim_worker(api, name, target, token, args, start, t_stop,
                                           log, rng) for name, target, start in workers))

    asyncio.run(main())
    api.close()
    out.send(log)
    out.close()


def _server_pids(port: int) -> list[int]:
    """The processes of the `tuner serve` listening on ``port`` (its session), Linux."""
    sessions = set()
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry.name)] = stat
        if b"serve" in cmd and str(port).encode() in cmd:
            sessions.add(int(stat[3]))  # its session id
    return [pid for pid, stat in stats.items() if int(stat[3]) in sessions]


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (the live ones)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(stat[11]) + int(stat[12])) / tick
    return total


@dataclass
class LoadResult:
    dispatched_s: float
    recorded_s: float
    lease_ms: tuple[float, float]
    lease_beyond_wait_ms: float  # p99 of (latency - wait_s) of leases that came back empty
    results_ms: tuple[float, float]
    calls: int
    errors: int
    double_leases: int
    lost: int
    recorded_twice: int
    server_cpu_s: float
    load_cpu_s: float
    seconds: float
    window_calls: int  # lease and results calls completed in the window
    examples: list[str] = field(default_factory=list)


def run_load(base: str, url: str, tokens: dict[str, str], args: argparse.Namespace
             ) -> LoadResult:
    """One job per target, ``--load-workers`` workers spread over the targets, started
    over ``--load-ramp`` s; the window is ``--load-seconds`` after ``--warmup``."""
    with TunerClient(base, tokens["admin"], timeout=60, retries=0) as admin:
        for target in LOAD_TARGETS:
            admin.submit_job(JobRequest(
                target=Target.parse(target), n_trial=args.n_trial, tuner="random",
                plan_size=args.plan_size, early_stopping=None,
                tasks=[Workload(template=TEMPLATE, args=tuple(conv_args(*layer)))
                       for layer in LAYERS[:args.tasks]]))
    port = int(base.rsplit(":", 1)[1])
    n = args.load_workers
    t_start = time.time() + 2.0  # the load processes start in these seconds
    t_measure = t_start + args.load_ramp + args.warmup
    t_end = t_measure + args.load_seconds
    workers = [(f"sim-{i}", LOAD_TARGETS[i % len(LOAD_TARGETS)],
                t_start + args.load_ramp * i / n) for i in range(n)]
    procs_n = max(1, min(args.load_procs, n))
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for k in range(procs_n):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=load_proc, args=(base, tokens["worker"], workers[k::procs_n],
                                                args, t_end, send), daemon=True)
        p.start()
        send.close()
        pipes.append(recv)
        procs.append(p)
    server_pids = _server_pids(port)
    while time.time() < t_measure:
        time.sleep(0.05)
    load_pids = [p.pid for p in procs if p.pid is not None]
    cpu0, load0 = _cpu_s(server_pids), _cpu_s(load_pids)
    m0, tm0 = metrics(base), time.time()
    while time.time() < t_end:
        time.sleep(0.05)
    m1, tm1 = metrics(base), time.time()
    cpu1, load1 = _cpu_s(server_pids), _cpu_s(load_pids)
    log = LoadLog()
    for recv, p in zip(pipes, procs):
        if recv.poll(args.load_wait + args.load_measure_s * args.load_batch + 180):
            part: LoadLog = recv.recv()
            log.calls += part.calls
            log.leases += part.leases
            log.reported += part.reported
            log.errors += part.errors
        else:
            log.errors.append("a load process sent nothing back")
        p.join(30)
        if p.is_alive():
            p.kill()
    window = [c for c in log.calls if t_measure <= c[1] < t_end]
    leases = [c for c in window if c[0] == "lease"]
    results = [c for c in window if c[0] == "results"]
    lease_lat = [c[2] * 1e3 for c in leases]
    empty_beyond = [(c[2] - args.load_wait) * 1e3 for c in leases if c[4] and c[3] == 0]
    res_lat = [c[2] * 1e3 for c in results]
    double, double_ids = audit_leases(log.leases, log.reported)
    lost, twice = audit_records(url, log.reported)
    examples = log.errors[:5] + [f"leased twice: trial {t}" for t in double_ids[:5]] + \
        [f"lost: trial {t}" for t in lost[:5]]
    span = tm1 - tm0
    print(f"  [load] server counters over the window: leased "
          f"{(m1['tuner_trials_leased_total'] - m0['tuner_trials_leased_total']) / span:.0f}/s, "
          f"recorded {(m1['tuner_trials_recorded_total'] - m0['tuner_trials_recorded_total']) / span:.0f}/s",
          flush=True)
    return LoadResult(
        dispatched_s=sum(c[3] for c in leases) / args.load_seconds,
        recorded_s=sum(c[3] for c in results) / args.load_seconds,
        lease_ms=(pct(lease_lat, 50), pct(lease_lat, 99)),
        lease_beyond_wait_ms=pct(empty_beyond, 99),
        results_ms=(pct(res_lat, 50), pct(res_lat, 99)),
        calls=len(log.calls), errors=sum(1 for c in log.calls if not c[4]) + sum(
            1 for e in log.errors if e.startswith("register")),
        double_leases=double, lost=len(lost), recorded_twice=len(twice),
        server_cpu_s=cpu1 - cpu0, load_cpu_s=load1 - load0, seconds=span,
        window_calls=len(window), examples=examples)


def bench_load(args: argparse.Namespace, workdir: Path) -> LoadResult:
    """The load run on a fresh PostgreSQL database and Redis prefix, removed after."""
    log = workdir / "server-load.log"
    extra = {"TUNER_SCHEDULER_INTERVAL": str(args.scheduler_interval)}
    with database("postgres", workdir) as (url, queue_url):
        tokens = prepare(url)
        with server(url, queue_url, log, extra, list(args.serve_arg or [])) as base:
            r = run_load(base, url, tokens, args)
    procs = max(UVICORN_WORKERS[0], 1)
    print(f"\nload: {args.load_workers} simulated workers over {len(LOAD_TARGETS)} targets "
          f"in {min(args.load_procs, args.load_workers)} asyncio process(es), lease "
          f"max_trials={args.load_batch} wait_s={args.load_wait:g}, "
          f"{args.load_measure_s:g} s a trial; {procs} server process(es); "
          f"window {args.load_seconds:g} s after {args.load_ramp:g} s ramp + "
          f"{args.warmup:g} s warm-up")
    print(f"  dispatched {r.dispatched_s:.0f}/s, recorded {r.recorded_s:.0f}/s; lease p50/p99 "
          f"{r.lease_ms[0]:.0f}/{r.lease_ms[1]:.0f} ms (empty ones p99 "
          f"{r.lease_beyond_wait_ms:.0f} ms beyond wait_s), results p50/p99 "
          f"{r.results_ms[0]:.0f}/{r.results_ms[1]:.0f} ms")
    print(f"  errors {r.errors} of {r.calls} calls ({r.errors / max(r.calls, 1):.2%}); "
          f"leased twice at once {r.double_leases}; lost {r.lost}; recorded twice "
          f"{r.recorded_twice}")
    print(f"  CPU over the window ({os.cpu_count()} cores): server "
          f"{r.server_cpu_s / r.seconds:.2f} cores, load generator "
          f"{r.load_cpu_s / r.seconds:.2f} cores; the rest: PostgreSQL, Redis and the "
          f"machine's other work")
    print(f"  per call in the window ({r.window_calls}): server "
          f"{r.server_cpu_s / max(r.window_calls, 1) * 1e3:.2f} ms, load generator "
          f"{r.load_cpu_s / max(r.window_calls, 1) * 1e3:.2f} ms; server per trial "
          f"{r.server_cpu_s / max(r.dispatched_s * args.load_seconds, 1) * 1e3:.2f} ms")
    for e in r.examples:
        print(f"  [load] {e}")
    return r


if __name__ == "__main__":
    sys.exit(main())

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
                target-key rule (no record for that model)

Every call goes through ``tuner_client`` (the one REST client): the latencies include
its pydantic encoding and parsing, as every real client's do.

The load generator (worker processes) runs on the same machine as the server and the
database, so on a 2-core box they compete for the same CPUs: the figures are a floor.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from schemas import MeasureErrorNo, MeasureResult, Target, Workload
from schemas.api import JobRequest, TrialResult, WorkerRegistration
from tuner_client import ApiError, TunerClient

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TUNER = str(BIN / "tuner")

PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
REDIS_URL = "redis://127.0.0.1:6379/0"

UVICORN_WORKERS = [0]  # --uvicorn-workers
TARGET_TRIALS_PER_S = 2000.0  # the targets, PostgreSQL + Redis
TARGET_BEST_P99_MS = 5.0

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
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
            try:
                with TunerClient(base, timeout=1, retries=0) as probe:
                    probe.health()
                break
            except ApiError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"server did not answer within 60 s; see {log}")
            time.sleep(0.2)
        yield base
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        if queue_url.startswith("redis://"):
            import redis

            r = redis.Redis.from_url(queue_url)
            keys = list(r.scan_iter(f"{prefix}:*", count=1000))
            if keys:
                r.delete(*keys)


def metrics(base: str) -> dict[str, float]:
    """The server's Prometheus counters (not part of the REST API)."""
    text = httpx.get(f"{base}/metrics", timeout=60).text
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
    # server-side counters at the window's edges, as a cross-check
    while time.time() < t_measure:
        time.sleep(0.01)
    m0, tm0 = metrics(base), time.time()
    while time.time() < t_end:
        time.sleep(0.01)
    m1, tm1 = metrics(base), time.time()
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
        errors=errors)


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


def fill_records(url: str, n_records: int, n_workloads: int, seed: int = 0) -> dict[str, Any]:
    """Insert ``n_records`` records straight into the database (services.records)."""
    from sqlalchemy import func, select

    from compiler.templates import get_template
    from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target, Workload
    from tuner_server.db.models import RecordRow
    from tuner_server.db.session import make_engine, session_factory
    from tuner_server.services.records import add_records

    rng = random.Random(seed)
    template = get_template(TEMPLATE)
    workloads = [Workload(template=TEMPLATE, args=tuple(a))
                 for a in record_workloads(n_workloads)]
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
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE records")
            conn.commit()
    engine.dispose()
    return {"inserted": done, "count": count, "seconds": time.time() - t0,
            "workloads": [w.args_json() for w in workloads]}


def run_best(base: str, token: str, workloads: list[list[Any]], n_requests: int,
             seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    lat: list[float] = []
    rules: dict[str, int] = {}
    with TunerClient(base, token, timeout=60, retries=0) as api:
        for i in range(n_requests + 50):  # the first 50 warm up
            target = rng.choice(QUERY_MODEL if i % 2 == 0 else QUERY_KEY)
            workload = Workload(template=TEMPLATE, args=tuple(rng.choice(workloads)))
            t0 = time.perf_counter()
            (item,) = api.best(target, [workload])
            dt = time.perf_counter() - t0
            if i >= 50:
                lat.append(dt * 1e3)
                rule = item.rule
                kind = "none" if rule == "none" else rule.split(":")[0]
                rules[kind] = rules.get(kind, 0) + 1
    return {"p50": pct(lat, 50), "p99": pct(lat, 99), "mean": statistics.fmean(lat),
            "n": len(lat), "rules": rules}


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
              f"{b['n']} requests, rules {b['rules']}", flush=True)
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
            v = pg["best"]["p99"]
            print(f"PostgreSQL + Redis best-lookup p99 {v:.2f} ms vs <= "
                  f"{TARGET_BEST_P99_MS:g} ms: {verdict(v, TARGET_BEST_P99_MS, False, ' ms')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="sqlite,postgres",
                   help="comma-separated: sqlite (SQLite + sql queue), "
                        "postgres (PostgreSQL + Redis)")
    p.add_argument("--phases", default="dispatch,best", help="dispatch, best or both")
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
    p.add_argument("--serve-arg", action="append",
                   help="extra argument for `tuner serve` (repeatable)")
    p.add_argument("--uvicorn-workers", type=int, default=0,
                   help="run `tuner serve --workers N` (N server processes, PostgreSQL "
                        "only); the server-side counters are then one process's only")
    args = p.parse_args(argv)
    UVICORN_WORKERS[0] = args.uvicorn_workers
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in LABELS:
            p.error(f"--backends: {b!r} is not one of {', '.join(LABELS)}")
    args.phases = {x.strip() for x in args.phases.split(",")}
    print(f"bench/server.py on {platform.node()}: {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    rows = []
    try:
        for backend in backends:
            rows.append(bench_backend(backend, args, workdir))
    finally:
        keep = os.environ.get("BENCH_KEEP_LOGS")
        if keep:
            print(f"server logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

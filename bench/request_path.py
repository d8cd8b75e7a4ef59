"""What one small authenticated request costs the server: the request path of this tree
against an earlier revision's (``--before``, default HEAD), and with uvloop + httptools
against asyncio + h11, side by side in one run.

Each variant is a uvicorn server (no scheduler, the sql queue) on a PostgreSQL database
of its own (or SQLite with ``--sqlite``), migrated by its own code; ``--clients`` threads,
each a registered worker with its own token, send heartbeats (an empty list: the token
check, a database session, the worker's row read and ``last_seen`` written, a commit) for
``--seconds``, the variants taking turns for ``--rounds`` rounds. Printed: requests per
second, client-side p50/p99 and the server process's CPU per request (from /proc: the
figure a busy machine disturbs least), medians over rounds, each with its ratio to the
first variant's. The clients run on the same cores as the server: rates and latencies are
a floor, the ratios the point.

    .venv/bin/python bench/request_path.py [--before HEAD] [--clients 16] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from schemas import Target
from schemas.api import WorkerRegistration
from server import PG_ADMIN_DSN, PG_URL, free_port, stop_group, wait_answering
from tuner_client import TunerClient

REPO = Path(__file__).resolve().parents[1]
TARGET = "opencl -model=pocl-cpu"
# A server on the code in the working directory, with the loop and HTTP parser asked.
LAUNCH = ("import sys, uvicorn\n"
          "from tuner_server.app import create_app\n"
          "uvicorn.run(create_app(), host='127.0.0.1', port=int(sys.argv[1]),"
          " loop=sys.argv[2], http=sys.argv[3], log_level='warning')")
CLI = "from cli.main import app; app()"


@dataclass(frozen=True)
class Variant:
    label: str
    code: Path  # the tree whose code it runs
    loop: str
    http: str


@contextmanager
def code_at(rev: str, workdir: Path) -> Iterator[Path]:
    """The tree of ``rev`` (`git archive`), read-only use."""
    tree = workdir / f"rev-{secrets.token_hex(3)}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    yield tree


def _env(code: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    return {**env, "PYTHONPATH": str(code), "TUNER_DATABASE_URL": url,
            "TUNER_QUEUE_URL": "sql", "TUNER_RUN_SCHEDULER": "false"}


@contextmanager
def database(sqlite: bool, workdir: Path) -> Iterator[str]:
    if sqlite:
        yield f"sqlite:///{workdir / f'bench-{secrets.token_hex(4)}.db'}"
        return
    import psycopg

    name = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.format(name=name)
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def worker_token(code: Path, url: str) -> str:
    """Migrate the database with ``code``'s migrations; a worker token from its CLI."""
    env = _env(code, url)
    subprocess.run([sys.executable, "-c", CLI, "db", "upgrade"], cwd=code, env=env,
                   check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", CLI, "token", "create", "--role", "worker"],
                         cwd=code, env=env, check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server(variant: Variant, url: str, log: Path) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of a server running ``variant``."""
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(port), variant.loop,
                                 variant.http], cwd=variant.code, env=_env(variant.code, url),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_answering(proc, base, log, 120, what=f"{variant.label}: server")
        yield base, proc.pid
    finally:
        stop_group(proc)


def registered(base: str, token: str, n: int) -> list[tuple[TunerClient, int]]:
    """``n`` clients, each a worker of its own speaking with its own token."""
    clients = []
    for i in range(n):
        api = TunerClient(base, token, timeout=60, retries=0)
        me = api.register_worker(WorkerRegistration(name=f"bench-{i}",
                                                    target=Target.parse(TARGET)))
        api.use_token(me.token)
        clients.append((api, me.id))
    return clients


def hammer(clients: list[tuple[TunerClient, int]], seconds: float) -> tuple[float, list[float]]:
    """(requests per second, latencies in ms) of heartbeats from every client at once."""
    lat: list[list[float]] = [[] for _ in clients]
    t_stop = time.perf_counter() + seconds

    def run(k: int) -> None:
        api, wid = clients[k]
        while time.perf_counter() < t_stop:
            t0 = time.perf_counter()
            api.heartbeat(wid, [])
            lat[k].append((time.perf_counter() - t0) * 1e3)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(clients))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = time.perf_counter() - t0
    flat = sorted(x for part in lat for x in part)
    return len(flat) / span, flat


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q / 100 * (len(sorted_values) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="HEAD", help="the revision to compare with")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    try:
        with ExitStack() as stack:
            before = stack.enter_context(code_at(args.before, workdir))
            variants = [Variant(f"{args.before}, asyncio + h11", before, "asyncio", "h11"),
                        Variant("this tree, asyncio + h11", REPO, "asyncio", "h11")]
            try:
                import httptools  # noqa: F401
                import uvloop  # noqa: F401

                variants.append(Variant("this tree, uvloop + httptools", REPO, "uvloop",
                                        "httptools"))
            except ImportError:
                print("uvloop/httptools not installed: that variant is left out")
            pools: dict[Variant, list[tuple[TunerClient, int]]] = {}
            pids: dict[Variant, int] = {}
            for v in variants:
                url = stack.enter_context(database(args.sqlite, workdir))
                token = worker_token(v.code, url)
                base, pids[v] = stack.enter_context(server(v, url, workdir / "server.log"))
                pools[v] = registered(base, token, args.clients)
                hammer(pools[v], 1.0)  # warm up
            rates: dict[Variant, list[float]] = {v: [] for v in variants}
            p50: dict[Variant, list[float]] = {v: [] for v in variants}
            p99: dict[Variant, list[float]] = {v: [] for v in variants}
            cpu_us: dict[Variant, list[float]] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for v in variants:
                    cpu0 = cpu_s(pids[v])
                    rate, lat = hammer(pools[v], args.seconds)
                    cpu_us[v].append((cpu_s(pids[v]) - cpu0) / len(lat) * 1e6)
                    rates[v].append(rate)
                    p50[v].append(pct(lat, 50))
                    p99[v].append(pct(lat, 99))
            for pool in pools.values():
                for api, _ in pool:
                    api.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    backend = "SQLite" if args.sqlite else "PostgreSQL"
    print(f"heartbeats from {args.clients} clients, {args.seconds:g} s x {args.rounds} rounds "
          f"per variant, {backend}, {os.cpu_count()} CPUs (medians over rounds)")
    first = statistics.median(rates[variants[0]])
    first_cpu = statistics.median(cpu_us[variants[0]])
    print(f"{'variant':34} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'vs first':>9} "
          f"{'server CPU us/req':>18} {'vs first':>9}")
    for v in variants:
        rate, cpu = statistics.median(rates[v]), statistics.median(cpu_us[v])
        print(f"{v.label:34} {rate:8.0f} {statistics.median(p50[v]):8.2f} "
              f"{statistics.median(p99[v]):8.2f} {rate / first:8.2f}x {cpu:18.0f} "
              f"{cpu / first_cpu:8.2f}x")


if __name__ == "__main__":
    main()

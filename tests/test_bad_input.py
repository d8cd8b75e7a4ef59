"""No input breaks the service, REST half: a table of bad requests across every endpoint
(jobs, a task's trials, cancel, workers' register/lease/heartbeat/results/release,
records list/search/best/import, pretuned logs), each answered with its 4xx and a
one-line bounded ``{"detail": ...}``, the database holding exactly what it held before.
Then what no input can cause: a 500 that keeps the connection, outages answered 503,
/readyz, a server that will not start without its queue, and Swagger UI served offline.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from server_fixtures import (
    BACKENDS,
    PG_ADMIN_DSN,
    LiveServer,
    free_port,
    live_server,
    make_tokens,
    migrate,
    postgres_database,
    start_server,
)
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from schemas.api import MAX_BEST_WORKLOADS
from tuner_server.app import create_app
from tuner_server.middleware import MAX_DETAIL_CHARS
from tuner_server.queue import QueueUnavailable
from tuner_server.settings import Settings

pytestmark = pytest.mark.timeout(300)

DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]
TARGET = "opencl -model=fake"
BIG = 2**40  # past every INTEGER column
SPACED = 'opencl "-model=a b"'  # parses, but prints as `opencl -model=a b`, which does not
LONG_TARGET = "cuda -model=" + "m" * 300
AS_JSON = {"content-type": "application/json"}
TEXT = {"content-type": "text/plain"}


def job(**change: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"target": TARGET, "tasks": [{"template": DENSE, "args": DENSE_ARGS}],
                            "n_trial": 4}
    body.update(change)
    return body


def raw_job(fragment: str) -> dict[str, Any]:
    """A job body whose ``measure`` or top-level field is written as raw JSON text (for
    numbers JSON cannot say but Python's parser takes: Infinity, NaN, 1e400)."""
    text = json.dumps(job())[:-1] + ", " + fragment + "}"
    return {"content": text.encode(), "headers": AS_JSON}


def result(costs: str = "[0.001]", error_no: int = 0, trial_id: int = 1,
           extra: str = "") -> dict[str, Any]:
    """A results body; ``extra``: more fields of the result, as raw JSON text."""
    text = (f'{{"results": [{{"trial_id": {trial_id}, "result": {{"costs": {costs}, '
            f'"error_no": {error_no}, "all_cost": 0.1, "timestamp": 1.0{extra}}}}}]}}')
    return {"content": text.encode(), "headers": AS_JSON}


def escaped(body: Any) -> dict[str, Any]:
    """``body`` as JSON with every non-ASCII character escaped: how a client sends a lone
    surrogate ("\\ud800"), which no UTF-8 encoder (httpx's ``json=``) takes."""
    return {"content": json.dumps(body).encode(), "headers": AS_JSON}


@dataclass
class Site:
    """A live server with one job and one registered worker."""

    server: LiveServer
    job_id: int
    task_id: int
    worker_id: int
    worker_token: str

    def client(self, role: str) -> httpx.Client:
        client = self.server.client("admin")
        if role == "own":
            client.headers["Authorization"] = f"Bearer {self.worker_token}"
        elif role != "admin":
            client.headers["Authorization"] = f"Bearer {self.server.tokens[role]}"
        return client


@pytest.fixture(scope="module", params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Site]:
    backend = str(request.param)
    with live_server(backend, tmp_path_factory.mktemp(f"bad_{backend}")) as server:
        with server.client("admin") as admin:
            created = admin.post("/api/v1/jobs", json=job())
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            task_id = admin.get(f"/api/v1/jobs/{job_id}").json()["tasks"][0]["id"]
        with server.client("worker") as worker:
            reg = worker.post("/api/v1/workers", json={"name": "w", "target": TARGET})
            assert reg.status_code == 201, reg.text
        answer = reg.json()
        yield Site(server, job_id, task_id, answer["id"],
                   answer.get("token") or server.tokens["worker"])


def table_counts(database_url: str) -> dict[str, int]:
    """Rows in every table of the database."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return {name: conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar_one()
                    for name in inspect(conn).get_table_names()}
    finally:
        engine.dispose()


# (what, method, path (may name {job}, {task}, {worker}), role, request kwargs, status,
#  a word the detail must hold or None)
Row = tuple[str, str, str, str, dict[str, Any], int, str | None]
W = "/api/v1/workers/{worker}"
ROWS: list[Row] = [
    # --- jobs: submit
    ("job target that does not read back", "POST", "/api/v1/jobs", "client",
     {"json": job(target=SPACED)}, 422, "target"),
    ("job target over 255 characters", "POST", "/api/v1/jobs", "client",
     {"json": job(target=LONG_TARGET)}, 422, "255"),
    ("job target with a NUL", "POST", "/api/v1/jobs", "client",
     {"json": job(target="opencl -model=a\x00b")}, 422, "control"),
    ("job target with a control character", "POST", "/api/v1/jobs", "client",
     {"json": job(target="opencl -model=a\x1bb")}, 422, "control"),
    ("job target with a lone surrogate", "POST", "/api/v1/jobs", "client",
     escaped(job(target="opencl -model=\ud800")), 422, "surrogate"),
    ("job target with a quote in a value", "POST", "/api/v1/jobs", "client",
     {"json": job(target="opencl -model=a\\\"b")}, 422, "target"),
    ("job target as an object with '=' in a name", "POST", "/api/v1/jobs", "client",
     {"json": job(target={"kind": "opencl", "options": [["mo=del", "x"]]})}, 422, "target"),
    ("early_stopping past 2^31", "POST", "/api/v1/jobs", "client",
     {"json": job(early_stopping=BIG)}, 422, "early_stopping"),
    ("early_stopping past 64 bits", "POST", "/api/v1/jobs", "client",
     {"json": job(early_stopping=2**70)}, 422, "early_stopping"),
    ("measure.timeout_s 1e300", "POST", "/api/v1/jobs", "client",
     {"json": job(measure={"timeout_s": 1e300})}, 422, "timeout_s"),
    ("measure.timeout_s Infinity", "POST", "/api/v1/jobs", "client",
     raw_job('"measure": {"timeout_s": Infinity}'), 422, "timeout_s"),
    ("measure.min_repeat_ms 1e400", "POST", "/api/v1/jobs", "client",
     raw_job('"measure": {"min_repeat_ms": 1e400}'), 422, "min_repeat_ms"),
    ("measure.number 10^12", "POST", "/api/v1/jobs", "client",
     {"json": job(measure={"number": 10**12})}, 422, "number"),
    ("measure.rtol NaN", "POST", "/api/v1/jobs", "client",
     raw_job('"measure": {"rtol": NaN}'), 422, "rtol"),
    ("args holding 1e400", "POST", "/api/v1/jobs", "client",
     {"content": json.dumps(job()).replace('"float32"]', '"float32", 1e400]', 1).encode(),
      "headers": AS_JSON}, 422, "finite"),
    ("template with a NUL", "POST", "/api/v1/jobs", "client",
     {"json": job(tasks=[{"template": "dense\x00", "args": DENSE_ARGS}])}, 422, "template"),
    ("template of 300 characters", "POST", "/api/v1/jobs", "client",
     {"json": job(tasks=[{"template": "t" * 300, "args": DENSE_ARGS}])}, 422, "template"),
    ("a workload key of 1,100 characters", "POST", "/api/v1/jobs", "client",
     {"json": job(tasks=[{"template": DENSE, "args": [*DENSE_ARGS, *["x" * 100] * 10]}])},
     422, "characters as JSON"),
    ("1001 tasks", "POST", "/api/v1/jobs", "client",
     {"json": job(tasks=[{"template": DENSE, "args": DENSE_ARGS}] * 1001)}, 422, "tasks"),
    ("tuner of 10 kB", "POST", "/api/v1/jobs", "client",
     {"json": job(tuner="x" * 10_000)}, 422, "tuner"),
    ("n_trial of 5000 digits", "POST", "/api/v1/jobs", "client",
     raw_job('"n_trial": ' + "9" * 5000), 400, None),
    ("JSON nested 100000 deep", "POST", "/api/v1/jobs", "client",
     {"content": b"[" * 100_000 + b"]" * 100_000, "headers": AS_JSON}, 400, None),
    ("body not UTF-8", "POST", "/api/v1/jobs", "client",
     {"content": b'{"target": "\xff\xfe"}', "headers": AS_JSON}, 400, None),
    ("body over 1 MiB", "POST", "/api/v1/jobs", "client",
     {"content": b" " * (1024 * 1024 + 1), "headers": AS_JSON}, 413, "1048576"),
    # --- jobs: list, follow, cancel
    ("jobs limit 10^20", "GET", "/api/v1/jobs?limit=100000000000000000000", "client", {},
     422, "limit"),
    ("job id past 2^31", "GET", f"/api/v1/jobs/{BIG}", "client", {}, 422, "job_id"),
    ("trials after past 2^31", "GET", "/api/v1/jobs/{job}/tasks/{task}/trials",
     "client", {"params": {"after": BIG}}, 422, "after"),
    ("trials limit -1", "GET", "/api/v1/jobs/{job}/tasks/{task}/trials", "client",
     {"params": {"limit": -1}}, 422, "limit"),
    ("task id past 64 bits", "GET", f"/api/v1/jobs/{{job}}/tasks/{2**64}/trials", "client",
     {}, 422, "task_id"),
    ("cancel job 0", "POST", "/api/v1/jobs/0/cancel", "client", {}, 422, "job_id"),
    ("cancel job past 2^31", "POST", f"/api/v1/jobs/{BIG}/cancel", "client", {}, 422,
     "job_id"),
    # --- workers
    ("register with a NUL in the name", "POST", "/api/v1/workers", "worker",
     {"json": {"name": "a\x00b", "target": TARGET}}, 422, "name"),
    ("register with a target that does not read back", "POST", "/api/v1/workers",
     "worker", {"json": {"name": "x", "target": SPACED}}, 422, "target"),
    ("register with a target over 255 characters", "POST", "/api/v1/workers", "worker",
     {"json": {"name": "x", "target": LONG_TARGET}}, 422, "target"),
    ("register with a NUL in the target", "POST", "/api/v1/workers", "worker",
     {"json": {"name": "x", "target": "opencl\x00"}}, 422, "target"),
    ("register with a lone surrogate in the target", "POST", "/api/v1/workers", "worker",
     escaped({"name": "x", "target": "opencl -model=\ud800"}), 422, "surrogate"),
    ("register with a device of 1000 characters", "POST", "/api/v1/workers", "worker",
     {"json": {"name": "x", "target": TARGET, "device": "d" * 1000}}, 422, "device"),
    ("register with a list body", "POST", "/api/v1/workers", "worker",
     {"json": ["x", TARGET]}, 422, "body"),
    ("lease max_trials past 2^31", "POST", W + "/lease", "own",
     {"json": {"max_trials": BIG}}, 422, "max_trials"),
    ("lease wait_s Infinity", "POST", W + "/lease", "own",
     {"content": b'{"wait_s": Infinity}', "headers": AS_JSON}, 422, "wait_s"),
    ("lease wait_s NaN", "POST", W + "/lease", "own",
     {"content": b'{"wait_s": NaN}', "headers": AS_JSON}, 422, "wait_s"),
    ("lease for a worker id past 2^31", "POST", f"/api/v1/workers/{BIG}/lease", "admin",
     {"json": {"wait_s": 0}}, 422, "worker_id"),
    ("heartbeat a trial id past 2^31", "POST", W + "/heartbeat", "own",
     {"json": {"trial_ids": [BIG]}}, 422, "trial_ids"),
    ("heartbeat trial_ids a string", "POST", W + "/heartbeat", "own",
     {"json": {"trial_ids": "1,2"}}, 422, "trial_ids"),
    ("results cost Infinity", "POST", W + "/results", "own", result("[Infinity]"), 422,
     "costs"),
    ("results cost 1e400", "POST", W + "/results", "own", result("[1e400]"), 422, "costs"),
    ("results cost -1", "POST", W + "/results", "own", result("[-1.0]"), 422, "costs"),
    ("results cost 0", "POST", W + "/results", "own", result("[0.0]"), 422, "costs"),
    ("results of 1001 costs", "POST", W + "/results", "own",
     result(json.dumps([1e-3] * 1001)), 422, "costs"),
    ("results timestamp 1e300", "POST", W + "/results", "own",
     {"content": result()["content"].replace(b'"timestamp": 1.0', b'"timestamp": 1e300'),
      "headers": AS_JSON}, 422, "timestamp"),
    ("results error_msg a lone surrogate", "POST", W + "/results", "own",
     result("[1e9]", 4, extra=', "error_msg": "\\ud800"'), 422, "error_msg"),
    ("results error_msg of 3000 characters", "POST", W + "/results", "own",
     result("[1e9]", 4, extra=', "error_msg": "' + "e" * 3000 + '"'), 422, "error_msg"),
    ("results info holding a lone surrogate", "POST", W + "/results", "own",
     {"content": result()["content"].replace(b"}]}", b', "info": {"worker": "\\ud800"}}]}'),
      "headers": AS_JSON}, 422, "info"),
    ("results error_no 42", "POST", W + "/results", "own", result(error_no=42), 422,
     "error_no"),
    ("results trial id past 2^31", "POST", W + "/results", "own", result(trial_id=BIG),
     422, "trial_id"),
    ("results body over 1 MiB", "POST", W + "/results", "own",
     {"content": b" " * (2 * 1024 * 1024), "headers": AS_JSON}, 413, "bytes"),
    ("release 5000 trial ids", "POST", W + "/release", "own",
     {"json": {"trial_ids": list(range(1, 5001))}}, 422, "trial_ids"),
    # --- records
    ("records target with a NUL", "GET", "/api/v1/records", "client",
     {"params": {"target": "cuda\x00"}}, 422, "target"),
    ("records template with a NUL", "GET", "/api/v1/records", "client",
     {"params": {"template": "x\x00"}}, 422, "template"),
    ("records template of 1000 characters", "GET", "/api/v1/records", "client",
     {"params": {"template": "t" * 1000}}, 422, "template"),
    ("records workload holding 1e400", "GET", "/api/v1/records", "client",
     {"params": {"template": DENSE, "workload": "[1e400]"}}, 422, "workload"),
    ("records workload nested 1500 deep", "GET", "/api/v1/records", "client",
     {"params": {"template": DENSE, "workload": "[" * 1500 + "]" * 1500}}, 422,
     "workload"),
    ("records limit 10^30", "GET", "/api/v1/records", "client",
     {"params": {"limit": 10**30}}, 422, "limit"),
    ("search workload with a NUL", "GET", "/api/v1/records/search", "client",
     {"params": {"workload": "1,64\x00"}}, 422, "workload"),
    ("search target over 255 characters", "GET", "/api/v1/records/search", "client",
     {"params": {"target": LONG_TARGET}}, 422, "target"),
    ("search target that does not read back", "GET", "/api/v1/records/search", "client",
     {"params": {"target": SPACED}}, 422, "target"),
    (f"best for {MAX_BEST_WORKLOADS + 1} workloads", "POST", "/api/v1/records/best", "client",
     {"json": {"target": TARGET, "workloads": [{"template": DENSE, "args": DENSE_ARGS}]
               * (MAX_BEST_WORKLOADS + 1)}}, 422, "workloads"),
    ("best target that does not read back", "POST", "/api/v1/records/best", "client",
     {"json": {"target": SPACED, "workloads": [{"template": DENSE, "args": DENSE_ARGS}]}},
     422, "target"),
    ("best target with a NUL", "POST", "/api/v1/records/best", "client",
     {"json": {"target": "cuda\x00", "workloads": [{"template": DENSE, "args": DENSE_ARGS}]}},
     422, "target"),
    ("best args holding Infinity", "POST", "/api/v1/records/best", "client",
     {"content": b'{"target": "cuda", "workloads": [{"template": "x", "args": [Infinity]}]}',
      "headers": AS_JSON}, 422, "finite"),
    ("import body over 32 MiB", "POST", "/api/v1/records/import", "client",
     {"content": b"#" * (32 * 1024 * 1024 + 1), "headers": TEXT}, 413, "33554432"),
    ("import body not UTF-8", "POST", "/api/v1/records/import", "client",
     {"content": b"\xff\xfe\n", "headers": TEXT}, 422, "body"),
    ("pretuned log of a target with a NUL", "GET", "/api/v1/logs/cuda%00", "client", {},
     422, "target"),
    ("pretuned log of a target with an escape", "GET", "/api/v1/logs/cuda%1b", "client",
     {}, 422, "target"),
    ("pretuned log of a target over 255 characters", "GET",
     "/api/v1/logs/cuda%20-model=" + "m" * 300, "client", {}, 422, "target"),
    ("pretuned log of a target that does not read back", "GET",
     "/api/v1/logs/opencl%20%22-model=a%20b%22", "client", {}, 422, "target"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_request(site: Site, row: Row) -> None:
    """Its 4xx, a one-line bounded detail, and nothing stored or changed in count."""
    _what, method, path, role, kwargs, status, word = row
    url = path.format(job=site.job_id, task=site.task_id, worker=site.worker_id)
    before = table_counts(site.server.database_url)
    with site.client(role) as client:
        response = client.request(method, url, **kwargs)
        assert response.status_code == status, (response.status_code, response.text[:500])
        body = response.json()
        assert set(body) == {"detail"} and isinstance(body["detail"], str), body
        detail = body["detail"]
        assert "\n" not in detail and len(detail) <= MAX_DETAIL_CHARS, detail
        if word is not None:
            assert word in detail, detail
        # the same connection still serves
        assert client.get("/healthz").status_code == 200
    assert table_counts(site.server.database_url) == before


def test_table_size() -> None:
    """The issue asks for at least 45 bad REST inputs, every endpoint among them."""
    assert len(ROWS) >= 45
    paths = {"/".join("N" if re.fullmatch(r"[0-9]+|\{\w+\}", part) else part
                      for part in r[2].split("?")[0].split("/")) for r in ROWS}
    for endpoint in ("/api/v1/jobs", "/api/v1/jobs/N", "/api/v1/jobs/N/tasks/N/trials",
                     "/api/v1/jobs/N/cancel", "/api/v1/workers", "/api/v1/workers/N/lease",
                     "/api/v1/workers/N/heartbeat", "/api/v1/workers/N/results",
                     "/api/v1/workers/N/release", "/api/v1/records", "/api/v1/records/search",
                     "/api/v1/records/best", "/api/v1/records/import"):
        assert endpoint in paths, endpoint
    assert any(p.startswith("/api/v1/logs/") for p in paths)


def test_import_refuses_lone_surrogates_and_keeps_the_rest(site: Site) -> None:
    """A lone surrogate ("\\ud800" in a line's JSON) anywhere a record keeps text refuses
    that line with a one-line reason; the body's other lines are stored, and the records
    read back."""
    good = {"input": [TARGET, "not_ours.gpu", [1, "x"], {}],
            "config": {"index": 0, "code_hash": None, "entity": []},
            "result": [[1e-3], 0, 0.1, 1.5e9], "version": 0.2, "tvm_version": "0.7.dev0"}

    def changed(where: str, value: Any) -> dict[str, Any]:
        line = json.loads(json.dumps(good))
        if where == "target":
            line["input"][0] = value
        elif where == "kwargs":
            line["input"][3] = {"k": value}
        else:
            line["info"] = {where: value}
        return line

    bad = [changed("target", "opencl -model=\ud800"), changed("kwargs", "\udfff"),
           changed("worker", "w\ud800"), changed("error_msg", "\ud800")]
    body = "\n".join(json.dumps(line) for line in [*bad, good])  # ASCII: "\\ud800" escapes
    with site.client("client") as client:
        answer = client.post("/api/v1/records/import", content=body.encode(), headers=TEXT)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["accepted"], answer.json()["refused"]) == (1, len(bad))
        for error in answer.json()["errors"]:
            assert "surrogate" in error["error"] and "\n" not in error["error"], error
        listed = client.get("/api/v1/records", params={"template": "not_ours.gpu"})
        assert listed.status_code == 200, listed.text
        assert [r["input"] for r in listed.json()["items"]] == [good["input"]]


def test_streamed_body_over_the_limit_is_413(site: Site) -> None:
    """A chunked body (no Content-Length) is counted as it arrives."""

    def chunks() -> Iterator[bytes]:
        for _ in range(3):
            yield b" " * (512 * 1024)

    before = table_counts(site.server.database_url)
    with site.client("client") as client:
        response = client.post("/api/v1/jobs", content=chunks(), headers=AS_JSON)
    assert response.status_code == 413, response.text
    assert table_counts(site.server.database_url) == before


# --------------------------------------------------------------------------------------
# 500s that keep the connection, 503s for outages


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` under uvicorn on a loopback port; yields its URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


RAISERS: dict[str, Callable[[], BaseException]] = {
    "bug": lambda: KeyError("oops"),
    "database": lambda: OperationalError("SELECT 1", {}, ConnectionRefusedError(
        "connection refused")),
    "redis": lambda: redis.ConnectionError("Error 111 connecting to 127.0.0.1:1"),
    "queue": lambda: QueueUnavailable("redis: connection refused"),
}


@pytest.fixture()
def unsound(tmp_path: Path) -> Iterator[str]:
    """The real app over SQLite, plus a route that raises what its path names."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    app = create_app(Settings(database_url=url, require_auth=False, run_scheduler=False))

    def boom(kind: str) -> None:
        raise RAISERS[kind]()

    app.add_api_route("/boom/{kind}", boom)
    with serving(app) as base:
        yield base
    app.state.engine.dispose()


def _local_port(response: httpx.Response) -> int:
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


@pytest.mark.parametrize(("kind", "status", "start"), [
    ("bug", 500, "internal error: KeyError; see the server log"),
    ("database", 503, "database unavailable: connection refused"),
    ("redis", 503, "queue unavailable: Error 111"),
    ("queue", 503, "queue unavailable: redis: connection refused"),
])
def test_errors_answer_json_and_keep_the_connection(unsound: str, kind: str, status: int,
                                                    start: str) -> None:
    """An unhandled error is a JSON 500 (an outage a 503) and the same connection serves
    the next request: uvicorn drops a connection whose app raised."""
    with httpx.Client(base_url=unsound, timeout=10) as client:
        first = client.get("/healthz")
        failed = client.get(f"/boom/{kind}")
        assert failed.status_code == status
        assert failed.json() == {"detail": failed.json()["detail"]}
        assert failed.json()["detail"].startswith(start), failed.text
        after = client.get("/healthz")
        assert after.status_code == 200
        assert _local_port(first) == _local_port(failed) == _local_port(after)


def test_readyz_and_a_database_outage() -> None:
    """/readyz checks the database and the queue; with PostgreSQL's database gone,
    /healthz stays 200, /readyz and requests answer 503 naming the database."""
    with postgres_database() as url:
        migrate(url)
        server = start_server(url, make_tokens(url))
        try:
            with server.client("client") as client:
                ready = client.get("/readyz")
                assert (ready.status_code, ready.json()) == (
                    200, {"status": "ok", "database": "ok", "queue": "ok"})
                import psycopg

                name = url.rsplit("/", 1)[1]
                with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                assert client.get("/healthz").status_code == 200
                ready = client.get("/readyz")
                assert ready.status_code == 503, ready.text
                assert ready.json()["status"] == "unavailable"
                assert ready.json()["queue"] == "ok"
                assert ready.json()["database"].startswith("unavailable: "), ready.text
                listed = client.get("/api/v1/jobs")
                assert listed.status_code == 503, listed.text
                assert listed.json()["detail"].startswith("database unavailable: "), listed.text
                assert "\n" not in listed.json()["detail"]
        finally:
            server.stop()


def test_readyz_names_a_queue_outage(tmp_path: Path) -> None:
    """Redis gone after startup: /readyz answers 503 with the queue's reason."""
    from tuner_server.queue.redis import RedisQueue

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    app = create_app(Settings(database_url=url, require_auth=False, run_scheduler=False))
    app.state.queue = RedisQueue(f"redis://127.0.0.1:{free_port()}/0")
    with serving(app) as base:
        ready = httpx.get(f"{base}/readyz", timeout=30)
    app.state.engine.dispose()
    assert ready.status_code == 503
    assert ready.json()["database"] == "ok"
    assert ready.json()["queue"].startswith("unavailable: "), ready.text


def test_server_refuses_to_start_without_its_queue(tmp_path: Path) -> None:
    """create_app pings the queue: Redis down is a clear error naming the URL, not a
    server that accepts jobs it cannot hand out."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    queue_url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    with pytest.raises(QueueUnavailable) as info:
        create_app(Settings(database_url=url, queue_url=queue_url, run_scheduler=False))
    message = str(info.value)
    assert "does not answer" in message and "secret" not in message, message
    assert f"127.0.0.1:{queue_url.rsplit(':', 1)[1]}" in message


# --------------------------------------------------------------------------------------
# Swagger UI offline


def test_docs_are_served_from_the_package(site: Site) -> None:
    """/docs and /redoc name no http(s) host; every script, style and icon they load
    answers 200 from this server."""
    with httpx.Client(base_url=site.server.url, timeout=30) as client:
        for page in ("/docs", "/redoc"):
            html = client.get(page)
            assert html.status_code == 200
            assert not re.search(r"https?://", html.text), html.text
            assets = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)["\']', html.text)
            assert assets, html.text
            for asset in assets:
                answer = client.get(asset)
                assert answer.status_code == 200 and len(answer.content) > 0, asset
        spec = client.get("/openapi.json")
        assert spec.status_code == 200 and "/api/v1/jobs" in spec.json()["paths"]

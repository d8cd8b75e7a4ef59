"""``tuner_client.TunerClient`` against the real app under uvicorn (SQLite): every method,
the mapping of 401/403/404/409/422/503 to exceptions carrying the server's message, and
retries: on connection refused (a server that starts late, a port with nothing) and on
503 (a database table briefly gone), never for a job submission that reached the server.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import LiveServer, free_port, live_server, tophub_paths

from schemas import MeasureErrorNo, MeasureOptions, MeasureResult, Target, Workload
from schemas.api import (
    FINAL,
    JobRequest,
    JobStatus,
    TaskStatus,
    TrialResult,
    WorkerRegistration,
)
from tuner_client import (
    MAX_500,
    ApiError,
    BadAnswer,
    Conflict,
    Invalid,
    NotFound,
    TunerClient,
    Unauthorized,
    Unavailable,
)

pytestmark = pytest.mark.timeout(180)

TARGET = "opencl -model=pocl-cpu"
DENSE = Workload(template="dense_small_batch.gpu",
                 args=[["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                       None, "float32"])
FAST = MeasureOptions(number=1, repeat=1, min_repeat_ms=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server("sqlite", tmp_path_factory.mktemp("client")) as live:
        yield live


def client(server: LiveServer, role: str | None = "admin", **kwargs: Any) -> TunerClient:
    return TunerClient(server.url, server.tokens[role] if role else None, **kwargs)


def plan(server: LiveServer) -> None:
    """One scheduler pass (the fixture's server runs none on its own)."""
    server._server.config.app.state.scheduler.run_pass()


def good(cost: float = 2e-5) -> MeasureResult:
    return MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                         timestamp=time.time())


def sqlite_path(server: LiveServer) -> str:
    return server.database_url.removeprefix("sqlite:///")


class Outage:
    """``table`` vanishes (the server answers 503, database unavailable) until
    ``seconds`` pass or :meth:`end`: a real outage, of one table."""

    def __init__(self, server: LiveServer, table: str, seconds: float) -> None:
        self.path, self.table = sqlite_path(server), table
        with sqlite3.connect(self.path) as db:
            db.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._restore, args=(seconds,), daemon=True)
        self._thread.start()

    def _restore(self, seconds: float) -> None:
        self._stop.wait(seconds)
        with sqlite3.connect(self.path, timeout=30) as db:
            db.execute(f"ALTER TABLE {self.table}_away RENAME TO {self.table}")

    def end(self) -> None:
        """Put the table back now (if it is not already) and wait until it is."""
        self._stop.set()
        self._thread.join(30)


# --------------------------------------------------------------------------- methods

def test_health_and_ready(server: LiveServer) -> None:
    with TunerClient(server.url) as anyone:
        assert anyone.health().status == "ok"
        ready = anyone.ready()
    assert (ready.status, ready.database, ready.queue) == ("ok", "ok", "ok")


def test_a_job_from_submission_to_results(server: LiveServer) -> None:
    """Submit, follow, lease, beat, report, release, deregister and cancel: each method
    returns the contract's models with what the server did."""
    with client(server, "client") as user, client(server, "worker") as worker:
        job_id = user.submit_job(JobRequest(target=Target.parse(TARGET), tasks=[DENSE],
                                            n_trial=4, plan_size=4, measure=FAST))
        listed = {j.id: j for j in user.jobs(limit=10)}
        assert listed[job_id].status is JobStatus.QUEUED
        assert listed[job_id].tasks[0].curve is None  # the list leaves curves out
        job = user.job(job_id)
        assert (job.target, job.n_trial, job.trials_total) == (TARGET, 4, 4)
        assert job.tasks[0].curve == [] and job.tasks[0].status is TaskStatus.QUEUED
        assert user.job(job_id, curves=False).tasks[0].curve is None
        with server.client("client") as raw:  # left out of the JSON, not null
            assert "curve" not in raw.get(f"/api/v1/jobs/{job_id}?curves=false"
                                          ).json()["tasks"][0]
            assert "curve" not in raw.get("/api/v1/jobs").json()[0]["tasks"][0]
        task_id = job.tasks[0].id

        plan(server)
        registered = worker.register_worker(WorkerRegistration(
            name="client-test", target=Target.parse(TARGET), device="PoCL CPU"))
        worker.use_token(registered.token)
        wid = registered.id
        leased = worker.lease(wid, max_trials=3, wait_s=1)
        assert len(leased.trials) == 3 and leased.lease_seconds > 0
        first, second, _third = leased.trials
        assert first.template == DENSE.template and first.target == TARGET
        assert MeasureOptions.model_validate(first.measure) == FAST
        assert worker.heartbeat(wid, [t.trial_id for t in leased.trials]) == 3

        done = worker.report_results(wid, [TrialResult(trial_id=first.trial_id,
                                                       result=good(), info={"x": 1})])
        assert (done.accepted, done.duplicates) == (1, 0)
        again = worker.report_results(wid, [TrialResult(trial_id=first.trial_id,
                                                        result=good())])
        assert (again.accepted, again.duplicates) == (0, 1)  # idempotent by trial id
        assert worker.release(wid, [second.trial_id]) == 1

        page = user.trials(job_id, task_id)
        assert page.task_id == task_id and page.trials_done == 1
        assert [(p.trial, p.id, p.error_no) for p in page.items] == [(1, first.trial_id, 0)]
        assert page.items[0].cost == pytest.approx(2e-5)
        assert user.trials(job_id, task_id, after=first.trial_id).items == []
        assert user.job(job_id).tasks[0].curve[0].trial == 1  # type: ignore[index]

        mine = {w.id: w for w in user.workers()}[wid]
        assert (mine.name, mine.device, mine.alive, mine.trials_done) == (
            "client-test", "PoCL CPU", True, 1)
        gone = worker.deregister(wid)
        assert (gone.id, gone.released) == (wid, 1)  # the third trial went back
        assert {w.id: w for w in user.workers()}[wid].stopped
        with pytest.raises(Unauthorized):
            worker.with_retries(0).lease(wid, wait_s=0)  # its token was revoked
        with client(server, "admin") as admin, pytest.raises(Conflict) as stopped:
            admin.lease(wid, wait_s=0)  # an admin's token may ask for it
        assert stopped.value.detail == f"worker {wid} deregistered; register again"

        cancelled = user.cancel_job(job_id)
        assert (cancelled.id, cancelled.status) == (job_id, JobStatus.CANCELLED)
        assert cancelled.status in FINAL
        assert user.cancel_job(job_id).status is JobStatus.CANCELLED  # harmless again


def test_records_import_search_best_and_pretuned_log(server: LiveServer) -> None:
    cuda_log = tophub_paths()[0]
    lines = [line for line in cuda_log.read_text().splitlines()
             if line.strip() and not line.startswith("#")][:30]
    with client(server, "client") as user:
        answer = user.import_records([*lines, "not json"])
        assert answer.accepted + answer.duplicates + answer.refused == 31
        assert answer.accepted > 0 and answer.refused >= 1
        assert answer.errors[-1].line == 31 and answer.errors[-1].error

        first = json.loads(lines[0])
        target = first["input"][0]
        workload = Workload(template=first["input"][1], args=first["input"][2])
        page = user.records(target="cuda", limit=5)
        assert page.total >= answer.accepted and len(page.items) == min(5, page.total)
        exact = user.records(target=target, workload=workload)
        assert exact.total >= 1
        assert all(r["input"][1] == workload.template for r in exact.items)
        assert len(list(user.iter_records(target="cuda"))) == page.total

        found = user.search_records(target="cuda", template=workload.template, limit=3)
        assert found.total >= 1 and found.items[0].template == workload.template
        assert user.search_records(workload="no-such-shape").total == 0

        [best] = user.best(target, [workload])
        assert best.workload == workload and best.record is not None
        assert best.rule

        log = user.pretuned_log(target)
        assert log.etag and log.text
        assert workload.template in log.text
        unchanged = user.pretuned_log(target, etag=log.etag)
        assert unchanged.text is None and unchanged.etag == log.etag


def test_the_servers_routes_answer_the_contracts_models(server: LiveServer) -> None:
    """The OpenAPI document names the contract's models, so the routes use them as
    their response models (and refusals as ErrorBody)."""
    doc = httpx.get(f"{server.url}/openapi.json", timeout=30).json()

    def answer(path: str, method: str, status: str = "200") -> str:
        content = doc["paths"][path][method]["responses"][status]["content"]
        schema = content["application/json"]["schema"]
        return json.dumps(schema)

    for path, method, model in [
            ("/api/v1/jobs", "get", "JobView"), ("/api/v1/jobs/{job_id}", "get", "JobView"),
            ("/api/v1/jobs/{job_id}/cancel", "post", "JobCancelled"),
            ("/api/v1/jobs/{job_id}/tasks/{task_id}/trials", "get", "TrialPage"),
            ("/api/v1/workers", "get", "WorkerInfo"),
            ("/api/v1/workers/{worker_id}", "delete", "Deregistered"),
            ("/api/v1/workers/{worker_id}/lease", "post", "LeaseAnswer"),
            ("/api/v1/workers/{worker_id}/heartbeat", "post", "HeartbeatAnswer"),
            ("/api/v1/workers/{worker_id}/results", "post", "ResultsAccepted"),
            ("/api/v1/workers/{worker_id}/release", "post", "Released"),
            ("/api/v1/records", "get", "RecordPage"),
            ("/api/v1/records/search", "get", "RecordSearchPage"),
            ("/api/v1/records/best", "post", "BestResponse"),
            ("/api/v1/records/import", "post", "ImportResponse")]:
        assert f"#/components/schemas/{model}" in answer(path, method), (path, model)
    assert "Registered" in answer("/api/v1/workers", "post", "201")
    assert "JobCreated" in answer("/api/v1/jobs", "post", "201")
    assert "ErrorBody" in answer("/api/v1/jobs/{job_id}", "get", "404")
    assert "ErrorBody" in answer("/api/v1/workers/{worker_id}/results", "post", "409")


# --------------------------------------------------------------------------- errors

def test_errors_carry_the_status_and_the_servers_message(server: LiveServer) -> None:
    with client(server, "client") as user:
        with pytest.raises(NotFound) as missing:
            user.job(999_999)
        assert missing.value.status == 404 and missing.value.detail == "job 999999 not found"
        assert "GET" in str(missing.value) and server.url in str(missing.value)

        with pytest.raises(Invalid) as invalid:
            user.submit_job(JobRequest(target=Target.parse(TARGET), tasks=[DENSE],
                                       tuner="no-such-tuner"))
        assert invalid.value.status == 422
        assert invalid.value.detail.startswith("tuner: unknown tuner 'no-such-tuner'")

        with pytest.raises(Unauthorized) as forbidden:  # a client may not register
            user.register_worker(WorkerRegistration(name="x", target=Target.parse(TARGET)))
        assert forbidden.value.status == 403 and "needs" in forbidden.value.detail

    with TunerClient(server.url) as anonymous, pytest.raises(Unauthorized) as no_token:
        anonymous.jobs()
    assert (no_token.value.status, no_token.value.detail) == (401, "missing bearer token")
    with TunerClient(server.url, "tun_client_wrong") as wrong, \
            pytest.raises(Unauthorized) as bad_token:
        wrong.workers()
    assert (bad_token.value.status, bad_token.value.detail) == (401, "unknown token")

    with client(server, "worker") as worker:
        registered = worker.register_worker(
            WorkerRegistration(name="conflicted", target=Target.parse(TARGET)))
        worker.use_token(registered.token)
        with pytest.raises(Conflict) as conflict:
            worker.heartbeat(registered.id, [999_999])
        assert conflict.value.status == 409
        assert conflict.value.detail == ("heartbeat refused, nothing extended: trial 999999 "
                                         "does not exist")
        worker.deregister(registered.id)


def test_503_is_retried_for_reads_and_raised_with_the_servers_message(
        server: LiveServer) -> None:
    with client(server, "client", retries=0) as impatient:
        down = Outage(server, "jobs", 60)
        try:
            with pytest.raises(Unavailable) as outage:
                impatient.jobs()
        finally:
            down.end()
    assert outage.value.status == 503
    assert outage.value.detail.startswith("database unavailable")
    assert "jobs" in outage.value.detail

    with client(server, "client", retries=8, backoff_s=0.1, max_backoff_s=0.4) as patient:
        down = Outage(server, "jobs", 0.5)
        started = time.monotonic()
        assert isinstance(patient.jobs(), list)  # retried until the table came back
        assert time.monotonic() - started >= 0.4
        down.end()


def test_a_job_submission_that_reached_the_server_is_not_retried(server: LiveServer) -> None:
    with client(server, "client", retries=8, backoff_s=0.1, max_backoff_s=0.4) as user:
        before = len(user.jobs(limit=1000))
        down = Outage(server, "jobs", 1.0)
        with pytest.raises(Unavailable) as outage:
            user.submit_job(JobRequest(target=Target.parse(TARGET), tasks=[DENSE]))
        down.end()
        assert outage.value.status == 503 and outage.value.sent
        assert len(user.jobs(limit=1000)) == before  # not sent again once the table was back


def test_nothing_listening_is_unavailable_after_bounded_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with TunerClient(url, retries=2, backoff_s=0.1) as nobody:
        started = time.monotonic()
        with pytest.raises(Unavailable) as down:
            nobody.jobs()
        elapsed = time.monotonic() - started
    assert down.value.status is None and down.value.sent is False
    assert f"GET {url}/api/v1/jobs: unreachable after 3 tries" in str(down.value)
    assert str(down.value).count(url) == 1
    assert 0.3 <= elapsed < 5  # 0.1 + 0.2 s of backoff, and nothing more


def test_a_server_that_starts_late_is_reached_by_retrying(tmp_path: Path) -> None:
    """The port refuses connections until the server starts 1 s later; even a job
    submission is retried then (it never reached a server)."""
    import uvicorn

    from tuner_server.app import create_app
    from tuner_server.settings import Settings

    with live_server("sqlite", tmp_path) as first:
        database_url, tokens = first.database_url, first.tokens
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app(Settings(database_url=database_url, require_auth=True))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    def start_late() -> None:
        time.sleep(1.0)
        server.run(sockets=[sock])

    thread = threading.Thread(target=start_late)
    thread.start()
    try:
        with TunerClient(url, tokens["client"], retries=10, backoff_s=0.1,
                         max_backoff_s=0.5) as user:
            started = time.monotonic()
            job_id = user.submit_job(JobRequest(target=Target.parse(TARGET), tasks=[DENSE]))
            assert time.monotonic() - started >= 0.9
            assert user.job(job_id).status not in FINAL
    finally:
        server.should_exit = True
        thread.join(15)
        app.state.engine.dispose()
        sock.close()


class _NotATuner(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"hello": "world"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_another_http_server_is_a_bad_answer() -> None:
    other = ThreadingHTTPServer(("127.0.0.1", 0), _NotATuner)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{other.server_address[1]}"
        with TunerClient(url) as confused, pytest.raises(BadAnswer) as bad:
            confused.jobs()
        assert bad.value.status == 200 and "a tuning server" in bad.value.detail
        assert isinstance(bad.value, ApiError)
    finally:
        other.shutdown()
        other.server_close()


class Scripted:
    """An httpx transport answering each request from ``script`` in turn (a status, or
    an exception to raise), repeating the last; counts the requests."""

    def __init__(self, *script: int | Exception) -> None:
        self.script, self.calls = list(script), 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, Exception):
            raise step
        body = {"trials": [], "lease_seconds": 60.0} if step == 200 else {"detail": "down"}
        return httpx.Response(step, json=body)


def scripted(script: Scripted, **kwargs: Any) -> TunerClient:
    api = TunerClient("http://tuner.test", backoff_s=0.01, **kwargs)
    api._http = httpx.Client(base_url=api.url, transport=httpx.MockTransport(script))
    return api


REFUSED = httpx.ConnectError("connection refused")


def test_a_lease_is_sent_again_only_when_it_never_reached_the_server() -> None:
    """A lease answered 503 (or timed out reading) may have leased trials: raised, not
    sent again, saying so; a refused connection is safe to resend."""
    for first, calls, sent in [(503, 1, True), (httpx.ReadTimeout("slow"), 1, True),
                               (REFUSED, 2, False)]:
        script = Scripted(first, 200)
        with scripted(script) as api:
            if sent:
                with pytest.raises(Unavailable) as down:
                    api.lease(1, wait_s=0)
                assert down.value.sent is True
            else:
                assert api.lease(1, wait_s=0).trials == []
        assert script.calls == calls, first


@pytest.mark.serial
def test_retrying_without_bound_ends_when_stopped() -> None:
    """``retries=None`` retries until ``stop`` (an event, or a callable) says to stop,
    checked during the backoff too: the last failure is raised promptly."""
    stop = threading.Event()
    script = Scripted(REFUSED)
    with scripted(script, retries=None, stop=stop, max_backoff_s=10.0) as api:
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(Unavailable) as down:
            api.jobs()
        assert 0.4 <= time.monotonic() - started < 3  # not the 10 s backoff
    assert down.value.sent is False and script.calls > 3

    deadline = time.monotonic() + 0.3
    with scripted(Scripted(503), retries=None,
                  stop=lambda: time.monotonic() > deadline) as api, \
            pytest.raises(Unavailable):
        api.workers()
    assert time.monotonic() - deadline < 1


def test_a_request_the_server_fails_on_is_raised_after_a_few_500s() -> None:
    script = Scripted(500)
    with scripted(script, retries=None) as api, pytest.raises(ApiError) as failed:
        api.jobs()
    assert failed.value.status == 500 and script.calls == MAX_500


def test_url_of_names_a_route() -> None:
    with TunerClient("http://tuner.test/") as api:
        assert api.url_of("records/best") == "http://tuner.test/api/v1/records/best"


def test_a_url_that_is_not_http_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="not an http"):
        TunerClient("127.0.0.1:8600")

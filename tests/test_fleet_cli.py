"""`tuner jobs`, `tuner job [--follow]`, `tuner workers`, `tuner cancel` against a live
server (real uvicorn on loopback, SQLite): tables, tuning-curve sparklines, a follow that
ends when its job does, and one clear line with exit 1 for every error a user can cause
(server down, bad token, unknown job), exit 2 for bad arguments, never a traceback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import LiveServer, free_port, live_server
from typer.testing import CliRunner

from cli import fleet
from cli.main import app
from schemas import MeasureErrorNo, MeasureResult
from schemas.api import FINAL, CurvePoint, JobStatus, JobView, LeasedTrial, WorkerInfo

pytestmark = pytest.mark.timeout(120)

runner = CliRunner()
TARGET = "opencl -model=pocl-cpu"  # the fake workers' target: nothing is ever measured
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs
WORKER_FIELDS = {"id", "name", "target", "device", "last_heartbeat", "alive",
                 "trials_per_minute", "error_rate", "trials_done"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server("sqlite", tmp_path_factory.mktemp("fleet_cli")) as server:
        yield server


@pytest.fixture(autouse=True)
def _cancel_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test's fake worker leases from the one queue all jobs share: cancel what a
    test left running so the next one leases only its own job's trials."""
    yield
    if "srv" not in request.fixturenames:
        return
    srv: LiveServer = request.getfixturevalue("srv")
    with srv.client("client") as http:
        for job in http.get("/api/v1/jobs").raise_for_status().json():
            if job["status"] not in FINAL:
                http.post(f"/api/v1/jobs/{job['id']}/cancel").raise_for_status()


def tuner(srv: LiveServer, *argv: str, role: str | None = "client",
          env: dict[str, str] | None = None) -> Any:
    """Run `tuner ARGV` against ``srv`` with a ``role`` token; never a traceback."""
    auth = ["--token", srv.tokens[role]] if role else []
    result = runner.invoke(app, [*argv, "--server", srv.url, *auth],
                           env={"COLUMNS": "200", "TUNER_TOKEN": "", **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception), result.output)
    assert "Traceback" not in result.output
    return result


class FakeWorker:
    """Plans (a scheduler pass by hand: the live server runs none), leases and reports
    through the worker API, as a worker process would."""

    def __init__(self, srv: LiveServer, name: str, device: str = "FakeCL 1.0") -> None:
        self.srv = srv
        self.http = srv.client("worker")
        answer = self.http.post("/api/v1/workers", json={
            "name": name, "target": TARGET, "device": device}).raise_for_status().json()
        self.id = int(answer["id"])
        # the registration's token speaks for this worker; the one it registered with
        # may only register
        self.http.headers["Authorization"] = f"Bearer {answer['token']}"

    def plan(self) -> None:
        self.srv._server.config.app.state.scheduler.run_pass()

    def measure(self, costs: list[float | None]) -> None:
        """Lease len(costs) trials and report them: a cost, or None for a failed build."""
        self.plan()
        trials = self.http.post(f"/api/v1/workers/{self.id}/lease",
                                json={"max_trials": len(costs), "wait_s": 0}
                                ).raise_for_status().json()["trials"]
        assert len(trials) == len(costs)
        results = []
        for trial, cost in zip(trials, costs):
            result = (MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR,
                                    all_cost=0.1) if cost is not None
                      else MeasureResult.failure(MeasureErrorNo.COMPILE_DEVICE, "fake error"))
            results.append({"trial_id": trial["trial_id"],
                            "result": result.model_dump(mode="json")})
        self.http.post(f"/api/v1/workers/{self.id}/results",
                       json={"results": results}).raise_for_status()
        self.plan()


def submit(srv: LiveServer, n_trial: int = 6) -> int:
    body = {"target": TARGET, "tasks": [{"template": DENSE, "args": DENSE_ARGS}],
            "n_trial": n_trial, "tuner": "random", "verify_top": 0,  # exact trial counts
            "measure": {"number": 1, "repeat": 1, "min_repeat_ms": 0}}
    with srv.client("client") as http:
        return int(http.post("/api/v1/jobs", json=body).raise_for_status().json()["id"])


def get_job(srv: LiveServer, job_id: int) -> dict[str, Any]:
    with srv.client("client") as http:
        job: dict[str, Any] = http.get(f"/api/v1/jobs/{job_id}").raise_for_status().json()
    return job


# ------------------------------------------------------------------ pure rendering

def test_sparkline() -> None:
    assert fleet.sparkline([]) == ""
    assert fleet.sparkline(range(1, 9)) == "▁▂▃▄▅▆▇█"  # type: ignore[arg-type]
    assert fleet.sparkline([None, None, 2.0, 4.0]) == "  ▁█"  # blank before a valid result
    assert fleet.sparkline([None, None]) == "  "
    assert fleet.sparkline([3.0, 3.0, 3.0]) == "███"  # flat: the best came first
    assert fleet.sparkline([5.0, 1.0, 3.0]) == "█▁▅"  # scaled min..max, rounded
    # squeezed: each cell the largest value of its stretch
    assert fleet.sparkline([1.0, 1.0, 2.0, 2.0, 3.0, 3.0, None, 9.0], width=4) == "▁▂▃█"
    assert fleet.sparkline([None, None, None, 1.0], width=2) == " █"
    assert len(fleet.sparkline([float(i) for i in range(1000)], width=32)) == 32
    assert fleet.sparkline([1.0, float("nan"), 2.0]) == "▁ █"
    with pytest.raises(ValueError):
        fleet.sparkline([1.0], width=0)


def test_curve_series_steps_the_best_so_far() -> None:
    curve = [CurvePoint(trial=2, best_cost=1.0, best_gflops=1.0),
             CurvePoint(trial=4, best_cost=0.5, best_gflops=3.0),
             CurvePoint(trial=5, best_cost=0.0, best_gflops=None)]  # a 0 s timer
    assert fleet.curve_series(curve, 5) == [None, 1.0, 1.0, 3.0, 3.0]
    assert fleet.curve_series([], 3) == [None, None, None]
    assert fleet.curve_series(curve, 0) == [None, 1.0, 1.0, 3.0]  # never shorter than it


def test_small_formatters() -> None:
    assert [fleet.duration(s) for s in (None, -1, 0, 59.4, 95, 3600 * 2 + 65, 90000)] == [
        "-", "-", "0s", "59s", "1m35s", "2h01m", "1d01h"]
    assert fleet.workload_text(DENSE_ARGS) == "1x256 64x256 - float32"
    assert fleet.workload_text([["TENSOR", [1, 16, 8, 8], "float32"], [1, 1],
                                [1, 1, 1, 1], "float32"]) == "1x16x8x8 1,1 1,1,1,1 float32"


def test_tables_show_what_the_server_gives() -> None:
    """Progress, ETA and the best are the server's figures (its progress counts a task
    that stopped early as complete); an ended job shows no ETA."""
    from rich.console import Console

    def text(renderable: Any) -> str:
        console = Console(width=200, record=True, file=open("/dev/null", "w"))
        console.print(renderable)
        return console.export_text()

    task = {"id": 1, "template": DENSE, "args": DENSE_ARGS, "status": "running",
            "trials_planned": 8, "n_trial": 8, "best_cost": None, "error": None}
    tasks = [{**task, "trials_done": 3, "best_gflops": 1.5},
             {**task, "id": 2, "trials_done": 1, "best_gflops": None}]
    running = JobView.model_validate({
        "id": 7, "status": "running", "tuner": "ga", "target": TARGET, "n_trial": 8,
        "early_stopping": None, "error": None, "created_at": None, "trials_done": 4,
        "trials_total": 16, "progress": 0.5, "eta_s": 95.0, "best_gflops": 2.25,
        "waiting_for_worker": False, "note": None, "tasks": tasks})
    row = text(fleet.jobs_table([running]))
    assert "4/16 (50%)" in row and "1m35s" in row and "2.25" in row and "ga" in row
    done = text(fleet.jobs_table([running.model_copy(update={"status": JobStatus.DONE})]))
    assert "1m35s" not in done and " - " in done
    view = text(fleet.job_view(running))
    assert "job 7 running" in view and "3/8" in view and "1x256 64x256 - float32" in view
    worker = {"id": 3, "name": "gpu-a", "target": "cuda -model=h200", "device": "H200",
              "last_heartbeat": 1000.0, "alive": True, "stopped": False,
              "trials_per_minute": 12.5, "error_rate": 0.25, "trials_done": 40}
    workers = [WorkerInfo.model_validate(worker), WorkerInfo.model_validate(
        {**worker, "id": 4, "name": "gpu-b", "target": "cuda", "device": "cuda",
         "last_heartbeat": 100.0, "alive": False, "trials_per_minute": 0.0,
         "error_rate": None, "trials_done": 0})]
    table = text(fleet.workers_table(workers, now=1005.0))
    for cell in ("gpu-a", "cuda -model=h200", "H200", "5s ago", "yes", "12.5", "25%",
                 "15m05s ago", "no"):
        assert cell in table, (cell, table)


# ------------------------------------------------------------------- live server

def test_jobs_and_job_show_progress_best_and_curve(srv: LiveServer) -> None:
    job_id = submit(srv, n_trial=6)
    worker = FakeWorker(srv, "curve")
    worker.measure([4e-5, None, 2e-5, 3e-5])  # best improves at trial 1, then trial 3
    job = get_job(srv, job_id)
    [task] = job["tasks"]
    assert task["trials_done"] == 4 and task["best_gflops"]
    best = f"{task['best_gflops']:.2f}"

    listing = tuner(srv, "jobs")
    assert listing.exit_code == 0, listing.output
    row = next(line for line in listing.stdout.splitlines() if f" {job_id} " in line)
    for cell in ("running", "4/6", best, "random", TARGET):
        assert cell in row, (cell, row)
    for header in ("id", "status", "progress", "ETA", "best GFLOP/s", "tuner", "target"):
        assert header in listing.stdout

    shown = tuner(srv, "job", str(job_id))
    assert shown.exit_code == 0, shown.output
    curve = fleet.sparkline(fleet.curve_series(
        [CurvePoint.model_validate(p) for p in task["curve"]], 4), 32)
    assert curve == "▁▁██"  # half as fast for two trials (one failed), then the best
    line = next(line for line in shown.stdout.splitlines() if DENSE in line)
    for cell in ("1x256 64x256 - float32", "4/6", best, curve):
        assert cell in line, (cell, line)
    assert f"job {job_id} running" in shown.stdout


def test_follow_ends_when_the_job_is_done(srv: LiveServer, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr(fleet, "REFRESH_S", 0.2)
    job_id = submit(srv, n_trial=3)
    worker = FakeWorker(srv, "finisher")
    worker.measure([3e-5])

    def finish() -> None:
        time.sleep(0.5)
        worker.measure([2e-5, 1e-5])  # the last trials; the pass marks the job done

    thread = threading.Thread(target=finish)
    thread.start()
    started = time.monotonic()
    result = tuner(srv, "job", str(job_id), "--follow")
    thread.join()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 20
    assert f"job {job_id} done" in result.stdout and "3/3" in result.stdout
    assert get_job(srv, job_id)["status"] == "done"


def test_follow_ends_when_the_job_is_cancelled(srv: LiveServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled from elsewhere: the view ends, exit 1 (the job did not finish)."""
    monkeypatch.setattr(fleet, "REFRESH_S", 0.2)
    job_id = submit(srv, n_trial=6)
    FakeWorker(srv, "canceller").plan()

    def cancel() -> None:
        time.sleep(0.5)
        with srv.client("client") as http:
            http.post(f"/api/v1/jobs/{job_id}/cancel").raise_for_status()

    thread = threading.Thread(target=cancel)
    thread.start()
    result = tuner(srv, "job", str(job_id), "--follow")
    thread.join()
    assert result.exit_code == 1, result.output
    assert f"job {job_id} cancelled" in result.stdout


def test_follow_leaves_cleanly_on_ctrl_c(srv: LiveServer, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.setattr(fleet, "REFRESH_S", 0.05)
    job_id = submit(srv, n_trial=2)
    calls = []
    real = fleet.FleetClient.job

    def job(self: fleet.FleetClient, jid: int) -> JobView:
        calls.append(jid)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, jid)

    monkeypatch.setattr(fleet.FleetClient, "job", job)
    result = tuner(srv, "job", str(job_id), "--follow")
    assert result.exit_code == 130, result.output
    assert f"stopped following job {job_id}" in result.stderr
    assert f"job {job_id} " in result.stdout  # the last view stays on the screen


def test_follow_rides_out_a_server_restart(srv: LiveServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The server stops answering for a while: the view says so and keeps polling; past
    RETRY_S it gives up with exit 1."""
    monkeypatch.setattr(fleet, "REFRESH_S", 0.05)
    job_id = submit(srv, n_trial=2)
    real = fleet.FleetClient.job
    calls = []

    def flaky(self: fleet.FleetClient, jid: int) -> JobView:
        calls.append(jid)
        if len(calls) in (2, 3):
            raise fleet.Unreachable("cannot reach the tuning server (test)")
        if len(calls) == 4:
            with srv.client("client") as http:
                http.post(f"/api/v1/jobs/{jid}/cancel").raise_for_status()
        return real(self, jid)

    monkeypatch.setattr(fleet.FleetClient, "job", flaky)
    result = tuner(srv, "job", str(job_id), "--follow")
    assert result.exit_code == 1 and len(calls) == 4, (calls, result.output)
    assert f"job {job_id} cancelled" in result.stdout

    monkeypatch.setattr(fleet, "RETRY_S", 0.2)
    job_id = submit(srv, n_trial=2)
    calls.clear()

    def down(self: fleet.FleetClient, jid: int) -> JobView:
        calls.append(jid)
        if len(calls) > 1:
            raise fleet.Unreachable("cannot reach the tuning server (test)")
        return real(self, jid)

    monkeypatch.setattr(fleet.FleetClient, "job", down)
    result = tuner(srv, "job", str(job_id), "--follow")
    assert result.exit_code == 1, result.output
    assert result.stderr == ("error: cannot reach the tuning server (test); check --server "
                             "(TUNER_SERVER) and that `tuner serve` runs there\n")
    assert 3 <= len(calls) < 20


def test_workers(srv: LiveServer) -> None:
    worker = FakeWorker(srv, "lister")
    submit(srv, n_trial=3)
    worker.measure([2e-5, None])  # one good, one failed: error rate 50% in the window
    with srv.client("client") as http:
        answer = http.get("/api/v1/workers")
    assert answer.status_code == 200, answer.text
    rows = {w["id"]: w for w in answer.json()}
    assert WORKER_FIELDS <= set(rows[worker.id]), rows[worker.id]
    result = tuner(srv, "workers")
    assert result.exit_code == 0, result.output
    for header in ("id", "name", "target", "device", "last heartbeat", "alive",
                   "trials/min", "error rate"):
        assert header in result.stdout
    row = next(line for line in result.stdout.splitlines() if " lister " in line)
    me = rows[worker.id]
    assert me["alive"] is True and me["error_rate"] == 0.5
    assert me["device"] == "FakeCL 1.0" and me["trials_done"] == 2
    for cell in (TARGET, "FakeCL 1.0", "s ago", "yes",
                 f"{me['trials_per_minute']:.1f}", "50%"):
        assert cell in row, (cell, row)


def test_cancel(srv: LiveServer) -> None:
    job_id = submit(srv, n_trial=4)
    result = tuner(srv, "cancel", str(job_id))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"job {job_id} cancelled"
    assert get_job(srv, job_id)["status"] == "cancelled"
    again = tuner(srv, "cancel", str(job_id))
    assert (again.exit_code, again.stdout.strip()) == (0, f"job {job_id} cancelled")


def test_env_vars_name_server_and_token(srv: LiveServer) -> None:
    result = runner.invoke(app, ["jobs"], env={"TUNER_SERVER": srv.url, "COLUMNS": "200",
                                               "TUNER_TOKEN": srv.tokens["client"]})
    assert result.exit_code == 0, result.output
    assert "progress" in result.stdout


@pytest.mark.parametrize("argv", [["jobs"], ["job", "1"], ["job", "1", "--follow"],
                                  ["workers"], ["cancel", "1"]])
def test_no_server_is_exit_1(argv: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = runner.invoke(app, [*argv, "--server", url, "--token", "x"])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: cannot reach the tuning server at {url}")
    assert "Traceback" not in result.output and result.stdout == ""


def test_errors_are_one_line_exit_1(srv: LiveServer) -> None:
    missing = 999_999
    for argv in (["job", str(missing)], ["job", str(missing), "--follow"],
                 ["cancel", str(missing)]):
        result = tuner(srv, *argv)
        assert result.exit_code == 1, (argv, result.output)
        assert result.stderr == f"error: job {missing} not found (on {srv.url})\n"

    bad = runner.invoke(app, ["jobs", "--server", srv.url, "--token", "tun_not_a_token"])
    assert bad.exit_code == 1 and "refused the token (401: unknown token)" in bad.stderr
    none = runner.invoke(app, ["workers", "--server", srv.url], env={"TUNER_TOKEN": ""})
    assert none.exit_code == 1 and "(401: missing bearer token)" in none.stderr
    worker = tuner(srv, "cancel", "1", role="worker")
    assert worker.exit_code == 1 and "forbidden (403: a worker token" in worker.stderr
    for out in (bad, none, worker):
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.output


def test_bad_arguments_are_exit_2(srv: LiveServer) -> None:
    for argv in (["job", "abc"], ["job", "0"], ["cancel"], ["jobs", "--limit", "0"]):
        assert tuner(srv, *argv).exit_code == 2, argv
    result = runner.invoke(app, ["jobs", "--server", "127.0.0.1:8600"])
    assert result.exit_code == 2
    assert "--server: '127.0.0.1:8600' is not an http:// or https:// URL" in result.stderr


def test_a_server_that_is_not_a_tuner_is_exit_1(tmp_path: Path) -> None:
    """Some other web server at --server: a clear line, not a JSON or key error."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>hi"))
    client = fleet.FleetClient("http://example.invalid", None)
    client.api._http = httpx.Client(base_url="http://example.invalid", transport=transport)
    with pytest.raises(fleet.FleetError, match="did not answer JSON"):
        client.jobs()
    transport = httpx.MockTransport(lambda request: httpx.Response(404, json={
        "detail": "Not Found"}))
    client.api._http = httpx.Client(base_url="http://example.invalid", transport=transport)
    with pytest.raises(fleet.FleetError, match="has no GET /api/v1/workers"):
        client.workers()


# ------------------------------------------------------------------ the worker agent

class FakeMeasurer:
    """Stands in for the agent's measuring child: its 2nd trial raises (as
    ``timeout_s=1e300`` once did in the real one), the others measure 20 us."""

    def __init__(self) -> None:
        from compiler.runtime import DeviceInfo
        from schemas import DeviceLimits, Target

        self.device_info = DeviceInfo(spec="opencl:0", name="FakeCL 1.0", platform="fake",
                                      target=Target.parse(TARGET), limits=DeviceLimits())
        self.calls = 0

    def start(self) -> Any:
        return self.device_info

    def measure(self, _request: Any) -> MeasureResult:
        self.calls += 1
        if self.calls == 2:
            raise OverflowError("timeout value is too large")
        return MeasureResult(costs=(2e-5,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1)

    def close(self) -> None:
        pass


def test_agent_survives_a_trial_that_raises_and_deregisters(tmp_path: Path) -> None:
    """The agent registers with a register-only token and works with the one the answer
    hands it; a trial whose measuring raises is recorded with its error number and the
    worker goes on; a clean stop deregisters it (`tuner workers`: not alive)."""
    from server_fixtures import make_tokens, migrate, start_server
    from sqlalchemy import create_engine, text

    from workers.agent import WorkerAgent

    url = f"sqlite:///{tmp_path / 'agent.db'}"
    migrate(url)
    server = start_server(url, make_tokens(url), run_scheduler=True)
    try:
        agent = WorkerAgent(server.url, server.tokens["worker"], name="agent-test",
                            wait_s=0.5)
        agent._measurer = FakeMeasurer()  # type: ignore[assignment]
        bad = agent.measure_trial(LeasedTrial.model_validate(
            {**_trial(1), "measure": {"timeout_s": -1}}))
        assert bad.error_no == MeasureErrorNo.INSTANTIATION_ERROR, bad
        assert bad.error_msg and "timeout_s" in bad.error_msg
        job_id = submit(server, n_trial=4)
        assert agent.run(max_trials=4) == 4
        deadline = time.time() + 30  # the scheduler's next pass ends the job
        while (job := get_job(server, job_id))["status"] != "done" and time.time() < deadline:
            time.sleep(0.1)
        assert (job["status"], job["tasks"][0]["trials_done"]) == ("done", 4), job
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                errors = sorted(conn.execute(text("SELECT error_no FROM records")).scalars())
        finally:
            engine.dispose()
        assert errors == [0, 0, 0, MeasureErrorNo.INSTANTIATION_ERROR], errors
        result = tuner(server, "workers", role="admin")
        row = next(line for line in result.stdout.splitlines() if " agent-test " in line)
        assert " no " in row, row
    finally:
        server.stop()


def _tune_on(srv: LiveServer, *extra: str) -> Any:
    return tuner(srv, "tune", "--target", TARGET, "--template", DENSE, "--args",
                 json.dumps(DENSE_ARGS), "--tuner", "random", "--number", "1", "--repeat",
                 "1", "--min-repeat-ms", "0", *extra)


def test_tune_exits_1_with_the_error_counts_when_every_trial_failed(
        srv: LiveServer) -> None:
    """A job whose trials all failed ends `failed`: `tune` says why in one line, exit 1."""
    worker = FakeWorker(srv, "all-fail")

    def fail_everything() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = [j for j in get_jobs(srv) if j["status"] not in FINAL]
            if jobs:
                worker.measure([None, None, None])
                return
            time.sleep(0.05)

    thread = threading.Thread(target=fail_everything)
    thread.start()
    result = _tune_on(srv, "--trials", "3")
    thread.join(30)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "failed: all 3 trials failed: 3 x error 3" in errors[0], errors[0]


def test_a_job_waiting_for_a_worker_says_so(srv: LiveServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """No live worker serves the job's target: `tuner job` shows the server's note and
    `tune` warns once on stderr (then Ctrl-C cancels the job in one line, exit 130)."""
    from cli import tune as tune_cli

    body = {"target": "cuda -model=h200", "tasks": [{"template": DENSE, "args": DENSE_ARGS}],
            "n_trial": 2, "measure": {"number": 1, "repeat": 1, "min_repeat_ms": 0}}
    with srv.client("client") as http:
        job_id = int(http.post("/api/v1/jobs", json=body).raise_for_status().json()["id"])
    job = get_job(srv, job_id)
    assert job["waiting_for_worker"] is True and job["note"], job
    result = tuner(srv, "job", str(job_id))
    assert result.exit_code == 0, result.output
    assert "note: no live worker serves" in " ".join(result.stdout.split())

    monkeypatch.setattr(tune_cli, "WAITING_WARN_S", 0.0)
    real_sleep = time.sleep
    naps: list[float] = []

    def sleep(seconds: float) -> None:  # Ctrl-C once the warning had its chance
        naps.append(seconds)
        if len(naps) > 3:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(tune_cli.time, "sleep", sleep)
    result = tuner(srv, "tune", "--target", "cuda -model=h200", "--template", DENSE,
                   "--args", json.dumps(DENSE_ARGS), "--trials", "2")
    assert result.exit_code == 130, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("warning: job ") and "is waiting: no live worker" in lines[0]
    cancelled = int(lines[0].split()[2])
    assert lines[1] == f"interrupted: job {cancelled} cancelled"
    assert get_job(srv, cancelled)["status"] == "cancelled"


def get_jobs(srv: LiveServer) -> list[dict[str, Any]]:
    with srv.client("client") as http:
        rows: list[dict[str, Any]] = http.get("/api/v1/jobs").raise_for_status().json()
    return rows


class ScriptedServer:
    """The worker API as an httpx transport that answers from a script and records every
    call: (method, path, the Authorization header)."""

    def __init__(self, answers: dict[str, list[tuple[int, Any]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, str]] = []
        self.bodies: list[Any] = []  # each call's JSON body (None without one)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append((request.method, path, request.headers.get("authorization", "")))
        self.bodies.append(json.loads(request.content) if request.content else None)
        key = f"{request.method} {path.rsplit('/', 1)[-1] if path.count('/') > 4 else path}"
        script = self.answers.get(key) or [(200, _ok(request.method, path))]
        status, body = script.pop(0) if len(script) > 1 else script[0]
        return httpx.Response(status, json=body)

    def sent(self, suffix: str) -> list[Any]:
        """The bodies of the calls to paths ending with ``suffix``, in order."""
        return [body for (_, path, _), body in zip(self.calls, self.bodies, strict=True)
                if path.endswith(suffix)]


def _ok(method: str, path: str) -> dict[str, Any]:
    """The answer of a worker call that the script leaves to succeed."""
    tail = path.rsplit("/", 1)[-1]
    if method == "DELETE":
        return {"id": int(tail), "released": 0}
    return {"heartbeat": {"extended": 1}, "release": {"released": 1},
            "results": ACCEPTED}.get(tail, {})


ACCEPTED = {"accepted": 1, "duplicates": 0}


def _trial(trial_id: int) -> dict[str, Any]:
    return {"trial_id": trial_id, "task_id": 1, "template": DENSE, "args": DENSE_ARGS,
            "config": {"index": 0, "entity": []}, "target": TARGET,
            "measure": {"number": 1, "repeat": 1}, "lease_deadline": None}


def _leased(*trial_ids: int, lease_seconds: float = 120.0) -> dict[str, Any]:
    return {"trials": [_trial(i) for i in trial_ids], "lease_seconds": lease_seconds}


def _scripted_agent(answers: dict[str, list[tuple[int, Any]]],
                    quiet: threading.Lock | None = None) -> tuple[Any, ScriptedServer]:
    from workers.agent import WorkerAgent

    server = ScriptedServer(answers)
    agent = WorkerAgent("http://tuner.test", "bootstrap-token", name="scripted", wait_s=0,
                        quiet=quiet)
    agent._api._http = httpx.Client(base_url="http://tuner.test", transport=httpx.MockTransport(
        server), headers={"Authorization": "Bearer bootstrap-token"})
    agent._measurer = FakeMeasurer()  # type: ignore[assignment]
    agent._measurer.calls = 2  # past the trial that raises
    return agent, server


def test_agent_rides_out_503_drops_a_409_and_deregisters() -> None:
    """Registration and a lease answered 503 are made again; the answer's token is used
    from then on; a result refused with 409 (no longer ours) is dropped without stopping
    the worker; a clean end releases what it holds, deregisters and closes the client."""
    agent, server = _scripted_agent({
        "POST /api/v1/workers": [(503, {"detail": "database unavailable: test"}),
                                 (201, {"id": 7, "token": "tok-7"})],
        "POST lease": [(503, {"detail": "database unavailable: test"}),
                       (200, _leased(1, 2))],
        "POST results": [(409, {"detail": "trial 1 is not leased to worker 7"}),
                         (200, ACCEPTED)],
    })
    assert agent.run(max_trials=2) == 2
    paths = [(m, p) for m, p, _ in server.calls]
    assert paths.count(("POST", "/api/v1/workers")) == 2
    assert paths.count(("POST", "/api/v1/workers/7/results")) == 2
    assert paths.count(("POST", "/api/v1/workers/7/lease")) == 2
    assert paths[-1] == ("DELETE", "/api/v1/workers/7")
    assert agent._api._http.is_closed
    assert {auth for _, p, auth in server.calls if p.startswith("/api/v1/workers/7")} == {
        "Bearer tok-7"}


def test_agent_holds_quiet_while_it_measures_and_not_while_it_calls_the_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded fleet's lock, which the server's planning waits for: held through
    each measurement, free through every call to the server (a result's report, whose
    next pass plans on it, included) and once the worker stops."""
    quiet = threading.Lock()
    agent, _server = _scripted_agent({
        "POST /api/v1/workers": [(201, {"id": 7, "token": "tok-7"})],
        "POST lease": [(200, _leased(1, 2))],
        "POST results": [(200, ACCEPTED), (200, ACCEPTED)],
    }, quiet)
    seen: list[tuple[str, bool]] = []
    measure, answer = agent._measurer.measure, ScriptedServer.__call__

    def measuring(request: Any) -> MeasureResult:
        seen.append(("measure", quiet.locked()))
        return measure(request)

    def serving(server: ScriptedServer, request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path.rsplit("/", 1)[-1], quiet.locked()))
        return answer(server, request)

    agent._measurer.measure = measuring
    monkeypatch.setattr(ScriptedServer, "__call__", serving)
    assert agent.run(max_trials=2) == 2
    assert [s for s in seen if s[0] in ("measure", "results")] == [
        ("measure", True), ("results", False)] * 2
    assert not any(held for what, held in seen if what != "measure")
    assert not quiet.locked()


def test_a_result_says_the_layout_its_kernel_was_timed_in() -> None:
    """A CPU conv's record keeps the activations' layout its trial was timed in (its
    cost is of that kernel: records timed before have none); a stem's 3 channels are
    read plain; a template without a choice of layout says nothing."""
    from compiler.runtime.measure import MeasureRequest, timed_layout
    from compiler.templates import get_template
    from schemas import Config, Workload

    def request(template: str, c: int, k: int, size: int, kernel: int) -> MeasureRequest:
        workload = Workload(template=template, args=[
            ["TENSOR", [1, c, size, size], "float32"], ["TENSOR", [k, c, kernel, kernel],
                                                        "float32"],
            [1, 1], [kernel // 2] * 4, [1, 1], "NCHW", "NCHW", "float32"])
        return MeasureRequest(template, workload,
                              get_template(template).default_config(workload))

    conv = request("conv2d_NCHWc.x86", 64, 128, 14, 3)
    oc_bn = get_template(conv.template).out_block(conv.workload, conv.config)
    assert timed_layout(conv) == f"NCHW16c->NCHW{oc_bn}c"
    stem = request("conv2d_NCHWc.x86", 3, 64, 32, 7)
    assert timed_layout(stem) == (
        f"NCHW->NCHW{get_template(stem.template).out_block(stem.workload, stem.config)}c")
    dense = Workload(template=DENSE, args=DENSE_ARGS)
    unknown = Config(index=0, entity=[])
    assert timed_layout(MeasureRequest(DENSE, dense, unknown)) is None
    assert timed_layout(MeasureRequest("no_such_template", dense, unknown)) is None


def test_agent_whose_token_is_revoked_stops_saying_so(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    """A result answered 401 (the token was revoked, or another process registered as
    this worker) stops the worker with one log line saying so: the error escapes the
    loop, which neither releases the lease nor deregisters (both would be refused);
    the leases expire and count as attempts."""
    from tuner_client import Unauthorized

    agent, server = _scripted_agent({
        "POST /api/v1/workers": [(201, {"id": 8, "token": "tok-8"})],
        "POST lease": [(200, _leased(1, 2))],
        "POST results": [(401, {"detail": "unknown token"})],
    })
    with pytest.raises(Unauthorized):
        agent.run()
    methods = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in server.calls]
    assert ("POST", "release") not in methods and ("DELETE", "8") not in methods, methods
    assert methods.count(("POST", "results")) == 1, methods
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("no longer accepts this worker's token" in m and "401" in m for m in said), said


def test_agent_drops_a_result_the_server_refuses_and_goes_on() -> None:
    """A result refused with 422 is reported failed instead; a 409 on that report, or
    a 404 on another trial's, drops the trial; the worker goes on and ends cleanly."""
    agent, server = _scripted_agent({
        "POST /api/v1/workers": [(201, {"id": 7, "token": "tok-7"})],
        "POST lease": [(200, _leased(1, 2, 3))],
        "POST results": [(422, {"detail": "costs: must be finite"}),
                         (409, {"detail": "trial 1 is queued, not leased to worker 7"}),
                         (404, {"detail": "worker 7 is not registered"}),
                         (200, ACCEPTED)],
    })
    assert agent.run(max_trials=3) == 3
    reported = [body["results"][0] for body in server.sent("/results")]
    assert [r["trial_id"] for r in reported] == [1, 1, 2, 3]
    assert [r["result"]["error_no"] for r in reported] == [0, MeasureErrorNo.UNKNOWN_ERROR,
                                                            0, 0]
    assert server.calls[-1][:2] == ("DELETE", "/api/v1/workers/7")


def test_agent_registers_again_when_told_it_is_deregistered() -> None:
    """A lease answered 409 "deregistered; register again": the agent registers again,
    with the token it was started with, and serves on with the new id and token."""
    agent, server = _scripted_agent({
        "POST /api/v1/workers": [(201, {"id": 7, "token": "tok-7"}),
                                 (201, {"id": 9, "token": "tok-9"})],
        "POST lease": [(409, {"detail": "worker 7 deregistered; register again"}),
                       (200, _leased(1))],
        "POST results": [(200, ACCEPTED)],
    })
    assert agent.run(max_trials=1) == 1
    registrations = [auth for m, p, auth in server.calls if p == "/api/v1/workers"]
    assert registrations == ["Bearer bootstrap-token"] * 2
    assert ("POST", "/api/v1/workers/9/results", "Bearer tok-9") in server.calls
    assert server.calls[-1][:2] == ("DELETE", "/api/v1/workers/9")


class BlockingMeasurer(FakeMeasurer):
    """Its first trial measures until the measurer is closed (as killing the child
    ends a measurement); the others measure 20 us."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = threading.Event()

    def measure(self, _request: Any) -> MeasureResult:
        self.calls += 1
        if self.calls == 1 and not self.closed.wait(20):
            raise AssertionError("the measurement in hand was never stopped")
        return MeasureResult(costs=(2e-5,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1)

    def close(self) -> None:
        self.closed.set()


def test_agent_stops_measuring_a_trial_a_heartbeat_says_is_not_ours() -> None:
    """A heartbeat answered 409 (nothing extended): the agent beats each trial alone to
    learn which is no longer its own, kills that one's measurement and reports nothing
    for it; the other trial is measured and reported."""
    agent, server = _scripted_agent({
        "POST /api/v1/workers": [(201, {"id": 7, "token": "tok-7"})],
        "POST lease": [(200, _leased(1, 2, lease_seconds=0.3))],
        "POST heartbeat": [(409, {"detail": "heartbeat refused: trial 1 is queued"}),
                           (409, {"detail": "heartbeat refused: trial 1 is queued"}),
                           (200, {"extended": 1})],
        "POST results": [(200, ACCEPTED)],
    })
    agent._measurer = BlockingMeasurer()
    assert agent.run(max_trials=1) == 1
    beats = [body["trial_ids"] for body in server.sent("/heartbeat")]
    assert beats[:3] == [[1, 2], [1], [2]], beats
    assert [body["results"][0]["trial_id"] for body in server.sent("/results")] == [2]


def test_a_stopping_agent_gives_up_reporting_after_about_a_lease(
        caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM while the server is down: the result in hand is retried for about the
    server's lease, then dropped (its lease expires), and the worker exits."""
    agent, server = _scripted_agent({
        "POST /api/v1/workers": [(201, {"id": 7, "token": "tok-7"})],
        "POST lease": [(200, _leased(1, lease_seconds=0.5))],
        "POST results": [(503, {"detail": "database unavailable: test"})],
    })

    class SignalledMeasurer(FakeMeasurer):
        def measure(self, _request: Any) -> MeasureResult:
            agent.stopping.set()  # SIGTERM arrives mid-trial
            return super().measure(_request)

    agent._measurer = SignalledMeasurer()
    start = time.monotonic()
    agent.run()
    assert time.monotonic() - start < 5
    reports = [p for _, p, _ in server.calls if p.endswith("/results")]
    assert len(reports) >= 2, server.calls
    said = [r.getMessage() for r in caplog.records]
    assert any("could not be reported while stopping" in m for m in said), said

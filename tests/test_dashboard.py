"""The dashboard's server side: the data endpoints it calls (workers with their pace and
error rate, jobs with progress/ETA/best, a task's trials incrementally, records search),
their auth, the static files at / and /static, the DOM contract the browser tests rely
on, and how fast each endpoint answers over 100,000 records and a 1,000-trial task."""

from __future__ import annotations

import json
import re
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import BACKENDS, empty_database, make_tokens, migrate
from sqlalchemy import create_engine, insert, inspect, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from compiler.templates import get_template
from schemas import MeasureErrorNo, MeasureResult, Workload
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "tuner_server" / "dashboard"
FAKE_TARGET = "opencl -model=pocl-cpu"
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]  # 9 configs: the divisors of 256
FAST = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
DENSE_FLOPS = get_template(DENSE).flops(Workload(template=DENSE, args=DENSE_ARGS))


def result(cost: float | None = 2e-5, error_no: int = 0) -> dict[str, Any]:
    """A worker's measure result: ``cost`` seconds, or a failure with ``error_no``."""
    if error_no:
        res = MeasureResult.failure(MeasureErrorNo(error_no), f"error {error_no} on purpose")
    else:
        res = MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1)
    return res.model_dump(mode="json")


@dataclass
class Api:
    """An app (scheduler off: passes run by hand) over a fresh SQLite file."""

    client: Any
    app: Any
    tokens: dict[str, str]
    db: Engine

    def call(self, method: str, path: str, role: str | None = "client",
             **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        headers.update(kwargs.pop("headers", {}))
        response: httpx.Response = self.client.request(method, path, headers=headers, **kwargs)
        return response

    def ok(self, method: str, path: str, role: str = "client", **kwargs: Any) -> Any:
        response = self.call(method, path, role, **kwargs)
        assert response.status_code in (200, 201), (path, response.status_code, response.text)
        return response.json()

    def submit(self, n_trial: int, plan_size: int = 16) -> int:
        body = {"target": FAKE_TARGET, "tasks": [{"template": DENSE, "args": DENSE_ARGS}],
                "n_trial": n_trial, "plan_size": plan_size, "measure": FAST}
        return int(self.ok("POST", "/api/v1/jobs", json=body)["id"])

    def register(self, name: str, device: str | None = None) -> int:
        """Register with the fleet's worker token; keep the worker's own token (its
        later calls need it) under ``worker <id>``."""
        body: dict[str, Any] = {"name": name, "target": FAKE_TARGET}
        if device:
            body["device"] = device
        answer = self.ok("POST", "/api/v1/workers", role="worker", json=body)
        self.tokens[f"worker {answer['id']}"] = answer["token"]
        return int(answer["id"])

    def lease(self, worker_id: int, n: int) -> list[int]:
        trials = self.ok("POST", f"/api/v1/workers/{worker_id}/lease",
                         role=f"worker {worker_id}",
                         json={"max_trials": n, "wait_s": 0})["trials"]
        return [t["trial_id"] for t in trials]

    def report(self, worker_id: int, trial_id: int, res: dict[str, Any]) -> None:
        answer = self.ok("POST", f"/api/v1/workers/{worker_id}/results",
                         role=f"worker {worker_id}",
                         json={"results": [{"trial_id": trial_id, "result": res}]})
        assert answer["accepted"] == 1, answer

    def run_pass(self) -> None:
        self.app.state.scheduler.run_pass()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_api(tmp_path: Path, backend: str) -> Iterator[Callable[[], Api]]:
    """Apps over fresh databases of ``backend`` (PostgreSQL skips where it is not
    running); everything is disposed of after the test."""
    from fastapi.testclient import TestClient

    from tuner_server.app import create_app
    from tuner_server.settings import Settings

    with ExitStack() as stack:
        def make() -> Api:
            url = stack.enter_context(empty_database(backend, tmp_path))
            migrate(url)
            tokens = make_tokens(url)
            app = create_app(Settings(database_url=url, require_auth=True, run_scheduler=False))
            stack.callback(app.state.engine.dispose)
            db = create_engine(url, poolclass=NullPool)
            stack.callback(db.dispose)
            return Api(TestClient(app, raise_server_exceptions=False), app, tokens, db)

        yield make


# --------------------------------------------------------------------------------------
# A small fleet: one job half measured (with failures), one untouched, two workers.

# (cost or None, error_no) in the order the worker reports them
REPORTS = [(4e-5, 0), (None, 3), (2e-5, 0), (3e-5, 0), (None, 5), (1e-5, 0)]


@dataclass
class Seeded:
    api: Api
    job: int
    task: int
    other_job: int
    busy: int  # worker that measured REPORTS
    idle: int  # worker last seen long ago
    trial_ids: list[int]  # in report order


@pytest.fixture
def seeded(make_api: Callable[[], Api]) -> Seeded:
    api = make_api()
    job = api.submit(n_trial=8, plan_size=8)
    other = api.submit(n_trial=4)
    api.run_pass()
    busy = api.register("gpu-box:opencl:0", device="Fake PoCL device")
    idle = api.register("old-box:opencl:0")
    leased = api.lease(busy, 6)
    assert len(leased) == 6
    # report out of lease order: the curve follows the order results were stored
    order = [leased[i] for i in (2, 0, 5, 1, 4, 3)]
    for trial_id, (cost, error_no) in zip(order, REPORTS):
        api.report(busy, trial_id, result(cost, error_no))
        time.sleep(0.01)
    with Session(api.db) as session, session.begin():
        session.execute(update(WorkerRow).where(WorkerRow.id == idle)
                        .values(last_seen=time.time() - 3600))
        task = session.scalars(select(TaskRow.id).where(TaskRow.job_id == job)).one()
    return Seeded(api, job, task, other, busy, idle, order)


def test_workers_endpoint(seeded: Seeded) -> None:
    """Each worker's target, device, heartbeat, alive and stopped flags, trials/min and
    error rate over the last 10 minutes, and its trials done; a deregistered worker
    shows stopped and not alive, its figures kept."""
    rows = {w["id"]: w for w in seeded.api.ok("GET", "/api/v1/workers")}
    assert set(rows) == {seeded.busy, seeded.idle}
    busy, idle = rows[seeded.busy], rows[seeded.idle]
    assert busy["name"] == "gpu-box:opencl:0" and busy["target"] == FAKE_TARGET
    assert busy["device"] == "Fake PoCL device"
    assert idle["device"] == "pocl-cpu"  # none registered: the target's model
    assert busy["alive"] is True and idle["alive"] is False
    assert abs(busy["last_heartbeat"] - time.time()) < 60
    assert busy["trials_per_minute"] == pytest.approx(6 / 10)
    assert busy["error_rate"] == pytest.approx(2 / 6)
    assert busy["trials_done"] == 6
    assert idle["trials_per_minute"] == 0 and idle["error_rate"] is None
    assert idle["trials_done"] == 0
    assert busy["stopped"] is False and idle["stopped"] is False
    gone = seeded.api.ok("DELETE", f"/api/v1/workers/{seeded.busy}",
                         role=f"worker {seeded.busy}")
    assert gone == {"id": seeded.busy, "released": 0}
    busy = {w["id"]: w for w in seeded.api.ok("GET", "/api/v1/workers")}[seeded.busy]
    assert (busy["alive"], busy["stopped"], busy["trials_done"]) == (False, True, 6)


def test_workers_window_is_ten_minutes(seeded: Seeded) -> None:
    """Results stored more than 10 minutes ago count as done but not in the pace."""
    old = datetime.now(timezone.utc) - timedelta(minutes=11)
    with Session(seeded.api.db) as session, session.begin():
        session.execute(update(RecordRow).where(RecordRow.trial_id.in_(seeded.trial_ids[:3]))
                        .values(created_at=old))
    busy = {w["id"]: w for w in seeded.api.ok("GET", "/api/v1/workers")}[seeded.busy]
    assert busy["trials_per_minute"] == pytest.approx(3 / 10)
    assert busy["error_rate"] == pytest.approx(1 / 3)  # error 5 is recent, error 3 is not
    assert busy["trials_done"] == 6


def test_jobs_rows_have_progress_eta_and_best(seeded: Seeded) -> None:
    jobs = {j["id"]: j for j in seeded.api.ok("GET", "/api/v1/jobs")}
    job, other = jobs[seeded.job], jobs[seeded.other_job]
    # the fields the list always had
    for key in ("id", "target", "status", "tuner", "n_trial", "early_stopping", "error",
                "created_at", "tasks"):
        assert key in job
    assert job["trials_done"] == 6 and job["trials_total"] == 8
    assert job["progress"] == pytest.approx(6 / 8)
    assert job["eta_s"] is not None and 0 < job["eta_s"] < 60
    best = DENSE_FLOPS / 1e-5 / 1e9
    assert job["best_gflops"] == pytest.approx(best)
    [task] = job["tasks"]
    assert task["best_gflops"] == pytest.approx(best) and task["trials_done"] == 6
    assert "curve" not in task
    # nothing measured: no rate, no ETA
    assert other["progress"] == 0 and other["eta_s"] is None and other["best_gflops"] is None
    # the single job carries the same figures, and its curve unless asked not to
    single = seeded.api.ok("GET", f"/api/v1/jobs/{seeded.job}")
    assert single["progress"] == job["progress"] and single["best_gflops"] == job["best_gflops"]
    assert [p["trial"] for p in single["tasks"][0]["curve"]] == [1, 3, 6]
    assert "curve" not in seeded.api.ok("GET", f"/api/v1/jobs/{seeded.job}",
                                        params={"curves": "false"})["tasks"][0]
    # cancelled: no ETA; an early-finished task counts as complete
    seeded.api.ok("POST", f"/api/v1/jobs/{seeded.other_job}/cancel")
    other = {j["id"]: j for j in seeded.api.ok("GET", "/api/v1/jobs")}[seeded.other_job]
    assert other["status"] == "cancelled" and other["eta_s"] is None
    with Session(seeded.api.db) as session, session.begin():
        session.execute(update(TaskRow).where(TaskRow.id == seeded.task).values(status="done"))
        session.execute(update(JobRow).where(JobRow.id == seeded.job).values(status="done"))
    job = {j["id"]: j for j in seeded.api.ok("GET", "/api/v1/jobs")}[seeded.job]
    assert job["progress"] == 1.0 and job["eta_s"] == 0.0


def test_task_trials_in_order_and_incrementally(seeded: Seeded) -> None:
    path = f"/api/v1/jobs/{seeded.job}/tasks/{seeded.task}/trials"
    page = seeded.api.ok("GET", path)
    assert page["task_id"] == seeded.task and page["trials_done"] == 6
    items = page["items"]
    assert [p["trial"] for p in items] == [1, 2, 3, 4, 5, 6]
    assert [p["id"] for p in items] == seeded.trial_ids
    assert [p["error_no"] for p in items] == [e for _, e in REPORTS]
    for point, (cost, error_no) in zip(items, REPORTS):
        if error_no:
            assert point["gflops"] is None and point["cost"] is None
        else:
            assert point["cost"] == pytest.approx(cost)
            assert point["gflops"] == pytest.approx(DENSE_FLOPS / cost / 1e9)
    # each trial carries its own stored line, the object GET /records pages return
    stored = seeded.api.ok("GET", "/api/v1/records", params={"limit": 1000})["items"]
    assert all(point["record"] in stored for point in items)
    assert [p["record"]["result"][1] for p in items] == [e for _, e in REPORTS]
    assert len({json.dumps(p["record"], sort_keys=True) for p in items}) == len(items)
    newer = seeded.api.ok("GET", path, params={"after": seeded.trial_ids[2]})["items"]
    assert newer == items[3:]
    # without records (the dashboard's chart): the same points, no record key
    bare = seeded.api.ok("GET", path, params={"records": "false"})["items"]
    assert bare == [{k: v for k, v in p.items() if k != "record"} for p in items]
    bare = seeded.api.ok("GET", path, params={"records": "false", "after": seeded.trial_ids[2]})
    assert bare["items"] == [{k: v for k, v in p.items() if k != "record"} for p in items[3:]]
    assert seeded.api.ok("GET", path, params={"after": seeded.trial_ids[-1]})["items"] == []
    assert seeded.api.ok("GET", path, params={"limit": 2})["items"] == items[:2]
    # a trial of no task, or not measured yet: 422 naming `after`
    bad = seeded.api.call("GET", path, params={"after": 999_999})
    assert bad.status_code == 422 and "after" in bad.json()["detail"]
    # a task of another job: 404
    missing = seeded.api.call("GET", f"/api/v1/jobs/{seeded.other_job}/tasks/{seeded.task}/trials")
    assert missing.status_code == 404


def _config(template: str, args: list[Any], index: int) -> dict[str, Any]:
    """Point ``index`` of the template's space, as a record line holds it (an import
    refuses a config that is not a point of the space)."""
    space = get_template(template).space(Workload(template=template, args=args))
    config: dict[str, Any] = space.get(index).to_json()
    return config


def _line(target: str, template: str, args: list[Any], cost: float | None, index: int,
          error_no: int = 0) -> str:
    costs = [cost] if cost is not None else [1e9]
    return json.dumps({"input": [target, template, args, {}],
                       "config": _config(template, args, index),
                       "result": [costs, error_no, 0.1, 1700000000.0 + index],
                       "version": 0.2, "tvm_version": "0.19.dev0"})


def test_records_search(make_api: Callable[[], Api]) -> None:
    """Filters by target (kind or model), template and a workload-key substring; the best
    view keeps the rule's first record per (device model, workload), here the cheapest
    working one, with GFLOP/s and knobs; the plain view lists every record, newest first."""
    api = make_api()
    other_args = [["TENSOR", [1, 512], "float32"], ["TENSOR", [128, 512], "float32"],
                  None, "float32"]
    lines = [
        _line("cuda -model=h200", DENSE, DENSE_ARGS, 3e-5, 1),
        _line("cuda -model=h200", DENSE, DENSE_ARGS, 1e-5, 2),  # the best on h200
        _line("cuda -model=h200", DENSE, DENSE_ARGS, None, 3, error_no=4),
        _line("cuda -model=a100", DENSE, DENSE_ARGS, 2e-5, 4),
        _line("cuda -model=h200", DENSE, other_args, 5e-5, 5),
        _line("opencl -model=pocl-cpu", DENSE, DENSE_ARGS, 9e-5, 6),
        _line("cuda -model=h200", "dense_large_batch.gpu", DENSE_ARGS, 4e-5, 7),
    ]
    assert api.ok("POST", "/api/v1/records/import", content="\n".join(lines),
                  headers={"content-type": "text/plain"})["accepted"] == 7

    def search(**params: Any) -> dict[str, Any]:
        page: dict[str, Any] = api.ok("GET", "/api/v1/records/search", params=params)
        return page

    page = search(target="cuda -model=h200", template=DENSE, workload="1,256")
    assert page["total"] == 1
    [row] = page["items"]
    assert row["config"]["index"] == 2 and row["target"] == "cuda -model=h200"
    assert row["template"] == DENSE and row["args"] == DENSE_ARGS
    assert row["cost"] == pytest.approx(1e-5)
    assert row["gflops"] == pytest.approx(DENSE_FLOPS / 1e-5 / 1e9)
    assert row["knobs"] == {name: value for name, _kind, value
                            in _config(DENSE, DENSE_ARGS, 2)["entity"]}
    assert row["knobs"]["tile_k"][0] == -1
    assert "[1,256]" in row["workload_key"]
    # a bare kind: one best per model
    assert {r["target"] for r in search(target="cuda", template=DENSE,
                                        workload="[1,256]")["items"]} == {
        "cuda -model=h200", "cuda -model=a100"}
    assert search(target="cuda")["total"] == 4  # h200 x2 workloads, a100, large_batch
    assert search(workload="128,512")["total"] == 1
    assert search(workload="%")["total"] == 0  # LIKE wildcards are escaped
    assert search(workload="TENSOR\",[1,512")["total"] == search(workload="tensor\",[1,512")[
        "total"] == 1  # any case, on every backend
    assert search()["total"] == 5
    every = search(best="false", target="cuda -model=h200", template=DENSE)
    assert every["total"] == 4
    assert [r["config"]["index"] for r in every["items"]] == [5, 3, 2, 1]  # newest first
    failed = [r for r in every["items"] if r["error_no"]]
    assert failed[0]["gflops"] is None and failed[0]["cost"] is None
    assert [r["config"]["index"] for r in search(best="false", limit=2, offset=1)["items"]
            ] == [6, 5]
    bad = api.call("GET", "/api/v1/records/search", params={"target": "cuda model=x"})
    assert bad.status_code == 422 and "target" in bad.json()["detail"]
    # the pretuned log the dashboard links to
    log = api.call("GET", "/api/v1/logs/cuda%20-model=h200")
    assert log.status_code == 200 and len(log.text.splitlines()) == 3


DASHBOARD_ENDPOINTS = [
    ("GET", "/api/v1/workers"),
    ("GET", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs/{job}"),
    ("GET", "/api/v1/jobs/{job}/tasks/{task}/trials"),
    ("GET", "/api/v1/jobs/{job}/model"),
    ("GET", "/api/v1/records/search"),
    ("GET", "/api/v1/logs/cuda"),
    ("POST", "/api/v1/jobs/{job}/cancel"),
]


@pytest.mark.parametrize("method,path", DASHBOARD_ENDPOINTS)
def test_dashboard_endpoints_need_a_client_token(seeded: Seeded, method: str,
                                                 path: str) -> None:
    path = path.format(job=seeded.job, task=seeded.task)
    api = seeded.api
    assert api.call(method, path, role=None).status_code == 401
    bogus = api.client.request(method, path, headers={"Authorization": "Bearer tun_client_x"})
    assert bogus.status_code == 401
    for worker in ("worker", f"worker {seeded.busy}"):  # the fleet's token, a worker's own
        status = api.call(method, path, role=worker).status_code
        assert status == (200 if path.startswith("/api/v1/logs") else 403), worker
    assert api.call(method, path, role="client").status_code == 200
    assert api.call(method, path, role="admin").status_code == 200


# --------------------------------------------------------------------------------------
# The static dashboard

# The DOM contract the browser tests use: the page skeletons in index.html carry the
# fixed elements, app.js builds the rows with these classes and attributes.
HTML_SELECTORS = [
    'id="token"', 'id="save-token"', 'table id="jobs"', 'table id="workers"',
    'form id="records-search"', 'name="target"', 'name="template"', 'name="workload"',
    'type="submit"', 'table id="records"', 'class="download-log"', 'href="#/jobs"',
    'href="#/workers"', 'href="#/records"', 'src="/static/app.js"',
    'href="/static/style.css"',
]
JS_FRAGMENTS = [
    'localStorage', '"tuner_token"', 'params.get("token")', "Authorization",
    "Bearer", '"data-job-id"', 'class: "status"', 'class: "progress"', 'class: "eta"',
    'class: "best"', 'class: "cancel"', "/cancel`", 'method: "POST"', 'class: "job-link"',
    "#/jobs/${job.id}", 'class: "curve"', '"data-task-id"', '"data-points"',
    'svg("path", { class: "best"', 'svg("circle", { class: "trial"', 'class: "trial failed"',
    '"data-error-no"', "trials?records=false", "&after=", '"data-worker-id"',
    'toggle("alive"', 'class: "target"',
    'class: "device"', 'class: "heartbeat"', 'class: "rate"', 'class: "errors"',
    'class: "record"', 'class: "workload"', 'class: "template"', 'class: "gflops"',
    'class: "knobs"', "/api/v1/logs/", "createObjectURL", 'dataset.loaded = "1"',
    "JOBS_REFRESH_MS = 2000", "JOB_REFRESH_MS = 1000",
]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_dashboard_is_served_without_a_token(make_api: Callable[[], Api]) -> None:
    api = make_api()
    index = api.call("GET", "/", role=None)
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    missing = [s for s in HTML_SELECTORS if s not in index.text]
    assert not missing, missing
    for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        asset = api.call("GET", f"/static/{name}", role=None)
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
        assert asset.text == (DASHBOARD / name).read_text()
    js = (DASHBOARD / "app.js").read_text()
    missing = [s for s in JS_FRAGMENTS if s not in js]
    assert not missing, missing
    # no CDN, no external fetches: every URL the page loads is the server's own
    for text in (index.text, js, (DASHBOARD / "style.css").read_text()):
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
        assert "@import" not in text and "cdn" not in text.lower()
    assert api.call("GET", "/static/nope.js", role=None).status_code == 404


def test_dashboard_files_are_package_data() -> None:
    """An installed (non-editable) package ships every dashboard file."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["tuner_server"]
    files = [p.relative_to(DASHBOARD.parent).as_posix() for p in DASHBOARD.iterdir()]
    assert files and all(any(fnmatch(f, g) for g in globs) for f in files), (files, globs)


def test_migration_adds_the_dashboard_indexes(make_api: Callable[[], Api]) -> None:
    api = make_api()
    inspector = inspect(api.db)
    trials = {i["name"]: i["column_names"] for i in inspector.get_indexes("trials")}
    records = {i["name"]: i["column_names"] for i in inspector.get_indexes("records")}
    assert trials["ix_trials_worker"] == ["worker_id", "status"]
    assert records["ix_records_created_at"] == ["created_at"]
    assert "device" in {c["name"] for c in inspector.get_columns("workers")}


# --------------------------------------------------------------------------------------
# The model view: a job from a model (its name, each task's layers)

DENSE2_ARGS: list[Any] = [["TENSOR", [1, 128], "float32"], ["TENSOR", [64, 128], "float32"],
                          None, "float32"]


def submit_model(api: Api, n_trial: int = 4, **extra: Any) -> Any:
    body = {"target": FAKE_TARGET, "n_trial": n_trial, "plan_size": 4, "measure": FAST,
            "tasks": [{"template": DENSE, "args": DENSE_ARGS},
                      {"template": DENSE, "args": DENSE2_ARGS}],
            "model": "net.onnx", "layers": [["fc1", "fc3"], ["fc2"]], **extra}
    return api.call("POST", "/api/v1/jobs", json=body)


def test_model_view_estimates_the_models_latency(make_api: Callable[[], Api]) -> None:
    """Per task: its layers and count, the default config's cost (the first planned),
    the best, speed-up, failures, share of sum(best x layers); tasks by share; the
    estimate once both tasks have a working trial, falling with each improvement, the
    default build's from the defaults; the job view names the model and layers."""
    api = make_api()
    job = int(submit_model(api).json()["id"])
    api.run_pass()
    worker = api.register("gpu-box:opencl:0")
    leased = api.lease(worker, 8)
    assert len(leased) == 8
    with Session(api.db) as session:
        rows = session.execute(select(TrialRow.id, TrialRow.task_id, TrialRow.config_index)
                               .where(TrialRow.id.in_(leased)).order_by(TrialRow.id)).all()
        tasks = list(session.scalars(select(TaskRow.id).where(TaskRow.job_id == job)
                                     .order_by(TaskRow.id)))
    a, b = [[r for r in rows if r.task_id == t] for t in tasks]
    defaults = [get_template(DENSE).default_config(Workload(template=DENSE, args=args)).index
                for args in (DENSE_ARGS, DENSE2_ARGS)]
    assert a[0].config_index == defaults[0] and b[0].config_index == defaults[1]
    # (trial, cost or None, error_no) in the order reported: A's default, B's default, ...
    plan = [(a[0], 4e-5, 0), (b[0], 2e-5, 0), (a[1], None, 3), (a[2], 3e-5, 0),
            (b[1], 1e-5, 0), (a[3], 1e-5, 0), (b[2], 3e-5, 0), (b[3], None, 5)]
    for trial, cost, error_no in plan:
        api.report(worker, trial.id, result(cost, error_no))
    view = api.ok("GET", f"/api/v1/jobs/{job}/model")
    assert (view["model"], view["trials_done"], view["tasks_measured"]) == ("net.onnx", 8, 2)
    latency = 1e-5 * 2 + 1e-5 * 1
    assert view["latency_s"] == pytest.approx(latency)
    assert view["default_latency_s"] == pytest.approx(4e-5 * 2 + 2e-5)
    assert view["speedup"] == pytest.approx((4e-5 * 2 + 2e-5) / latency)
    assert view["error_counts"] == {"3": 1, "5": 1}
    first, second = view["tasks"]
    assert [first["id"], second["id"]] == tasks  # A: 2 layers, the larger share
    assert first["layers"] == ["fc1", "fc3"] and first["layer_count"] == 2
    assert second["layers"] == ["fc2"] and second["layer_count"] == 1
    assert first["default_cost"] == pytest.approx(4e-5)
    assert first["best_cost"] == pytest.approx(1e-5)
    assert first["speedup"] == pytest.approx(4.0)
    assert first["best_gflops"] == pytest.approx(DENSE_FLOPS / 1e-5 / 1e9)
    assert (first["errors"], first["error_counts"]) == (1, {"3": 1})
    assert (second["errors"], second["error_counts"]) == (1, {"5": 1})
    assert first["share"] == pytest.approx(2 / 3) and second["share"] == pytest.approx(1 / 3)
    assert [p["trial"] for p in first["curve"]] == [1, 3, 4]  # the task's own trial numbers
    # the estimate from report 2 (both tasks working) at each change of it
    assert [p["trial"] for p in view["curve"]] == [2, 4, 5, 6]
    assert [p["latency_s"] for p in view["curve"]] == pytest.approx(
        [4e-5 * 2 + 2e-5, 3e-5 * 2 + 2e-5, 3e-5 * 2 + 1e-5, 1e-5 * 2 + 1e-5])
    times = [p["at_s"] for p in view["curve"]]
    assert times == sorted(times) and all(t >= 0 for t in times)
    assert view["elapsed_s"] >= times[-1]
    shown = api.ok("GET", f"/api/v1/jobs/{job}")
    assert shown["model"] == "net.onnx"
    assert [t["layers"] for t in shown["tasks"]] == [["fc1", "fc3"], ["fc2"]]
    assert api.call("GET", "/api/v1/jobs/999/model").status_code == 404


@pytest.mark.parametrize("backend", ["sqlite"])
def test_model_view_before_every_task_works(make_api: Callable[[], Api]) -> None:
    """Until every task has a working trial there is no estimate, no curve and no share
    over the ones missing; a job of tasks without layers counts each as one layer."""
    api = make_api()
    job = api.submit(n_trial=4, plan_size=4)
    view = api.ok("GET", f"/api/v1/jobs/{job}/model")
    assert view["model"] is None and view["curve"] == [] and view["latency_s"] is None
    [task] = view["tasks"]
    assert (task["layers"], task["layer_count"], task["share"]) == ([], 1, None)
    other = int(submit_model(api).json()["id"])
    api.run_pass()
    worker = api.register("gpu-box:opencl:0")
    leased = api.lease(worker, 12)
    with Session(api.db) as session:
        first = session.scalars(select(TrialRow.id).join(TaskRow).where(
            TaskRow.job_id == other).order_by(TrialRow.id)).first()
    assert first in leased
    api.report(worker, first, result(2e-5))
    view = api.ok("GET", f"/api/v1/jobs/{other}/model")
    assert (view["tasks_measured"], view["latency_s"], view["curve"]) == (1, None, [])
    assert view["default_latency_s"] is None
    measured, missing = view["tasks"]
    assert measured["best_cost"] == pytest.approx(2e-5) and missing["best_cost"] is None
    assert missing["share"] is None


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("change,field", [
    ({"layers": [["fc1"]]}, "layers"),
    ({"layers": [["fc1"], []]}, "layers"),
    ({"layers": [["fc1"], ["x" * 256]]}, "layers"),
    ({"layers": [["fc1"], ["a\x00b"]]}, "layers"),
    ({"model": ""}, "model"),
    ({"model": "m" * 256}, "model"),
])
def test_model_job_fields_are_checked(make_api: Callable[[], Api], change: dict[str, Any],
                                      field: str) -> None:
    api = make_api()
    answer = submit_model(api, **change)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["detail"]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_dashboard_info_and_the_read_only_local_dashboard(make_api: Callable[[], Api],
                                                          tmp_path: Path) -> None:
    """The fleet's server asks for a token; `tuner dashboard`'s app over the same
    database answers reads without one and refuses every write (405, one line)."""
    from fastapi.testclient import TestClient

    from tuner_server.local_dashboard import create_dashboard_app

    api = make_api()
    job = int(submit_model(api).json()["id"])
    assert api.ok("GET", "/api/v1/dashboard", role=None) == {"token_required": True,
                                                              "read_only": False}
    app = create_dashboard_app(str(api.db.url))
    try:
        local = TestClient(app)
        assert local.get("/api/v1/dashboard").json() == {"token_required": False,
                                                         "read_only": True}
        assert local.get("/api/v1/jobs").json()[0]["model"] == "net.onnx"
        assert local.get(f"/api/v1/jobs/{job}/model").status_code == 200
        assert local.get("/").status_code == 200
        for method, path in (("POST", f"/api/v1/jobs/{job}/cancel"), ("POST", "/api/v1/jobs"),
                             ("POST", "/api/v1/workers"), ("DELETE", "/api/v1/workers/1"),
                             ("POST", "/api/v1/records/import")):
            answer = local.request(method, path, json={})
            assert answer.status_code == 405, (method, path, answer.text)
            assert "read-only" in answer.json()["detail"]
        assert api.ok("GET", f"/api/v1/jobs/{job}")["status"] == "queued"  # not cancelled
    finally:
        app.state.engine.dispose()


def test_token_in_a_query_is_kept_out_of_the_access_log() -> None:
    """An old /?token= link's token is written as token=*** in uvicorn's access log."""
    import logging

    from tuner_server.access_log import TokenRedactor, redact_token

    assert redact_token("/?token=tun_client_abc#x") == "/?token=***#x"
    assert redact_token("/x?a=1&token=s3cret&b=2") == "/x?a=1&token=***&b=2"
    assert redact_token("/api/v1/jobs?limit=5") == "/api/v1/jobs?limit=5"
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/?token=tun_client_abc", "1.1", 200), None)
    assert TokenRedactor().filter(record)
    assert "tun_client_abc" not in record.getMessage() and "token=***" in record.getMessage()


def test_imported_records_of_templates_not_here_get_gflops() -> None:
    """TopHub's conv2d/conv1d transpose and batch_matmul records: FLOPs from their
    arguments (the multiply-adds that touch the input), so the search shows GFLOP/s."""
    from tuner_server.services.records import workload_flops

    conv_t = [["TENSOR", [1, 512, 1, 128], "float32"], ["TENSOR", [512, 1, 1, 512], "float32",
              [0, 0]], [1, 128], [0, 256, 0, 256], "float32"]
    assert workload_flops("conv2d_transpose_nchw.cuda", conv_t) == 2 * 512 * 128 * 1 * 512
    conv1d_t = [["TENSOR", [1, 257, 128], "float32"], ["TENSOR", [257, 1, 512], "float32"],
                [128], [256], "float32", [0]]
    assert workload_flops("conv1d_transpose_nchw.cuda", conv1d_t) == 2 * 257 * 128 * 512
    bmm = [["TENSOR", [4, 128, 20], "float32"], ["TENSOR", [4, 64, 20], "float32"]]
    assert workload_flops("batch_matmul.cuda", bmm) == 2 * 4 * 128 * 64 * 20
    assert workload_flops("batch_matmul.cuda", [["TENSOR", [4, 128, 20], "float32"]]) is None
    assert workload_flops("batch_matmul.cuda", [bmm[0], ["TENSOR", [4, 64, 21], "float32"]]
                          ) is None
    assert workload_flops("conv3d_ncdhw.cuda", conv_t) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_to_model_jobs_keeps_stored_jobs(backend: str, tmp_path: Path) -> None:
    """Migration 0006_model over a database at 0005 with a job: the job and its task
    stay, without a model or layers (the dashboard counts such a task as one layer);
    new jobs store both."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config as AlembicConfig

    import migrations
    from tuner_server.db.session import make_engine

    def alembic(url: str, revision: str) -> None:
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        finally:
            engine.dispose()

    with empty_database(backend, tmp_path) as url:
        alembic(url, "0005")
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(
                    "INSERT INTO jobs (target, status, tuner, n_trial, plan_size, measure, "
                    "created_at) VALUES ('cuda', 'done', 'random', 4, 4, '{}', :at)"),
                    {"at": datetime.now(timezone.utc)})
                conn.execute(sa.text(
                    "INSERT INTO tasks (job_id, template, args, status, trials_planned, "
                    "trials_done) VALUES (1, :t, '[]', 'done', 4, 4)"), {"t": DENSE})
            alembic(url, "head")
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT model FROM jobs")).all() == [(None,)]
                assert conn.execute(sa.text("SELECT layers FROM tasks")).all() == [(None,)]
            columns = {c["name"] for c in inspect(engine).get_columns("tasks")}
            assert "layers" in columns
            with Session(engine) as session, session.begin():
                session.add(JobRow(target="cuda", status="queued", tuner="random", n_trial=1,
                                   plan_size=1, measure={}, model="net.onnx"))
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT model FROM jobs ORDER BY id")).all() == [
                    (None,), ("net.onnx",)]
        finally:
            engine.dispose()


# --------------------------------------------------------------------------------------
# Speed: 100,000 records, a 1,000-trial task

N_RECORDS = 100_000
N_TASK_TRIALS = 1000
N_WORKLOADS = 2000
MODELS = ("h200", "a100", "v100", "gfx90a")
BUDGET_S = 2.0  # generous: the goal is well under 0.5 s


def _seed_large(db: Engine) -> tuple[int, int, list[int]]:
    """Bulk-insert a fleet's history straight into the tables: N_RECORDS records over
    N_WORKLOADS conv2d workloads and four device models, of which a 1,000-trial task's
    results (every 10th failed) from 4 workers over the last few minutes. Returns (job
    id, task id, trial ids in order)."""
    conv = "conv2d_nchw.cuda"
    now = time.time()
    created = datetime.now(timezone.utc)
    entity = [["tile_f", "sp", [-1, 2, 8, 1]], ["tile_y", "sp", [-1, 1, 7, 1]],
              ["tile_x", "sp", [-1, 1, 7, 1]], ["tile_rc", "sp", [-1, 8]],
              ["tile_ry", "sp", [-1, 1]], ["tile_rx", "sp", [-1, 3]],
              ["auto_unroll_max_step", "ot", 512], ["unroll_explicit", "ot", 1]]

    def args(i: int) -> list[Any]:
        c, hw = 16 * (1 + i % 32), 7 * (1 + (i // 32) % 8)
        k = 16 * (1 + (i // 256) % 8)
        return [["TENSOR", [1, c, hw, hw], "float32"], ["TENSOR", [k, c, 3, 3], "float32"],
                [1, 1], [1, 1, 1, 1], [1, 1], "float32"]

    def row(i: int, model: str, wl: int, cost: float, error_no: int,
            trial_id: int | None = None, at: datetime | None = None) -> dict[str, Any]:
        target = f"cuda -model={model}" if model != "gfx90a" else "rocm -model=gfx90a"
        kind = target.split()[0]
        wl_args = args(wl)
        return {"target": target, "target_kind": kind, "target_model": model,
                "target_keys": f",{kind},gpu,", "template": conv,
                "workload_key": json.dumps([conv, wl_args], separators=(",", ":")),
                "line": {"input": [target, conv, wl_args, {}],
                         "config": {"index": i, "code_hash": None, "entity": entity},
                         "result": [[cost], error_no, 0.1, now], "version": 0.2,
                         "tvm_version": "0.19.dev0"},
                "mean_cost": cost, "error_no": error_no, "timestamp": now,
                "created_at": at or created - timedelta(days=1), "trial_id": trial_id}

    with Session(db) as session, session.begin():
        job = JobRow(target="cuda -model=h200", status="running", tuner="lgbm",
                     n_trial=2000, plan_size=16, measure=FAST, created_at=created)
        session.add(job)
        session.flush()
        task = TaskRow(job_id=job.id, template=conv, args=args(0), status="running",
                       trials_planned=N_TASK_TRIALS, trials_done=N_TASK_TRIALS)
        session.add(task)
        workers = [WorkerRow(name=f"gpu{i}", target="cuda -model=h200", limits={},
                             last_seen=now - 5 * i, device="NVIDIA H200") for i in range(4)]
        session.add_all(workers)
        session.flush()
        session.execute(insert(TrialRow), [
            {"task_id": task.id, "queue": "cuda -model=h200", "config": {"index": i,
             "entity": entity}, "config_index": i, "status": "done", "attempts": 1,
             "worker_id": workers[i // 10 % 4].id, "error_no": 4 if i % 10 == 9 else 0}
            for i in range(N_TASK_TRIALS)])
        trial_ids = list(session.scalars(select(TrialRow.id).where(TrialRow.task_id == task.id)
                                         .order_by(TrialRow.id)))
        start = created - timedelta(minutes=8)
        session.execute(insert(RecordRow), [
            row(i, "h200", 0, 1e9 if i % 10 == 9 else 1e-4 / (1 + i / 100),
                4 if i % 10 == 9 else 0, trial_id=trial_ids[i],
                at=start + timedelta(seconds=i * 0.45))
            for i in range(N_TASK_TRIALS)])
        batch: list[dict[str, Any]] = []
        for i in range(N_RECORDS - N_TASK_TRIALS):
            failed = i % 7 == 6
            # configs numbered after the task's: no row repeats a trial's (line_hash)
            batch.append(row(N_TASK_TRIALS + i, MODELS[i % 4], (i // 4) % N_WORKLOADS,
                             1e9 if failed else 1e-4 * (1 + (i * 7919) % 1009 / 100),
                             3 if failed else 0))
            if len(batch) == 5000:
                session.execute(insert(RecordRow), batch)
                batch = []
        if batch:
            session.execute(insert(RecordRow), batch)
        ids = job.id, task.id
    return ids[0], ids[1], trial_ids


@pytest.mark.serial
def test_endpoint_speed_100k_records(make_api: Callable[[], Api], backend: str) -> None:
    """Each endpoint the dashboard polls, over 100,000 records and a 1,000-trial task:
    prints the median of a few calls, asserts a generous bound."""
    api = make_api()
    started = time.perf_counter()
    job, task, trial_ids = _seed_large(api.db)
    seed_s = time.perf_counter() - started
    trials = f"/api/v1/jobs/{job}/tasks/{task}/trials"
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("workers", "/api/v1/workers", {}),
        ("jobs", "/api/v1/jobs", {}),
        ("job (no curves)", f"/api/v1/jobs/{job}", {"curves": "false"}),
        ("job (curves)", f"/api/v1/jobs/{job}", {}),
        ("trials (all 1000)", trials, {}),
        ("trials (after)", trials, {"after": trial_ids[-10]}),
        ("records: best, no filter", "/api/v1/records/search", {}),
        ("records: best, target", "/api/v1/records/search", {"target": "cuda -model=h200"}),
        ("records: best, target+template+workload", "/api/v1/records/search",
         {"target": "cuda", "template": "conv2d_nchw.cuda", "workload": "1,64,14,14"}),
        ("records: all, workload", "/api/v1/records/search",
         {"best": "false", "workload": "[1,64,"}),
        ("records: best, last page", "/api/v1/records/search", {"offset": 7900}),
        ("records: best, template", "/api/v1/records/search",
         {"template": "conv2d_nchw.cuda"}),
        ("pretuned log (h200)", "/api/v1/logs/cuda%20-model=h200", {}),
        ("pretuned log (cuda: 3 models)", "/api/v1/logs/cuda", {}),
    ]
    figures = []
    for name, path, params in calls:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            response = api.call("GET", path, params=params)
            times.append(time.perf_counter() - t0)
            assert response.status_code == 200, (name, response.text[:300])
        figures.append((name, sorted(times)[1], response))
    print(f"\n{backend}: seeded {N_RECORDS} records + {N_TASK_TRIALS} trials in {seed_s:.1f} s")
    for name, median, _ in figures:
        print(f"  {name:42s} {median * 1000:7.1f} ms")
    answers = {name: r for name, _, r in figures}
    assert len(answers["trials (all 1000)"].json()["items"]) == N_TASK_TRIALS
    assert [p["trial"] for p in answers["trials (after)"].json()["items"]] == list(
        range(992, 1001))
    workers = answers["workers"].json()
    assert len(workers) == 4 and all(w["alive"] for w in workers)
    assert sum(w["trials_per_minute"] for w in workers) == pytest.approx(N_TASK_TRIALS / 10)
    assert all(w["error_rate"] == pytest.approx(0.1) for w in workers)
    [row] = answers["jobs"].json()
    assert row["progress"] == pytest.approx(0.5) and row["eta_s"] is not None
    assert answers["records: best, no filter"].json()["total"] == N_WORKLOADS * len(MODELS)
    assert len(answers["pretuned log (h200)"].text.splitlines()) == N_WORKLOADS
    assert len(answers["pretuned log (cuda: 3 models)"].text.splitlines()) == N_WORKLOADS * 3
    slow = [(name, round(t, 3)) for name, t, _ in figures if t > BUDGET_S]
    assert not slow, slow

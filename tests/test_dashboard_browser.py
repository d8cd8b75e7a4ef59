"""The dashboard in a real browser ("See the fleet"): headless Chromium (the system's,
driven by Playwright) against a real server on loopback whose scheduler plans a running
job, and a simulated worker thread that leases its trials and reports fixed costs (every
5th a failure, error 4) through the worker API. The jobs page lists the job; the job's
curve gains points while it runs, failed trials marked; cancel from the page cancels it
in the API; the worker shows on the workers page; the records search finds a TopHub
workload after an import, and its pretuned log downloads. Then page load times over
100,000 records and a 1,000-trial task.

Selectors are the dashboard's DOM contract (README / app.js): ``input#token``,
``button#save-token``, ``table#jobs tr[data-job-id]``, ``svg.curve[data-task-id]``,
``table#workers tr[data-worker-id]``, ``form#records-search``, ``table#records tr.record``,
``body[data-loaded="1"]`` once a page's data has rendered.

Screenshots of each page (1200x800 PNG) are written to a temporary folder, or to
docs/img/ with ``TUNER_UPDATE_SCREENSHOTS=1``. The page timings print with ``-s``:

    .venv/bin/python -m pytest -s tests/test_dashboard_browser.py -k load_times
"""

from __future__ import annotations

import json
import os
import re
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_fixtures import (
    CONV,
    DOCS_IMG,
    FAKE_TARGET,
    LOADED_MARK,
    VIEWPORT,
    SimulatedWorker,
    browser_skip_reason,
    chromium,
    dump,
    png_size,
    screenshot,
    seed_database,
    serve,
    timed_visit,
)
from server_fixtures import (
    TOPHUB_DIR,
    LiveServer,
    empty_database,
    free_port,
    kill_group,
    make_tokens,
    migrate,
    opencl_target,
    wait_until,
)
from sqlalchemy import create_engine, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from compiler.tasks import Task
from schemas.api import FINAL
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow

SKIP = browser_skip_reason()
pytestmark = [pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
              pytest.mark.timeout(180)]

if SKIP is None:
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)  # the pages poll every 1-2 s on a loaded machine

# The live job: ResNet-50's first 3x3 conv, a space far larger than the run uses, and
# a budget that outlasts the module (the worker reports at most ~8 trials/s) yet keeps
# the curve readable (the dashboard's x axis spans the budget).
LIVE_TRIALS = 300
SHOT_POINTS = 100  # the job page's screenshot waits for this many trials
LIVE_ARGS: list[Any] = [["TENSOR", [1, 64, 56, 56], "float32"],
                        ["TENSOR", [64, 64, 3, 3], "float32"],
                        [1, 1], [1, 1, 1, 1], [1, 1], "float32"]
FAST = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
LOAD_BOUND_MS = 3000.0  # generous: a shared 2-core machine; the target is < 500 ms
LOAD_TARGET_MS = 500.0
SHOTS_ENV = "TUNER_UPDATE_SCREENSHOTS"


def submit(server: LiveServer, n_trial: int) -> int:
    body = {"target": FAKE_TARGET, "tasks": [{"template": CONV, "args": LIVE_ARGS}],
            "n_trial": n_trial, "tuner": "random", "plan_size": 16, "measure": FAST}
    with server.client("client") as client:
        answer = client.post("/api/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def get_job(server: LiveServer, job_id: int) -> dict[str, Any]:
    with server.client("client") as client:
        job: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}",
                                         params={"curves": "false"}).raise_for_status().json()
    return job


@dataclass
class Live:
    server: LiveServer
    worker: SimulatedWorker
    job_id: int
    task_id: int
    shots: Path

    @property
    def client_token(self) -> str:
        return self.server.tokens["client"]

    def url(self, route: str, token: bool = True) -> str:
        """The dashboard at ``route`` (#/...), the client token passed in the fragment
        (#token=...&/route), which never reaches the server."""
        if not token:
            return f"{self.server.url}/{route}"
        return f"{self.server.url}/#token={self.client_token}&{route.removeprefix('#')}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A server (scheduler on) over a fresh SQLite file, a simulated worker serving its
    target, and a running job far larger than the module will see measured."""
    directory = tmp_path_factory.mktemp("dashboard")
    shots = DOCS_IMG if os.environ.get(SHOTS_ENV) == "1" else directory / "img"
    with empty_database("sqlite", directory) as url:
        migrate(url)
        server = serve(url, make_tokens(url))
        worker = None
        try:
            worker = SimulatedWorker(server.url, server.tokens["worker"]).start()
            job_id = submit(server, n_trial=LIVE_TRIALS)
            [task] = get_job(server, job_id)["tasks"]
            yield Live(server, worker, job_id, int(task["id"]), shots)
        finally:
            if worker is not None:
                worker.stop()
            server.stop()


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[[], Any]]:
    """Pages in fresh browser contexts (own localStorage), 1200x800, closed after."""
    contexts: list[Any] = []

    def make() -> Any:
        context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
        context.add_init_script(LOADED_MARK)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        return page

    yield make
    for context in contexts:
        context.close()


def visit(page: Any, url: str) -> None:
    """Open ``url`` as a new document and wait for body[data-loaded="1"]."""
    timed_visit(page, url)


def rerendered(page: Any, old: Any) -> None:
    """After an in-page navigation: wait until ``old`` (an element of the previous
    render) has left the document, then for body[data-loaded="1"]."""
    page.wait_for_function("el => !el.isConnected", arg=old)
    page.wait_for_selector('body[data-loaded="1"]', state="attached")


def wait_reported(live: Live, n: int, timeout: float = 30) -> None:
    wait_until(lambda: len(live.worker.reported) >= n, timeout,
               f"the simulated worker to report {n} trials",
               diagnose=lambda: f"reported {len(live.worker.reported)}; errors {live.worker.errors[-3:]}")


def keep_screenshot(page: Any, live: Live | ModelFleet, name: str) -> None:
    path = screenshot(page, live.shots, name)
    assert png_size(path) == (VIEWPORT["width"], VIEWPORT["height"]), path
    assert path.stat().st_size > 10_000, f"{path} looks blank ({path.stat().st_size} bytes)"
    print(f"\nscreenshot: {path}")


def keep_element(locator: Any, live: Live | ModelFleet, name: str) -> None:
    """A PNG of one element (a chart's section), as wide as it is drawn."""
    live.shots.mkdir(parents=True, exist_ok=True)
    path = live.shots / name
    locator.screenshot(path=str(path))
    width, height = png_size(path)
    assert width >= 600 and height >= 200, (path, width, height)
    assert path.stat().st_size > 8_000, f"{path} looks blank ({path.stat().st_size} bytes)"
    print(f"\nscreenshot: {path}")


# --------------------------------------------------------------------------------------
# The token

def test_token_from_the_input_and_from_the_url(live: Live, new_page: Callable[[], Any]) -> None:
    """Without a token no job is listed; input#token + button#save-token stores it in
    localStorage["tuner_token"] and the jobs show; /#token=XYZ&/route stores it too and
    leaves the address bar (the fragment never reaches the server's log); an old
    /?token=XYZ link still works and leaves the address bar too."""
    page = new_page()
    visit(page, live.url("#/jobs", token=False))
    assert page.locator("table#jobs tr[data-job-id]").count() == 0
    page.fill("input#token", live.client_token)
    page.click("button#save-token")
    row = page.locator(f'table#jobs tr[data-job-id="{live.job_id}"]')
    expect(row).to_have_count(1)
    assert page.evaluate('localStorage.getItem("tuner_token")') == live.client_token

    other = new_page()
    visit(other, live.url("#/workers"))
    assert other.evaluate('localStorage.getItem("tuner_token")') == live.client_token
    assert other.evaluate("location.hash") == "#/workers"
    assert live.client_token not in other.url
    expect(other.locator("table#workers tr[data-worker-id]").first).to_be_attached()

    old = new_page()
    visit(old, f"{live.server.url}/?token={live.client_token}#/jobs")
    assert old.evaluate('localStorage.getItem("tuner_token")') == live.client_token
    assert live.client_token not in old.url
    expect(old.locator(f'table#jobs tr[data-job-id="{live.job_id}"]')).to_have_count(1)


# --------------------------------------------------------------------------------------
# 1. the jobs page

def test_jobs_page_lists_the_running_job(live: Live, new_page: Callable[[], Any]) -> None:
    wait_reported(live, 5)
    page = new_page()
    visit(page, live.url("#/jobs"))
    row = page.locator(f'table#jobs tr[data-job-id="{live.job_id}"]')
    expect(row).to_have_count(1)
    expect(row.locator(".status")).to_have_text(re.compile(r"\s*(queued|running)\s*"))
    expect(row.locator("a.job-link")).to_have_attribute("href", f"#/jobs/{live.job_id}")
    expect(row.locator(f'button.cancel[data-job-id="{live.job_id}"]')).to_be_visible()
    expect(row.locator(".best")).to_have_text(re.compile(r"\d"))
    expect(row.locator(".eta")).not_to_be_empty()
    # the page follows the job: its progress moves as results arrive
    progress = row.locator(".progress")
    expect(progress).to_have_text(re.compile(r"\d"))
    before = progress.inner_text()
    expect(progress).not_to_have_text(before, timeout=15_000)


# --------------------------------------------------------------------------------------
# 2. the job page's curve

CURVE_STATE = """sel => {
  const svg = document.querySelector(sel);
  if (!svg) return null;
  return {points: Number(svg.getAttribute("data-points")),
          trials: svg.querySelectorAll("circle.trial").length,
          failed: svg.querySelectorAll(".trial.failed").length,
          failed4: svg.querySelectorAll('.trial.failed[data-error-no="4"]').length,
          best: (svg.querySelector("path.best") || {getAttribute: () => null}).getAttribute("d")};
}"""


def test_job_curve_gains_points_while_it_runs(live: Live, new_page: Callable[[], Any]) -> None:
    """Opened from its link, the job page draws the task's curve; data-points grows as
    the worker reports; every measured trial is a circle.trial, the failed ones
    .trial.failed[data-error-no="4"], exactly the API's failures among the drawn."""
    page = new_page()
    visit(page, live.url("#/jobs"))
    jobs_table = page.locator("table#jobs").element_handle()
    page.click(f'tr[data-job-id="{live.job_id}"] a.job-link')
    rerendered(page, jobs_table)
    selector = f'svg.curve[data-task-id="{live.task_id}"]'
    curve = page.locator(selector)
    expect(curve).to_be_visible()
    start = page.evaluate(CURVE_STATE, selector)
    assert start is not None and start["points"] >= 0, start
    page.wait_for_function(f"sel => Number(document.querySelector(sel)"
                           f".getAttribute('data-points')) >= {start['points'] + 5}",
                           arg=selector, timeout=20_000)
    # enough for a failure among them
    page.wait_for_function("sel => Number(document.querySelector(sel)"
                           ".getAttribute('data-points')) >= 30", arg=selector, timeout=30_000)
    state = page.evaluate(CURVE_STATE, selector)
    assert state["trials"] == state["points"], state  # one circle per trial drawn
    with live.server.client("client") as client:
        items = client.get(f"/api/v1/jobs/{live.job_id}/tasks/{live.task_id}/trials"
                           ).raise_for_status().json()["items"]
    drawn = items[:state["points"]]  # the API numbers trials in the order they were stored
    assert len(drawn) == state["points"], (len(items), state)
    failed = [p for p in drawn if p["error_no"] != 0]
    assert failed, f"no failure among the first {state['points']} trials: {dump(drawn)}"
    assert state["failed"] == state["failed4"] == len(failed), (state, failed)
    assert {p["error_no"] for p in failed} == {4}
    assert state["best"] and re.search(r"[HVLhvl]", state["best"]), state  # a step line
    page.wait_for_function(f"sel => Number(document.querySelector(sel)"
                           f".getAttribute('data-points')) >= {SHOT_POINTS}",
                           arg=selector, timeout=40_000)
    keep_screenshot(page, live, "dashboard-job.png")
    keep_element(page.locator("div.task-detail section.task"), live, "dashboard-task.png")
    # whole-trial ticks, the axis spanning the trials measured
    x_ticks = page.evaluate("""sel => [...document.querySelectorAll(sel + ' text.tick')]
        .filter((t) => Number(t.getAttribute('y')) > 220).map((t) => t.textContent)""", selector)
    assert x_ticks and all(re.fullmatch(r"\d+", t) for t in x_ticks), x_ticks
    assert max(int(t) for t in x_ticks) <= int(page.locator(selector).get_attribute("data-x-max"))


# --------------------------------------------------------------------------------------
# 3. cancel from the page

@pytest.mark.parametrize("where", ["jobs", "job"])
def test_cancel_from_the_page(live: Live, new_page: Callable[[], Any], where: str) -> None:
    """button.cancel[data-job-id] on the jobs page (and on the job's own page) cancels
    the job in the API; the jobs table then says so; the other job is not touched."""
    job_id = submit(live.server, n_trial=64)
    page = new_page()
    visit(page, live.url("#/jobs" if where == "jobs" else f"#/jobs/{job_id}"))
    button = page.locator(f'button.cancel[data-job-id="{job_id}"]')
    expect(button).to_be_visible()
    assert get_job(live.server, job_id)["status"] not in FINAL
    button.click()
    status = wait_until(lambda: get_job(live.server, job_id)["status"] == "cancelled", 10,
                        f"job {job_id} to be cancelled in the API",
                        diagnose=lambda: dump(get_job(live.server, job_id)))
    assert status
    visit(page, live.url("#/jobs"))
    expect(page.locator(f'table#jobs tr[data-job-id="{job_id}"] .status')).to_have_text(
        re.compile(r"\s*cancelled\s*"))
    assert get_job(live.server, live.job_id)["status"] != "cancelled"
    keep_screenshot(page, live, "dashboard-jobs.png")  # by now: running and cancelled jobs


# --------------------------------------------------------------------------------------
# 4. the workers page

def test_worker_appears_on_the_workers_page(live: Live, new_page: Callable[[], Any]) -> None:
    """The simulated worker's row is alive with its target, device, heartbeat, pace and
    error rate; a worker silent for an hour is listed without the alive class."""
    with httpx.Client(base_url=live.server.url, timeout=30, headers={
            "Authorization": f"Bearer {live.server.tokens['worker']}"}) as client:
        lost = int(client.post("/api/v1/workers", json={
            "name": "old-box:opencl:0", "target": FAKE_TARGET}).raise_for_status().json()["id"])
    engine = create_engine(live.server.database_url, poolclass=NullPool)
    try:
        with Session(engine) as session, session.begin():
            session.execute(update(WorkerRow).where(WorkerRow.id == lost)
                            .values(last_seen=time.time() - 3600))
    finally:
        engine.dispose()
    wait_reported(live, 5)
    page = new_page()
    visit(page, live.url("#/workers"))
    row = page.locator(f'table#workers tr[data-worker-id="{live.worker.worker_id}"]')
    expect(row).to_have_count(1)
    expect(row).to_have_class(re.compile(r"(^|\s)alive(\s|$)"))
    expect(row.locator(".target")).to_have_text(FAKE_TARGET)
    expect(row.locator(".device")).to_have_text(live.worker.device)
    expect(row.locator(".heartbeat")).to_have_text(re.compile(r"\d"))
    expect(row.locator(".rate")).to_have_text(re.compile(r"[1-9]"))  # some trials/min
    expect(row.locator(".errors")).to_have_text(re.compile(r"\d"))
    old = page.locator(f'table#workers tr[data-worker-id="{lost}"]')
    expect(old).to_have_count(1)
    expect(old).not_to_have_class(re.compile(r"(^|\s)alive(\s|$)"))
    keep_screenshot(page, live, "dashboard-workers.png")


# --------------------------------------------------------------------------------------
# 5. the records search

def search(page: Any, **fields: str) -> None:
    """Fill form#records-search and submit it (Enter); wait for the new results."""
    form = page.locator("form#records-search")
    for name in ("target", "template", "workload"):
        form.locator(f"[name={name}]").fill(fields.get(name, ""))
    old = page.locator("table#records").element_handle()
    form.locator("[name=workload]").press("Enter")
    rerendered(page, old)


def test_records_search_finds_a_tophub_workload(live: Live,
                                                new_page: Callable[[], Any]) -> None:
    """After TopHub's CUDA log is imported, the search by target, template and a shape
    finds its titanx record for a 1x1 conv on 2048 channels, with GFLOP/s and knobs, and
    a.download-log downloads the target's pretuned log."""
    log = TOPHUB_DIR / "cuda_v0.10.log"
    with live.server.client("client") as client:
        answer = client.post("/api/v1/records/import", content=log.read_text(),
                             headers={"content-type": "text/plain"}).raise_for_status().json()
    assert answer["accepted"] >= 800, dump(answer)
    target, template, workload = "cuda -model=titanx", CONV, "1,2048,8,8"

    page = new_page()
    visit(page, live.url("#/records"))
    search(page, target=target, template=template)
    rows = page.locator("table#records tr.record")
    assert rows.count() >= 10, rows.count()
    keep_screenshot(page, live, "dashboard-records.png")

    search(page, target=target, template=template, workload=workload)
    with live.server.client("client") as client:
        expected = client.get("/api/v1/records/search", params={
            "target": target, "template": template, "workload": workload}
        ).raise_for_status().json()["items"]
    assert expected, "the API found nothing to compare with"
    assert rows.count() == len(expected), (rows.count(), dump(expected))
    first = rows.first
    assert "2048" in first.locator(".workload").inner_text()
    assert first.locator(".template").inner_text().strip() == template
    assert first.locator(".target").inner_text().strip() == target
    shown = float(first.locator(".gflops").inner_text())
    assert shown == pytest.approx(expected[0]["gflops"], rel=0.01), (shown, expected[0])
    knobs = first.locator(".knobs").inner_text()
    assert all(k in knobs for k in expected[0]["knobs"]), (knobs, expected[0]["knobs"])

    link = page.locator("a.download-log")
    expect(link).to_be_visible()
    with page.expect_download() as download:
        link.click()
    body = Path(download.value.path()).read_text()
    with live.server.client("client") as client:
        assert body == client.get(f"/api/v1/logs/{target}").raise_for_status().text
    lines = [json.loads(line) for line in body.splitlines()]
    assert lines and all(line["input"][0] == target for line in lines)
    assert any(line["input"][2][0][1] == [1, 2048, 8, 8] for line in lines)


# --------------------------------------------------------------------------------------
# 6. a model's job: ResNet-50's 28 tasks, a worker reporting, the latency falling

MODEL_NAME = "resnet50.onnx"
# One trial planned at a time per task: the first 28 reports are the tasks' default
# configs (the scheduler plans a task's default first), so the estimate and the default
# build's line come after 28 reports; every 30th report fails, none of those.
MODEL_PLAN = 1
MODEL_FAIL_EVERY = 30
BROKEN_TARGET = "opencl -model=sim-broken"  # its worker's every trial fails
UNSERVED_TARGET = "cuda -model=h200"  # no worker serves it


@cache
def resnet50_tasks() -> list[Task]:
    """ResNet-50's tasks for a GPU target (28: its distinct conv2d layers, Winograd for
    the 3x3 stride-1 ones, the classifier), from the ONNX model the compiler tests use."""
    import onnx

    from compiler.frontend.samples import light_path, with_random_weights
    from tuner import extract_tasks

    try:
        path = light_path("resnet50")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    return extract_tasks(with_random_weights(onnx.load(path), seed=0), UNSERVED_TARGET)


def model_body(tasks: list[Task], target: str, n_trial: int) -> dict[str, Any]:
    return {"target": target, "tasks": [t.workload.model_dump(mode="json") for t in tasks],
            "layers": [t.layers for t in tasks], "model": MODEL_NAME, "n_trial": n_trial,
            "tuner": "random", "plan_size": MODEL_PLAN, "measure": FAST}


def submit_body(server: LiveServer, body: dict[str, Any]) -> int:
    with server.client("client") as client:
        answer = client.post("/api/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def model_of(server: LiveServer, job_id: int) -> dict[str, Any]:
    with server.client("client") as client:
        view: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}/model").raise_for_status().json()
    return view


@dataclass
class ModelFleet:
    server: LiveServer
    worker: SimulatedWorker
    broken: SimulatedWorker
    job_id: int
    tasks: list[Task]
    shots: Path

    def url(self, route: str) -> str:
        return f"{self.server.url}/#token={self.server.tokens['client']}&{route.removeprefix('#')}"


@pytest.fixture(scope="module")
def model_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelFleet]:
    """A server (scheduler on) with a fast simulated worker on FAKE_TARGET, one whose
    every trial fails on BROKEN_TARGET, and a running job of ResNet-50's 28 tasks."""
    tasks = resnet50_tasks()
    assert len(tasks) == 28, [t.template for t in tasks]
    directory = tmp_path_factory.mktemp("model")
    shots = DOCS_IMG if os.environ.get(SHOTS_ENV) == "1" else directory / "img"
    with empty_database("sqlite", directory) as url:
        migrate(url)
        server = serve(url, make_tokens(url))
        workers: list[SimulatedWorker] = []
        try:
            workers.append(SimulatedWorker(server.url, server.tokens["worker"],
                                           name="sim-fast:opencl:0", pace_s=0.01, batch=8,
                                           fail_every=MODEL_FAIL_EVERY).start())
            workers.append(SimulatedWorker(server.url, server.tokens["worker"],
                                           name="sim-broken:opencl:0", target=BROKEN_TARGET,
                                           pace_s=0.02, fail_every=1).start())
            job_id = submit_body(server, model_body(tasks, FAKE_TARGET, 1000))
            yield ModelFleet(server, workers[0], workers[1], job_id, tasks, shots)
        finally:
            for worker in workers:
                worker.stop()
            server.stop()


LATENCY_STATE = """() => {
  const svg = document.querySelector('svg.latency[data-axis="trials"]');
  return {points: Number(svg.getAttribute("data-points")),
          latency: Number(svg.getAttribute("data-latency") || "NaN"),
          defaults: document.querySelectorAll("svg.latency line.default").length};
}"""


def test_model_view_of_a_running_resnet50_job(model_fleet: ModelFleet,
                                              new_page: Callable[[], Any]) -> None:
    """The job page of a 28-task model job: one table row per task with its layers and
    count, ordered by share of the model's latency as the API orders them; the latency
    estimate appears once every task has a working trial, with the default build's
    line, and falls as the worker reports; a row's click shows that task's curve."""
    fleet = model_fleet
    page = new_page()
    visit(page, fleet.url(f"#/jobs/{fleet.job_id}"))
    rows = page.locator("table#tasks tr.task-row")
    expect(rows).to_have_count(28)
    expect(page.locator(".job-title")).to_contain_text(MODEL_NAME)
    page.wait_for_function("() => Number(document.querySelector("
                           "'svg.latency[data-axis=\"trials\"]').getAttribute('data-points')) >= 1",
                           timeout=120_000)
    first = page.evaluate(LATENCY_STATE)
    assert first["defaults"] == 2, first  # the default build's line on both charts
    view = model_of(fleet.server, fleet.job_id)
    assert view["default_latency_s"] and view["latency_s"] <= view["default_latency_s"]
    # the estimate falls as results arrive
    page.wait_for_function(f"() => Number(document.querySelector('svg.latency[data-axis=\"trials\"]')"
                           f".getAttribute('data-latency')) < {first['latency']}", timeout=90_000)
    later = page.evaluate(LATENCY_STATE)
    assert later["points"] > first["points"] and later["latency"] < first["latency"], (first, later)
    # rows by share, largest first, as the API orders them; every share is the API's
    shares = page.evaluate("""() => [...document.querySelectorAll('table#tasks tr.task-row')]
        .map((tr) => [Number(tr.dataset.taskId), tr.dataset.share === '' ? null : Number(tr.dataset.share)])""")
    known = [s for _, s in shares if s is not None]
    assert len(known) == 28 and known == sorted(known, reverse=True), shares
    assert sum(known) == pytest.approx(1.0, rel=1e-6)
    # each row names the layers its task serves and their count
    view = model_of(fleet.server, fleet.job_id)
    by_id = {t["id"]: t for t in view["tasks"]}
    for task_id, _ in shares[:5]:
        row = page.locator(f'table#tasks tr.task-row[data-task-id="{task_id}"]')
        layers = by_id[task_id]["layers"]
        expect(row.locator("td.count")).to_have_text(f"×{len(layers)}")
        expect(row.locator("td.layers")).to_contain_text(layers[0])
        assert row.locator("svg.spark").get_attribute("data-points") != "0"
    three = next(t for t in fleet.tasks if len(t.layers) >= 3)
    assert any(by_id[i]["layers"] == three.layers for i, _ in shares)
    keep_screenshot(page, fleet, "dashboard-model.png")
    keep_element(page.locator("section.latency"), fleet, "dashboard-latency.png")
    # a row's click shows its task's full curve, and the address says which
    second = shares[1][0]
    page.click(f'table#tasks tr.task-row[data-task-id="{second}"]')
    curve = page.locator(f'svg.curve[data-task-id="{second}"]')
    expect(curve).to_be_visible()
    expect(page.locator(f'tr.task-row.selected[data-task-id="{second}"]')).to_have_count(1)
    assert page.evaluate("location.hash") == f"#/jobs/{fleet.job_id}/tasks/{second}"
    page.wait_for_function(f"() => Number(document.querySelector('svg.curve[data-task-id=\"{second}\"]')"
                           f".getAttribute('data-points')) >= 1", timeout=60_000)
    x_ticks = page.evaluate(f"""() => [...document.querySelectorAll('svg.curve[data-task-id="{second}"] text.tick')]
        .filter((t) => Number(t.getAttribute('y')) > 220).map((t) => t.textContent)""")
    assert x_ticks and all(re.fullmatch(r"\d+", t) for t in x_ticks), x_ticks  # whole trials


def test_job_waiting_for_a_worker_says_so(model_fleet: ModelFleet,
                                          new_page: Callable[[], Any]) -> None:
    """A job for a target no live worker serves says so on its page, naming the target."""
    fleet = model_fleet
    job_id = submit_body(fleet.server, model_body(fleet.tasks[:1], UNSERVED_TARGET, 8))
    try:
        page = new_page()
        visit(page, fleet.url(f"#/jobs/{job_id}"))
        waiting = page.locator(".job-waiting")
        expect(waiting).to_be_visible()
        expect(waiting).to_contain_text(f"waiting for a worker for {UNSERVED_TARGET}")
        visit(page, fleet.url("#/jobs"))
        expect(page.locator(f'table#jobs tr[data-job-id="{job_id}"] .status')).to_contain_text(
            "waiting for a worker")
    finally:
        with fleet.server.client("client") as client:
            client.post(f"/api/v1/jobs/{job_id}/cancel").raise_for_status()


def test_job_whose_every_trial_failed(model_fleet: ModelFleet,
                                      new_page: Callable[[], Any]) -> None:
    """A job whose every trial failed shows as failed with its error counts; its curve
    draws no GFLOP/s scale, only the failures, each inside the chart with its number."""
    fleet = model_fleet
    body = model_body(fleet.tasks[:1], BROKEN_TARGET, 5)
    body["plan_size"] = 5
    job_id = submit_body(fleet.server, body)
    wait_until(lambda: get_job(fleet.server, job_id)["status"] == "failed", 30,
               f"job {job_id} to fail", diagnose=lambda: dump(get_job(fleet.server, job_id)))
    page = new_page()
    visit(page, fleet.url(f"#/jobs/{job_id}"))
    expect(page.locator(".job-summary .status")).to_have_text("failed")
    expect(page.locator(".job-error")).to_contain_text("all 5 trials failed")
    expect(page.locator(".job-failures")).to_contain_text("5 × error 4 (RUNTIME_DEVICE)")
    curve = page.locator("svg.curve")
    expect(curve).to_have_attribute("data-points", "5")
    expect(curve.locator("text.empty-note")).to_have_text("no working trial yet")
    expect(curve.locator(".trial.failed")).to_have_count(5)
    expect(curve.locator("text.failed-label")).to_have_text("5 failed")
    assert curve.get_attribute("data-x-max") == "5"
    inside = page.evaluate("""() => {
      const svg = document.querySelector('svg.curve');
      const [, , w, h] = svg.getAttribute('viewBox').split(' ').map(Number);
      return [...svg.querySelectorAll('.trial.failed, text.error-no')].every((el) => {
        const b = el.getBBox(); return b.x >= 0 && b.y >= 0 && b.x + b.width <= w && b.y + b.height <= h; });
    }""")
    assert inside
    expect(page.locator("table#tasks tr.task-row td.errors")).to_have_text("5")


# --------------------------------------------------------------------------------------
# 6b. `tuner dashboard` over the SQLite file `tuner tune` wrote

TUNER = Path(sys.executable).with_name("tuner")


def small_model(directory: Path) -> Path:
    """Two 3x3 convs and a classifier: 5 tasks on an OpenCL GPU (each conv direct and
    Winograd, the dense), 7 on a CPU (each conv's implicit GEMM too)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def const(name: str, *shape: int) -> Any:
        return numpy_helper.from_array(rng.uniform(-0.5, 0.5, size=shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["gap"], "gap"),
             helper.make_node("Flatten", ["gap"], ["flat"], "flatten"),
             helper.make_node("Gemm", ["flat", "fw"], ["logits"], "fc", transB=1)]
    graph = helper.make_graph(
        nodes, "small_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [const("w1", 8, 3, 3, 3), const("w2", 8, 8, 3, 3), const("fw", 10, 8)])
    path = directory / "small_net.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.timeout(900)  # tuning 7 tasks for real on the CPU's OpenCL device
def test_tuner_dashboard_over_what_tuner_tune_wrote(browser: Any, tmp_path: Path) -> None:
    """`tuner tune MODEL` (embedded, on this machine's OpenCL device) writes a SQLite file;
    `tuner dashboard --database-url` serves it on 127.0.0.1 with no token: the job shows
    as the model's, its tasks with their layers and the latency estimate; the page offers
    no token form and no cancel, and the server refuses any write."""
    target, why = opencl_target()
    if target is None:
        pytest.skip(why)
    model = small_model(tmp_path)
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("TUNER_DATABASE_URL", None)
    tuned = subprocess.run(
        [str(TUNER), "tune", str(model), "--target", target, "--database-url", url,
         "--trials", "1", "--number", "1", "--repeat", "1", "--min-repeat-ms", "0",
         "--device", "opencl:0"], capture_output=True, text=True, timeout=700, env=env)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    from schemas import Target

    tasks = 7 if Target.parse(target).device_class == "cpu" else 5
    assert f"small_net.onnx: {tasks} tasks" in tuned.stdout, tuned.stdout
    port = free_port()
    proc = subprocess.Popen([str(TUNER), "dashboard", "--database-url", url, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{base}/healthz"), 30, "tuner dashboard to answer",
                   diagnose=lambda: f"exit code {proc.poll()}")
        jobs = httpx.get(f"{base}/api/v1/jobs", timeout=10)  # no token
        assert jobs.status_code == 200 and jobs.json()[0]["model"] == "small_net.onnx", jobs.text
        refused = httpx.post(f"{base}/api/v1/jobs/1/cancel", timeout=10)
        assert refused.status_code == 405 and "read-only" in refused.json()["detail"]
        context = browser.new_context(viewport=VIEWPORT)
        try:
            context.add_init_script(LOADED_MARK)
            page = context.new_page()
            page.set_default_timeout(15_000)
            visit(page, f"{base}/#/jobs")
            row = page.locator('table#jobs tr[data-job-id="1"]')
            expect(row.locator(".status")).to_have_text("done")
            expect(row.locator(".model")).to_have_text(re.compile(r"\s*small_net\.onnx"))
            expect(page.locator("#token-form")).to_be_hidden()
            expect(page.locator("button.cancel")).to_have_count(0)
            visit(page, f"{base}/#/jobs/1")
            rows = page.locator("table#tasks tr.task-row")
            expect(rows).to_have_count(tasks)
            layers = " ".join(page.locator("table#tasks td.layers").all_inner_texts())
            assert all(name in layers for name in ("conv1", "conv2", "fc")), layers
            latency = page.locator('svg.latency[data-axis="trials"]')
            expect(latency).to_have_attribute("data-points", re.compile(r"[1-9]\d*"))
            expect(page.locator(".latency-now")).to_have_text(re.compile(r"\d"))
            # a point's tooltip is made once the pointer rests on it (the job has ended:
            # nothing redraws the charts under the pointer)
            for dot, tip in ((latency.locator("circle.estimate-point").last,
                              r" after \d+ trials, "),
                             (page.locator("svg.curve circle").last, r"^trial \d+[: ]")):
                expect(dot.locator("title")).to_have_count(0)
                dot.hover()
                expect(dot.locator("title")).to_have_text(re.compile(tip))
        finally:
            context.close()
    finally:
        kill_group(proc)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


# --------------------------------------------------------------------------------------
# 7. page load times: 100,000 records, a 1,000-trial task

RUNS = 5
MODEL_TRIALS = 1000  # per task of the seeded model job


def heartbeat(database_url: str, worker_ids: list[int]) -> None:
    """The workers' last contact is now, 2 s apart (as seed_database stores it)."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with Session(engine) as session, session.begin():
            now = time.time()
            for i, worker_id in enumerate(worker_ids):
                session.execute(update(WorkerRow).where(WorkerRow.id == worker_id)
                                .values(last_seen=now - 2 * i))
    finally:
        engine.dispose()


def seed_model_job(database_url: str, tasks: list[Task], n_trials: int) -> int:
    """Bulk-insert a running job of ``tasks`` (a model's, with their layers) and
    ``n_trials`` results per task (the first each task's default config, every 10th
    failed, error 4), stored over the last 20 minutes in round-robin order; its id."""
    from compiler.templates import get_template

    engine = create_engine(database_url, poolclass=NullPool)
    now = time.time()
    created = datetime.now(timezone.utc)
    start = created - timedelta(minutes=20)
    step = timedelta(minutes=19) / (n_trials * len(tasks))
    try:
        with Session(engine) as session, session.begin():
            job = JobRow(target=FAKE_TARGET, status="running", tuner="random",
                         n_trial=n_trials, plan_size=16, measure=FAST, model=MODEL_NAME,
                         created_at=start)
            session.add(job)
            session.flush()
            rows = [TaskRow(job_id=job.id, template=t.template, args=t.workload.args_json(),
                            status="running", trials_planned=n_trials, trials_done=n_trials,
                            layers=t.layers) for t in tasks]
            session.add_all(rows)
            session.flush()
            defaults = [get_template(t.template).default_config(t.workload).index for t in tasks]
            session.execute(insert(TrialRow), [
                {"task_id": row.id, "queue": FAKE_TARGET, "config": {"index": i},
                 "config_index": defaults[k] if i == 0 else defaults[k] + i, "status": "done",
                 "attempts": 1, "error_no": 4 if i % 10 == 9 else 0}
                for k, row in enumerate(rows) for i in range(n_trials)])
            trial_ids = {(task_id, index): trial_id for trial_id, task_id, index in session.execute(
                select(TrialRow.id, TrialRow.task_id, TrialRow.config_index)
                .where(TrialRow.task_id.in_([r.id for r in rows])))}
            records = []
            for i in range(n_trials):  # round-robin over the tasks, as a fleet measures
                for k, (row, task) in enumerate(zip(rows, tasks, strict=True)):
                    failed = i % 10 == 9
                    base = 1e-5 * (1 + k % 7) * (1 + 3 / (1 + i / 50))
                    cost = 1e9 if failed else base * (1 + random.Random(i * 31 + k).random() / 4)
                    index = defaults[k] if i == 0 else defaults[k] + i
                    line = {"input": [FAKE_TARGET, task.template, task.workload.args_json(), {}],
                            "config": {"index": index, "code_hash": None, "entity": []},
                            "result": [[cost], 4 if failed else 0, 0.1, now],
                            "version": 0.2, "tvm_version": "0.19.dev0"}
                    records.append({
                        "target": FAKE_TARGET, "target_kind": "opencl",
                        "target_model": "pocl-cpu", "target_keys": ",opencl,gpu,",
                        "template": task.template, "workload_key": task.workload.key,
                        "line": line, "mean_cost": cost, "error_no": 4 if failed else 0,
                        "timestamp": now, "trial_id": trial_ids[(row.id, index)],
                        "created_at": start + step * (i * len(tasks) + k)})
                    if len(records) == 5000:
                        session.execute(insert(RecordRow), records)
                        records = []
            if records:
                session.execute(insert(RecordRow), records)
            return int(job.id)
    finally:
        engine.dispose()




@pytest.mark.slow
@pytest.mark.timeout(900)  # seeding 128,000 records takes minutes on a loaded machine
@pytest.mark.serial
def test_page_load_times_100k_records(browser: Any, tmp_path: Path) -> None:
    """Per page, navigation start -> body[data-loaded="1"] (HTML, assets, API calls,
    render), over a database of 100,000 records (3,000 workloads, 4 targets), 4 workers,
    a running job whose task has 1,000 measured trials and a running model job of
    ResNet-50's 28 tasks with 1,000 results each: a cold load, then the median and worst
    of RUNS more. Prints the figures; bound: each median < LOAD_BOUND_MS."""
    with empty_database("sqlite", tmp_path) as url:
        migrate(url)
        tokens = make_tokens(url)
        t0 = time.perf_counter()
        # the model job first: the seeded workers' heartbeats must stay within the lease
        model_job = seed_model_job(url, resnet50_tasks(), MODEL_TRIALS)
        seeded = seed_database(url)
        seed_s = time.perf_counter() - t0
        heartbeat(url, seeded.worker_ids)  # live whatever the seeding took
        server = serve(url, tokens, run_scheduler=False)
        context = browser.new_context(viewport=VIEWPORT)
        try:
            context.add_init_script(LOADED_MARK)
            page = context.new_page()
            page.set_default_timeout(30_000)
            base = server.url
            timed_visit(page, f"{base}/#token={tokens['client']}&/workers")  # stores it
            pages: list[tuple[str, str, Callable[[], None]]] = [
                ("jobs", "#/jobs", lambda: expect(page.locator(
                    f'table#jobs tr[data-job-id="{seeded.job_id}"]')).to_have_count(1)),
                (f"job ({seeded.n_trials:,} trials)", f"#/jobs/{seeded.job_id}",
                 lambda: expect(page.locator(f'svg.curve[data-task-id="{seeded.task_id}"]')
                                ).to_have_attribute("data-points", str(seeded.n_trials))),
                ("workers", "#/workers", lambda: expect(page.locator(
                    "table#workers tr[data-worker-id].alive")).to_have_count(4)),
                ("records (best of all)", "#/records", lambda: expect(page.locator(
                    "table#records tr.record").first).to_be_visible()),
                ("records (target+template+workload)",
                 "#/records?target=cuda&template=conv2d_nchw.cuda&workload=1,64,14,14",
                 lambda: expect(page.locator("table#records tr.record").first).to_be_visible()),
                (f"model job (28 tasks x {MODEL_TRIALS:,} trials)", f"#/jobs/{model_job}",
                 lambda: (expect(page.locator("table#tasks tr.task-row")).to_have_count(28),
                          expect(page.locator('svg.latency[data-axis="time"]'))
                          .not_to_have_attribute("data-points", "0"))),
            ]
            figures = []
            for name, route, check in pages:
                cold, _ = timed_visit(page, f"{base}/{route}")
                check()
                runs = [timed_visit(page, f"{base}/{route}") for _ in range(RUNS)]
                check()
                in_page = [r[0] for r in runs]
                wall = [r[1] for r in runs]
                figures.append((name, cold, statistics.median(in_page), max(in_page),
                                statistics.median(wall)))
        finally:
            context.close()
            server.stop()
    print(f"\nseeded {seeded.n_records:,} records ({seeded.n_workloads:,} workloads, 4 targets)"
          f" + a {seeded.n_trials:,}-trial task + a 28-task model job of {MODEL_TRIALS:,} "
          f"trials per task in {seed_s:.1f} s; Chromium "
          f"{browser.version}, headless, {VIEWPORT['width']}x{VIEWPORT['height']}")
    print(f"{'page':38s} {'cold':>8s} {'median':>8s} {'worst':>8s} {'wall':>8s}  (ms, "
          f"navigation start -> body[data-loaded=1]; wall: median seen by the test)")
    for name, cold, median, worst, wall in figures:
        flag = "" if median < LOAD_TARGET_MS else f"  over the {LOAD_TARGET_MS:.0f} ms target"
        print(f"{name:38s} {cold:8.0f} {median:8.0f} {worst:8.0f} {wall:8.0f}{flag}")
    slow = [(name, round(median)) for name, _, median, _, _ in figures if median > LOAD_BOUND_MS]
    assert not slow, f"pages slower than {LOAD_BOUND_MS:.0f} ms: {slow}"

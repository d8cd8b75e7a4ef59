"""Helpers for the dashboard's browser tests: the system's Chromium driven by Playwright
(no browser download), a real server on loopback with its scheduler running, a simulated
worker thread that leases and reports fixed costs through the worker API, a database
seeded in bulk (100,000 records, a 1,000-trial task), and page-load timing."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from server_fixtures import LiveServer, start_server
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from schemas import MeasureErrorNo, MeasureResult, Workload
from tuner_server.db.models import JobRow, RecordRow, TaskRow, TrialRow, WorkerRow

REPO = Path(__file__).resolve().parents[1]
# Where the README's screenshots live; the tests write there only when asked
# (TUNER_UPDATE_SCREENSHOTS=1), so a test run leaves the tree as it was.
DOCS_IMG = REPO / "docs" / "img"
VIEWPORT = {"width": 1200, "height": 800}
FAKE_TARGET = "opencl -model=pocl-cpu"


def find_chromium() -> str | None:
    """The system's Chromium: $TUNER_CHROMIUM, else Debian's /usr/bin/chromium, else one
    on PATH."""
    explicit = os.environ.get("TUNER_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def browser_skip_reason() -> str | None:
    """None when a browser test can run here, else why not."""
    if importlib.util.find_spec("playwright") is None:
        return ("the playwright package is not installed (pip install -e '.[dev]'): "
                "the dashboard's browser tests need it")
    if find_chromium() is None:
        return ("no Chromium found (apt-get install chromium, or set TUNER_CHROMIUM to a "
                "Chromium binary): the dashboard's browser tests need it")
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's sync API) on the system's binary."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), headless=True)
        try:
            yield browser
        finally:
            browser.close()


# ------------------------------------------------------------------------- the server

def serve(database_url: str, tokens: dict[str, str], run_scheduler: bool = True) -> LiveServer:
    """The real app on loopback, its scheduler planning trials unless told not to."""
    return start_server(database_url, tokens, run_scheduler)


# ------------------------------------------------------------------- a simulated worker

@dataclass
class SimulatedWorker:
    """A worker thread speaking the worker API: registers (with the fleet's worker token,
    then speaks with its own), leases ``batch`` trials at a time and reports each after
    ``pace_s`` with a fixed, reproducible cost (drawn from the trial id), every
    ``fail_every``-th report a failure with ``fail_error_no``. It builds and runs
    nothing, so trials arrive at a steady, known rate."""

    url: str
    token: str
    name: str = "sim-box:opencl:0"
    device: str = "Simulated PoCL device"
    target: str = FAKE_TARGET
    pace_s: float = 0.12
    batch: int = 2
    fail_every: int = 5
    fail_error_no: int = int(MeasureErrorNo.RUNTIME_DEVICE)
    worker_id: int = 0
    reported: list[int] = field(default_factory=list)  # trial ids, in report order
    failed: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SimulatedWorker:
        self._client = httpx.Client(base_url=self.url, timeout=30,
                                    headers={"Authorization": f"Bearer {self.token}"})
        answer = self._client.post("/api/v1/workers", json={
            "name": self.name, "target": self.target, "device": self.device})
        answer.raise_for_status()
        self.worker_id = int(answer.json()["id"])
        # every later call speaks for this worker with the token its registration returned
        self._client.headers["Authorization"] = f"Bearer {answer.json()['token']}"
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def result(self, trial_id: int) -> dict[str, Any]:
        if len(self.reported) % self.fail_every == self.fail_every - 1:
            self.failed.add(trial_id)
            res = MeasureResult.failure(MeasureErrorNo(self.fail_error_no),
                                        "simulated device failure")
        else:
            cost = 1e-3 * (0.2 + 0.8 * random.Random(trial_id).random())
            res = MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                                timestamp=time.time())
        return res.model_dump(mode="json")

    def _run(self) -> None:
        base = f"/api/v1/workers/{self.worker_id}"
        while not self._stop.is_set():
            try:
                trials = self._client.post(f"{base}/lease", json={
                    "max_trials": self.batch, "wait_s": 0.5}).raise_for_status().json()["trials"]
                for trial in trials:
                    if self._stop.wait(self.pace_s):
                        self._client.post(f"{base}/release",
                                          json={"trial_ids": [trial["trial_id"]]})
                        continue
                    trial_id = int(trial["trial_id"])
                    res = self.result(trial_id)
                    self._client.post(f"{base}/results", json={"results": [{
                        "trial_id": trial_id, "result": res,
                        "info": {"worker": self.name}}]}).raise_for_status()
                    self.reported.append(trial_id)
            except httpx.HTTPError as err:  # keep going, as a real worker does
                self.errors.append(repr(err))
                self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._client.close()


# -------------------------------------------------------------------- a large database

CONV = "conv2d_nchw.cuda"
DENSE = "dense_small_batch.gpu"
SEED_TARGETS = (("cuda -model=h200", "cuda", "h200", ",cuda,gpu,"),
                ("cuda -model=a100", "cuda", "a100", ",cuda,gpu,"),
                ("rocm -model=gfx90a", "rocm", "gfx90a", ",rocm,gpu,"),
                ("opencl -model=pocl-cpu", "opencl", "pocl-cpu", ",opencl,gpu,"))
CONV_ENTITY = [["tile_f", "sp", [-1, 2, 8, 1]], ["tile_y", "sp", [-1, 1, 7, 1]],
               ["tile_x", "sp", [-1, 1, 7, 1]], ["tile_rc", "sp", [-1, 8]],
               ["tile_ry", "sp", [-1, 1]], ["tile_rx", "sp", [-1, 3]],
               ["auto_unroll_max_step", "ot", 512], ["unroll_explicit", "ot", 1]]
DENSE_ENTITY = [["tile_k", "sp", [-1, 8]], ["auto_unroll_max_step", "ot", 16]]


def seed_workloads(n_conv: int, n_dense: int) -> list[Workload]:
    """``n_conv`` distinct 3x3 conv2d and ``n_dense`` dense workloads, AutoTVM-style."""
    out = []
    for i in range(n_conv):
        c, hw, k = 16 * (1 + i % 32), 7 * (1 + (i // 32) % 8), 16 * (1 + (i // 256) % 16)
        out.append(Workload(template=CONV, args=[
            ["TENSOR", [1 + i // 4096, c, hw, hw], "float32"], ["TENSOR", [k, c, 3, 3], "float32"],
            [1, 1], [1, 1, 1, 1], [1, 1], "float32"]))
    for i in range(n_dense):
        n_in, n_out = 64 * (1 + i % 64), 64 * (1 + i // 64)
        out.append(Workload(template=DENSE, args=[
            ["TENSOR", [1, n_in], "float32"], ["TENSOR", [n_out, n_in], "float32"],
            None, "float32"]))
    return out


@dataclass(frozen=True)
class Seeded:
    job_id: int
    task_id: int
    n_records: int
    n_trials: int
    n_workloads: int
    worker_ids: list[int]


def seed_database(database_url: str, n_records: int = 100_000, n_trials: int = 1000,
                  n_conv: int = 2500, n_dense: int = 500) -> Seeded:
    """Bulk-insert (SQL, batches of 5,000) a fleet's history into a migrated database:
    ``n_records`` records over ``n_conv + n_dense`` workloads and four targets, of which
    the ``n_trials`` results (every 10th failed, error 4) of one running job's single
    conv2d task, measured by four live workers over the last few minutes."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    workloads = seed_workloads(n_conv, n_dense)
    keys = [(w.template, w.key, w.args_json()) for w in workloads]
    now = time.time()
    created = datetime.now(timezone.utc)

    def row(i: int, target: tuple[str, str, str, str], wl: int, cost: float, error_no: int,
            at: datetime, trial_id: int | None = None) -> dict[str, Any]:
        template, key, args = keys[wl]
        return {"target": target[0], "target_kind": target[1], "target_model": target[2],
                "target_keys": target[3], "template": template, "workload_key": key,
                "line": {"input": [target[0], template, args, {}],
                         "config": {"index": i, "code_hash": None,
                                    "entity": CONV_ENTITY if template == CONV else DENSE_ENTITY},
                         "result": [[cost], error_no, 0.1, now], "version": 0.2,
                         "tvm_version": "0.19.dev0"},
                "mean_cost": cost, "error_no": error_no, "timestamp": now, "created_at": at,
                "trial_id": trial_id}

    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with Session(engine) as session, session.begin():
            h200 = SEED_TARGETS[0]
            job = JobRow(target=h200[0], status="running", tuner="random",
                         n_trial=2 * n_trials, plan_size=16,
                         measure={"number": 1, "repeat": 1, "min_repeat_ms": 0},
                         created_at=created - timedelta(minutes=9))
            session.add(job)
            session.flush()
            task = TaskRow(job_id=job.id, template=CONV, args=keys[0][2], status="running",
                           trials_planned=n_trials, trials_done=n_trials)
            session.add(task)
            workers = [WorkerRow(name=f"gpu{i}:cuda:0", target=h200[0], limits={},
                                 last_seen=now - 2 * i, device="NVIDIA H200")
                       for i in range(4)]
            session.add_all(workers)
            session.flush()
            session.execute(insert(TrialRow), [
                {"task_id": task.id, "queue": h200[0],
                 "config": {"index": i, "entity": CONV_ENTITY}, "config_index": i,
                 "status": "done", "attempts": 1, "worker_id": workers[i % 4].id,
                 "error_no": 4 if i % 10 == 9 else 0} for i in range(n_trials)])
            trial_ids = list(session.scalars(select(TrialRow.id).where(
                TrialRow.task_id == task.id).order_by(TrialRow.id)))
            start = created - timedelta(minutes=8)
            costs = [1e9 if i % 10 == 9 else 2e-4 / (1 + i / 200) * (1 + i % 7 / 10)
                     for i in range(n_trials)]
            session.execute(insert(RecordRow), [
                row(i, h200, 0, costs[i], 4 if costs[i] == 1e9 else 0,
                    start + timedelta(seconds=i * 0.45), trial_ids[i])
                for i in range(n_trials)])
            task.best_cost = min(costs)
            task.best_trial = costs.index(task.best_cost) + 1
            batch: list[dict[str, Any]] = []
            old = created - timedelta(days=3)
            for i in range(n_records - n_trials):
                failed = i % 11 == 10
                cost = 1e9 if failed else 1e-4 * (1 + (i * 7919) % 1000 / 100)
                batch.append(row(i, SEED_TARGETS[i % 4], (i // 4) % len(keys), cost,
                                 3 if failed else 0, old))
                if len(batch) == 5000:
                    session.execute(insert(RecordRow), batch)
                    batch = []
            if batch:
                session.execute(insert(RecordRow), batch)
            seeded = Seeded(job.id, task.id, n_records, n_trials, len(keys),
                            [w.id for w in workers])
    finally:
        engine.dispose()
    return seeded


# ------------------------------------------------------------------------ page timing

# Records, in the page, when body[data-loaded] first turns "1": performance.now() is
# milliseconds since the navigation started, so this is HTML + assets + API + render.
LOADED_MARK = """
(() => {
  const mark = () => {
    if (window.__loadedAt === undefined && document.body
        && document.body.dataset.loaded === "1") {
      window.__loadedAt = performance.now();
    }
  };
  new MutationObserver(mark).observe(document, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["data-loaded"]});
})();
"""


def timed_visit(page: Any, url: str, timeout_ms: float = 30_000) -> tuple[float, float]:
    """Navigate ``page`` to ``url`` as a new document (from about:blank, so a hash route
    is never a same-document jump) and wait for body[data-loaded="1"]. Returns (ms from
    navigation start to data-loaded as the page saw it, ms of wall time around it here).
    ``page``'s context must have LOADED_MARK as an init script."""
    page.goto("about:blank")
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_function("window.__loadedAt !== undefined", timeout=timeout_ms)
    wall = (time.perf_counter() - t0) * 1000
    return float(page.evaluate("window.__loadedAt")), wall


def screenshot(page: Any, directory: Path, name: str) -> Path:
    """A viewport-sized PNG of ``page`` as ``directory/name``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    page.screenshot(path=str(path))
    return path


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def dump(value: Any) -> str:
    return json.dumps(value, indent=1)[:3000]

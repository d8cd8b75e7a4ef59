"""Faults and poison, against real processes (issue 14, point 7).

Faults: one job of 200 trials, measured by real `tuner worker` processes on the local
OpenCL device, lives through its workers SIGKILLed mid-lease, the server SIGKILLed and
restarted, Redis SIGKILLed while a plan is due and restarted empty, and PostgreSQL
stopped in immediate mode and restarted; it ends with every trial done and recorded
exactly once. The PostgreSQL and Redis are the test's own (tests/fault_fixtures.py).

Poison: a target that does not survive its own round trip (`opencl "-model=a b"` is
stored as `opencl -model=a b`, which does not parse) and `measure.timeout_s=1e300` are
refused at the edge; written straight into the database they fail their own job alone,
while another job on the same server and worker finishes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_fixtures import (
    DENSE,
    DENSE_ARGS,
    FAST,
    FaultCluster,
    Fleet,
    Unavailable,
    assert_exactly_once,
    fault_cluster,
    opencl_target,
    run_fault_sequence,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from compiler.templates import get_template
from schemas import (
    MeasureErrorNo,
    MeasureInput,
    MeasureResult,
    Record,
    Target,
    Workload,
)
from tuner_server.db.models import JobRow, RecordRow, TaskRow, WorkerRow
from tuner_server.db.session import make_engine, session_factory

pytestmark = pytest.mark.timeout(180)

QUOTED = 'opencl "-model=a b"'  # parses, but prints as the next one
BROKEN = "opencl -model=a b"  # does not parse


def _target_or_skip() -> str:
    try:
        return opencl_target()
    except Unavailable as err:
        pytest.skip(str(err))


# --------------------------------------------------------------------------------------
# Faults

@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FaultCluster]:
    _target_or_skip()
    try:
        with fault_cluster(tmp_path) as made:
            yield made
    except Unavailable as err:
        pytest.skip(str(err))


@pytest.mark.timeout(420)
def test_one_job_survives_worker_server_redis_and_postgres_faults(
        cluster: FaultCluster) -> None:
    """200 trials through four faults in turn: every trial done, one record each, no
    config measured twice, the workers not killed on purpose still serving, and the
    job's next record within a bounded time after each component came back."""
    target = _target_or_skip()
    fleet = cluster.fleet
    n_trial = 200
    job_id, timings = run_fault_sequence(cluster, target, n_trial=n_trial)
    assert fleet.wait_job(job_id) == "done", fleet.describe(job_id)
    assert_exactly_once(fleet, job_id, n_trial)
    assert [t.fault for t in timings] == ["workers SIGKILLed", "server SIGKILLed",
                                          "Redis SIGKILLed", "PostgreSQL stopped (immediate)"]
    # a lost worker's trials wait out their lease (4 s); nothing else should take long
    slow = [t for t in timings if t.recovery_s > 30]
    assert not slow, slow
    # with a backend down the server says so (503), and is ready again after
    backends = [t for t in timings if t.fault.startswith(("Redis", "PostgreSQL"))]
    assert [(t.ready_during, t.ready_after) for t in backends] == [(503, 200)] * 2, backends
    assert not fleet.dead_workers(), f"workers died: {fleet.dead_workers()}\n{fleet.logs()}"
    assert fleet.server is not None and fleet.server.poll() is None, fleet.logs()


# --------------------------------------------------------------------------------------
# Poison: one server on SQLite with the sql queue and one worker, shared by the module.

@pytest.fixture(scope="module")
def poison_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    _target_or_skip()
    directory = tmp_path_factory.mktemp("poison")
    fleet = Fleet(directory, f"sqlite:///{directory / 'tuner.db'}", "sql", lease_s=4.0)
    try:
        fleet.start_server()
        fleet.start_worker("steady")
        fleet.wait_registered("steady")
        yield fleet
    finally:
        fleet.close()


@pytest.fixture
def fleet(poison_fleet: Fleet) -> Fleet:
    """The shared fleet, its worker alive (a test that killed it must not fail the next)."""
    if poison_fleet.workers["steady"].poll() is not None:
        poison_fleet.start_worker("steady")
        poison_fleet.wait_registered("steady")
    return poison_fleet


def good_job(target: str, n_trial: int = 4) -> dict[str, Any]:
    return {"target": target, "tasks": [{"template": DENSE, "args": DENSE_ARGS}],
            "n_trial": n_trial, "tuner": "random", "plan_size": n_trial, "measure": FAST,
            "verify_top": 0}  # exact trial counts


def insert_job(fleet: Fleet, target: str, measure: dict[str, Any], n_trial: int = 2) -> int:
    """A job written straight into the database, as an older server (or a hand) would
    have stored it, bypassing the API's checks."""
    engine = make_engine(fleet.database_url)
    try:
        with session_factory(engine).begin() as session:
            job = JobRow(target=target, status="queued", tuner="random", n_trial=n_trial,
                         early_stopping=None, plan_size=n_trial, measure=measure)
            session.add(job)
            session.flush()
            session.add(TaskRow(job_id=job.id, template=DENSE, args=DENSE_ARGS,
                                status="queued", trials_planned=0, trials_done=0))
            return job.id
    finally:
        engine.dispose()


def assert_finishes(fleet: Fleet, job_id: int, n_trial: int = 4) -> None:
    assert fleet.wait_job(job_id) == "done", fleet.describe(job_id)
    assert_exactly_once(fleet, job_id, n_trial)


def count(fleet: Fleet, row: Any) -> int:
    return int(fleet.read(lambda s: s.scalar(select(func.count()).select_from(row))))


def test_bad_target_job_is_refused_and_a_corrupt_one_fails_alone(fleet: Fleet) -> None:
    target = _target_or_skip()
    jobs_before = count(fleet, JobRow)
    with fleet.client() as client:
        for bad in (QUOTED, BROKEN):
            response = client.post("/api/v1/jobs", json=good_job(bad))
            assert response.status_code == 422, (bad, response.status_code, response.text)
            assert "target" in response.json()["detail"], response.text
    assert count(fleet, JobRow) == jobs_before, "a refused job was stored"

    corrupt = insert_job(fleet, BROKEN, FAST)
    good = fleet.submit(good_job(target))
    assert_finishes(fleet, good)
    assert fleet.wait_job(corrupt, stall_s=30) == "failed", fleet.describe(corrupt)
    with fleet.client() as client:  # the failed job shows, with its reason
        listed = client.get("/api/v1/jobs")
        assert listed.status_code == 200, listed.text
        assert corrupt in [j["id"] for j in listed.json()], listed.text
        shown = client.get(f"/api/v1/jobs/{corrupt}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["status"] == "failed", shown.text
    with Session(fleet.db) as session:
        job = session.get(JobRow, corrupt)
        task = session.scalar(select(TaskRow).where(TaskRow.job_id == corrupt))
        assert job is not None and job.error, "the failed job does not say why"
        assert task is not None and task.status == "failed" and task.error, (
            task and (task.status, task.error))
    assert fleet.workers["steady"].poll() is None, fleet.logs()


def test_worker_with_bad_target_is_refused(fleet: Fleet) -> None:
    target = _target_or_skip()
    workers_before = count(fleet, WorkerRow)
    with fleet.client("worker") as client:
        for bad in (QUOTED, BROKEN):
            response = client.post("/api/v1/workers", json={"name": "poisoned", "target": bad})
            assert response.status_code == 422, (bad, response.status_code, response.text)
    assert count(fleet, WorkerRow) == workers_before, "a refused worker was stored"
    assert_finishes(fleet, fleet.submit(good_job(target)))


def _record_line(target: str) -> str:
    """A well-formed AutoTVM line for the dense workload with ``target`` as written."""
    workload = Workload.model_validate({"template": DENSE, "args": DENSE_ARGS})
    record = Record.from_measure(
        MeasureInput(target=Target.parse("opencl -model=pocl-cpu"), workload=workload,
                     config=get_template(DENSE).default_config(workload)),
        MeasureResult(costs=(1e-5,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                      timestamp=time.time()))
    line = record.to_json()
    line["input"][0] = target
    return json.dumps(line)


def test_imported_record_with_bad_target_is_refused(fleet: Fleet) -> None:
    records_before = count(fleet, RecordRow)
    with fleet.client("admin") as client:
        good = client.post("/api/v1/records/import", content=_record_line("opencl -model=pocl-cpu"),
                           headers={"Content-Type": "text/plain"})
        assert good.status_code == 200 and good.json()["accepted"] == 1, good.text
        for bad in (QUOTED, BROKEN):
            response = client.post("/api/v1/records/import", content=_record_line(bad),
                                   headers={"Content-Type": "text/plain"})
            if response.status_code == 200:  # per-line refusals: nothing kept, line named
                body = response.json()
                assert body["accepted"] == 0 and body["errors"], (bad, body)
            else:
                assert response.status_code in (400, 422), (bad, response.status_code,
                                                            response.text)
        assert count(fleet, RecordRow) == records_before + 1, "a refused record was stored"
        for path in ("/api/v1/records", "/api/v1/records?target=opencl",
                     "/api/v1/records/search", "/api/v1/logs/opencl -model=pocl-cpu"):
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code, response.text)


def test_huge_timeout_is_refused_and_a_stored_one_spares_the_worker(fleet: Fleet) -> None:
    target = _target_or_skip()
    with fleet.client() as client:
        response = client.post("/api/v1/jobs", json={**good_job(target),
                                                     "measure": {**FAST, "timeout_s": 1e300}})
        assert response.status_code == 422, (response.status_code, response.text)
        assert "timeout" in response.json()["detail"], response.text

    worker = fleet.workers["steady"]
    poison = insert_job(fleet, target, {**FAST, "timeout_s": 1e300})
    good = fleet.submit(good_job(target))
    assert_finishes(fleet, good)
    assert fleet.wait_job(poison, stall_s=60) == "failed", fleet.describe(poison)
    trials = fleet.trials(poison)
    assert trials and all(t.status == "done" and t.error_no not in (None, 0) for t in trials), (
        [(t.id, t.status, t.error_no) for t in trials])
    assert all(t.attempts <= 1 for t in trials), "a poison trial was leased again"
    assert worker.poll() is None, f"the worker died (exit {worker.returncode})\n{fleet.logs()}"

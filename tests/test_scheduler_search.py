"""The scheduler feeds the search: an lgbm job on a database that already holds TopHub
records of other workloads starts from a global model fitted on them (transfer), plans
the template's default config first, then new configs, within the budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_fixtures import TOPHUB_DIR
from sqlalchemy import select

from compiler.templates import get_template
from compiler.templates.conv2d_nchwc_winograd import tile_m
from schemas import Config, DeviceLimits, Target, Workload
from schemas.api import JobRequest
from tuner_server.db.models import TaskRow, TrialRow
from tuner_server.db.session import make_engine, session_factory, upgrade
from tuner_server.queue.sql import SqlQueue
from tuner_server.search.lgbm import LGBMTuner
from tuner_server.services import dispatch, jobs, records
from tuner_server.services.scheduler import SearchState, plan_once

TARGET = Target.parse("cuda -model=h200")
# a VGG-like layer that no TopHub log holds: nothing of the task itself is known
WORKLOAD = Workload(template="conv2d_nchw.cuda", args=[
    ["TENSOR", [1, 96, 40, 40], "float32"], ["TENSOR", [96, 96, 3, 3], "float32"],
    [1, 1], [1, 1, 1, 1], [1, 1], "float32"])


def test_lgbm_job_warm_starts_from_tophub_records(tmp_path: Path) -> None:
    log = TOPHUB_DIR / "cuda_v0.10.log"
    if not log.is_file():
        pytest.skip(f"{log} not found")
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as session:
        report = records.import_lines(session, log.read_text().splitlines())
        assert report.accepted > 500
        job_id = jobs.submit(session, JobRequest(target=TARGET, tasks=[WORKLOAD],
                                                   n_trial=20, tuner="lgbm", plan_size=16))
    state = SearchState()
    with sessions.begin() as session:
        plan_once(session, SqlQueue(), state)
    (tuner,) = state.tuners.values()
    assert isinstance(tuner, LGBMTuner)
    assert tuner.prior is not None and tuner.prior.n_workloads > 100, (
        "the TopHub records did not reach the global model")
    template = get_template(WORKLOAD.template)
    with sessions.begin() as session:
        task = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)).one()
        planned = [Config.model_validate(t.config) for t in
                   session.scalars(select(TrialRow).where(TrialRow.task_id == task.id))]
    assert len(planned) == 16 and len({c.index for c in planned}) == 16
    assert planned[0].index == template.default_config(WORKLOAD).index
    assert all(template.decode(WORKLOAD, c) for c in planned)
    # the rest of the budget (20) is all a second pass may add, once the first is measured
    with sessions.begin() as session:
        for trial in session.scalars(select(TrialRow)):
            trial.status = "done"
        plan_once(session, SqlQueue(), state)
        total = session.scalars(select(TrialRow)).all()
        assert len(total) == 20 and len({t.config_index for t in total}) == 20


def test_the_servers_scheduler_fits_the_global_model_apart(tmp_path: Path) -> None:
    """With sessions of its own (the server's scheduler), the first pass plans without
    waiting for the global model; the fit reads the records in its own session, and the
    task's tuner holds the model once it lands."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as session:
        records.import_lines(session, (TOPHUB_DIR / "cuda_v0.10.log").read_text().splitlines())
        jobs.submit(session, JobRequest(target=TARGET, tasks=[WORKLOAD], n_trial=20,
                                        tuner="lgbm", plan_size=16))
    state = SearchState(sessions=sessions)
    with sessions.begin() as session:
        plan_once(session, SqlQueue(), state)
        assert len(session.scalars(select(TrialRow)).all()) == 16  # planned meanwhile
    assert state.global_models.wait(120)
    (tuner,) = state.tuners.values()
    assert isinstance(tuner, LGBMTuner)
    assert tuner.prior is not None and tuner.prior.n_workloads > 100


def test_the_first_plan_runs_the_default_sized_for_the_workers_lanes(tmp_path: Path) -> None:
    """The default a job plans first (and verifies at its end) is the one an untuned
    build on the fleet's devices runs: with 16-lane (AVX-512) workers registered, the
    CPU template's wider default; the task keeps it, whatever registers later."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(engine)
    sessions = session_factory(engine)
    target = Target.parse("opencl -model=pocl-cpu")
    workload = Workload(template="conv2d_NCHWc.x86", args=[
        ["TENSOR", [1, 64, 28, 28], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])
    lanes16 = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, simd_lanes=16)
    with sessions.begin() as session:
        dispatch.register(session, "avx512", target, lanes16, None, 60.0)
        job_id = jobs.submit(session, JobRequest(target=target, tasks=[workload], n_trial=4,
                                                   tuner="random", plan_size=4))
    with sessions.begin() as session:
        plan_once(session, SqlQueue(), SearchState())
    template = get_template(workload.template)
    wide = template.default_config(workload, lanes16).index
    assert wide != template.default_config(workload).index
    with sessions.begin() as session:
        task = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)).one()
        planned = session.scalars(select(TrialRow).where(TrialRow.task_id == task.id)
                                  .order_by(TrialRow.id)).all()
        assert planned[0].config_index == wide
        assert task.default_index == wide  # what the verification and the view read


def test_the_first_plan_tries_the_defaults_other_winograd_tiles_next(tmp_path: Path) -> None:
    """Right after the default, the first plan measures the default at Winograd's other
    tile sizes (``default_variants``): a short search then has F(6x6) on a large image
    beside the default's other knobs. A budget of one trial still runs the default alone."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(engine)
    sessions = session_factory(engine)
    target = Target.parse("opencl -model=pocl-cpu")
    lanes16 = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, simd_lanes=16)
    workloads = [Workload(template="conv2d_NCHWc_winograd.x86", args=[
        ["TENSOR", [1, c, 56, 56], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"]) for c in (64, 128)]
    with sessions.begin() as session:
        dispatch.register(session, "avx512", target, lanes16, None, 60.0)
        wide = jobs.submit(session, JobRequest(target=target, tasks=[workloads[0]], n_trial=8,
                                               tuner="random", plan_size=8))
        one = jobs.submit(session, JobRequest(target=target, tasks=[workloads[1]], n_trial=1,
                                              tuner="random", plan_size=8))
    with sessions.begin() as session:
        plan_once(session, SqlQueue(), SearchState())
    template = get_template("conv2d_NCHWc_winograd.x86")

    def planned(job_id: int) -> tuple[TaskRow, list[int]]:
        with sessions.begin() as session:
            task = session.scalars(select(TaskRow).where(TaskRow.job_id == job_id)).one()
            return task, list(session.scalars(
                select(TrialRow.config_index).where(TrialRow.task_id == task.id)
                .order_by(TrialRow.id)))

    task, indices = planned(wide)
    default = template.default_config(workloads[0], lanes16)
    variants = [c.index for c in template.default_variants(workloads[0], lanes16)]
    assert len(variants) == 2 and default.index not in variants
    assert indices[:3] == [default.index, *variants] and task.default_index == default.index
    assert len(indices) == 8 and len(set(indices)) == 8
    space = template.space(workloads[0])
    assert [tile_m(template.decode(workloads[0], space.get(i))) for i in indices[:3]] == [4, 2, 6]
    task, indices = planned(one)
    assert indices == [template.default_config(workloads[1], lanes16).index]

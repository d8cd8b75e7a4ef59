"""A job driven through the scheduler by a simulated worker, with every pass timed: what
tests/test_scheduler_growth.py asserts on and bench/scheduler_pass.py --growth prints.

The worker is the server's own services called in-process (register, lease, report), so
results land in the database exactly as the results route stores them; its costs are a
made-up function of the config index (a tenth of the configs fail), and no kernel runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from schemas import DeviceLimits, MeasureErrorNo, MeasureResult, Target, Workload
from schemas.api import JobRequest, JobStatus
from tuner_server.db.models import JobRow
from tuner_server.queue.sql import SqlQueue
from tuner_server.services import dispatch, jobs
from tuner_server.services.scheduler import PassStats, SearchState, plan_once

TARGET = Target.parse("cuda -model=h200")
# ResNet-50's 3x3 conv of 64 channels at 56x56: ~90 million configs, far more than any
# job here plans, so no job ends early for want of configs
CONV = Workload(template="conv2d_nchw.cuda", args=[
    ["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
    [1, 1], [1, 1, 1, 1], [1, 1], "float32"])


def fake_result(index: int) -> MeasureResult:
    """A deterministic made-up measurement of the config at ``index``."""
    mix = (index * 2654435761) % 4294967296
    if mix % 10 == 0:
        return MeasureResult.failure(MeasureErrorNo.RUNTIME_DEVICE, "simulated failure")
    return MeasureResult(costs=(1e-4 * (1 + mix % 1000 / 100),),
                         error_no=MeasureErrorNo.NO_ERROR)


@dataclass
class Pass:
    """One timed scheduler pass: how far the job was when it began, and what it did."""

    done_before: int  # trials of the job recorded when the pass began
    seconds: float
    stats: PassStats


@dataclass
class Run:
    planning: list[Pass] = field(default_factory=list)  # passes that planned trials
    idle: list[Pass] = field(default_factory=list)  # passes right after, nothing to plan

    @staticmethod
    def median(passes: list[Pass]) -> float:
        return statistics.median(p.seconds for p in passes)


def run_job(sessions: sessionmaker[Session], n_trial: int, plan_size: int,
            tuner: str = "random", tasks: int = 1,
            state: SearchState | None = None) -> Run:
    """Submit one job of ``tasks`` copies of ``CONV`` and run it to its end: a planning
    pass (timed), an idle pass (timed: the plan is still queued), then the worker leases
    and reports every queued trial; again until the job ends."""
    state = state or SearchState()
    queue = SqlQueue()
    with sessions.begin() as session:
        job_id = jobs.submit(session, JobRequest(
            target=TARGET, tasks=[CONV] * tasks, n_trial=n_trial, plan_size=plan_size,
            tuner=tuner, verify_top=0))
        worker_id = dispatch.register(session, "sim", TARGET, DeviceLimits(), None,
                                      lease_s=600).id
    run = Run()
    done = 0
    while True:
        for passes in (run.planning, run.idle):
            started = time.perf_counter()
            with sessions.begin() as session:
                stats, _new, _requeued = plan_once(session, queue, state)
            passes.append(Pass(done, time.perf_counter() - started, stats))
        with sessions.begin() as session:
            worker = dispatch.get_worker(session, worker_id)
            assert worker is not None
            leased, _failed = dispatch.lease(session, queue, worker, 1_000_000, 600)
        if leased:
            with sessions.begin() as session:
                worker = dispatch.get_worker(session, worker_id)
                assert worker is not None
                dispatch.report(session, worker, [
                    (t.trial_id, fake_result(int(t.config["index"])), None) for t in leased])
            done += len(leased)
            continue
        with sessions.begin() as session:
            job = session.get(JobRow, job_id)
            assert job is not None
            if JobStatus(job.status).final:
                return run

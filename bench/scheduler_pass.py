"""Scheduler passes, timed in-process (no HTTP).

Default: a pass that must fit the global cost model, with the fit in the pass and apart
(the server's way), side by side: the first pass of an lgbm job on a database holding
TopHub's CUDA log (824 records of other workloads), twice each, alternating.

    .venv/bin/python bench/scheduler_pass.py

``--growth``: a job of ``--trials`` trials driven to its end through the scheduler by a
simulated worker (the server's lease and report services in-process, made-up costs; see
tests/scheduler_sim.py), on each backend; prints the median pass at the start of the job
(passes 2-11 of those that planned, and of the passes right after, which find the plan
still queued) against the median at its end (the last 10), and the most rows a pass read
to bring the task's search state up to date.

    .venv/bin/python bench/scheduler_pass.py --growth --trials 100000 --plan-size 256
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from scheduler_sim import Pass, run_job  # noqa: E402
from server_fixtures import migrated_sessions  # noqa: E402

from compiler.records import TOPHUB_DIR  # noqa: E402
from schemas import Target, Workload  # noqa: E402
from schemas.api import JobRequest  # noqa: E402
from tuner_server.db.session import make_engine, session_factory, upgrade  # noqa: E402
from tuner_server.queue.sql import SqlQueue  # noqa: E402
from tuner_server.services import jobs, records  # noqa: E402
from tuner_server.services.scheduler import SearchState, plan_once  # noqa: E402

TARGET = Target.parse("cuda -model=h200")
W = Workload(template="conv2d_nchw.cuda", args=[["TENSOR", [1, 96, 40, 40], "float32"], ["TENSOR", [96, 96, 3, 3], "float32"], [1, 1], [1, 1, 1, 1], [1, 1], "float32"])
WINDOW = 10  # passes in each median


def fit_in_the_pass() -> None:
    for apart in (False, True, False, True):
        d = tempfile.mkdtemp()
        engine = make_engine(f"sqlite:///{d}/db.sqlite"); upgrade(engine); sessions = session_factory(engine)
        with sessions.begin() as s:
            records.import_lines(s, (TOPHUB_DIR / "cuda_v0.10.log").read_text().splitlines())
            jobs.submit(s, JobRequest(target=TARGET, tasks=[W], n_trial=20, tuner="lgbm", plan_size=16))
        state = SearchState(sessions=sessions if apart else None)
        t = time.perf_counter()
        with sessions.begin() as s:
            plan_once(s, SqlQueue(), state)
        took = time.perf_counter() - t
        state.global_models.wait(120)
        print(("fit apart" if apart else "fit in the pass"), "first pass %.3f s" % took)


def ms(passes: list[Pass]) -> float:
    return 1e3 * statistics.median(p.seconds for p in passes)


def growth(backends: list[str], trials: int, plan_size: int, tuner: str) -> None:
    print(f"one task, {tuner} tuner, {trials} trials, plan_size {plan_size}; medians of "
          f"{WINDOW} passes")
    print(f"{'backend':10} {'pass':9} {'passes':>6} {'start ms':>9} {'end ms':>9} "
          f"{'end/start':>9} {'rows read max':>13} {'job s':>6}")
    for backend in backends:
        with migrated_sessions(backend, Path(tempfile.mkdtemp())) as sessions:
            started = time.perf_counter()
            run = run_job(sessions, trials, plan_size, tuner)
            took = time.perf_counter() - started
        planning = [p for p in run.planning if p.stats.planned]
        idle = run.idle[:len(planning)]
        for name, passes in (("planning", planning), ("idle", idle)):
            start, end = ms(passes[1:1 + WINDOW]), ms(passes[-WINDOW:])
            rows = max(p.stats.search_rows for p in passes[1:])
            print(f"{backend:10} {name:9} {len(passes):6} {start:9.1f} {end:9.1f} "
                  f"{end / start:9.2f} {rows:13} {took:6.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--growth", action="store_true")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--plan-size", type=int, default=256)
    parser.add_argument("--tuner", default="random")
    opts = parser.parse_args()
    if opts.growth:
        growth(opts.backends.split(","), opts.trials, opts.plan_size, opts.tuner)
    else:
        fit_in_the_pass()


if __name__ == "__main__":
    main()

"""A scheduler pass that must fit the global cost model, with the fit in the pass and
apart (the server's way), side by side: the first pass of an lgbm job on a database
holding TopHub's CUDA log (824 records of other workloads), twice each, alternating.

    .venv/bin/python bench/scheduler_pass.py
"""

import tempfile
import time

from compiler.records import TOPHUB_DIR
from schemas import Target, Workload
from schemas.api import JobRequest
from tuner_server.db.session import make_engine, session_factory, upgrade
from tuner_server.queue.sql import SqlQueue
from tuner_server.services import jobs, records
from tuner_server.services.scheduler import SearchState, plan_once

TARGET = Target.parse("cuda -model=h200")
W = Workload(template="conv2d_nchw.cuda", args=[["TENSOR", [1, 96, 40, 40], "float32"], ["TENSOR", [96, 96, 3, 3], "float32"], [1, 1], [1, 1, 1, 1], [1, 1], "float32"])
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

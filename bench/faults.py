"""Recovery times: one tuning job lives through four faults, each timed.

The scenario of tests/test_faults.py (the same code: tests/fault_fixtures.py), with its
timings printed. A PostgreSQL (initdb + pg_ctl) and a redis-server of the benchmark's own
on free ports in a temp dir, a `tuner serve` process, and `tuner worker` processes on the
local OpenCL device measuring real kernels (conv2d_nchw.cuda on a 4x4x4 input, 1x1
kernel, timed once and checked against numpy). One job of --trials trials; after each
fifth of it is recorded, one fault:

  (a) every worker SIGKILLed while it holds a lease; new workers started at once
  (b) the server SIGKILLed and started again on the same port
  (c) Redis SIGKILLed when the scheduler is about to plan, restarted empty (no
      persistence: every ticket is gone)
  (d) PostgreSQL stopped with `pg_ctl stop -m immediate`, 3 s down, started again

  down       the fault to the component answering again (the server's /healthz,
             redis PING, pg_ctl -w start; 0 for (a): workers are replaced at once)
  recovery   the component answering again to the job's next record, as the server
             stored it (records.created_at); for (a), the kill to the first record of
             a new worker (the trials the killed ones held go back to the queue, behind
             what is already queued, once their leases run out: the note says when the
             last of them was recorded)

Then the job must end with every trial done and recorded exactly once.

    .venv/bin/python bench/faults.py
    .venv/bin/python bench/faults.py --trials 400 --workers 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_model, git_revision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fault_fixtures import (
    assert_exactly_once,
    fault_cluster,
    opencl_target,
    run_fault_sequence,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--plan-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2, help="trials a worker leases at once")
    parser.add_argument("--lease", type=float, default=4.0, help="the server's lease, s")
    args = parser.parse_args()

    target = opencl_target()
    print(f"# {git_revision()}; {cpu_model()}, {os.cpu_count()} cores; device {target}")
    print(f"# {args.trials} trials, plan size {args.plan_size}, {args.workers} workers x "
          f"batch {args.batch}, lease {args.lease:g} s")
    directory = Path(tempfile.mkdtemp(prefix="tuner-bench-faults-"))
    start = time.time()
    try:
        with fault_cluster(directory, lease_s=args.lease) as cluster:
            job_id, timings = run_fault_sequence(
                cluster, target, n_trial=args.trials, plan_size=args.plan_size,
                workers=args.workers, batch=args.batch, log=lambda line: print(f"# {line}"))
            status = cluster.fleet.wait_job(job_id)
            records = assert_exactly_once(cluster.fleet, job_id, args.trials)
            failed = sum(not r.result.ok for _, r in records)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print("| fault | at record | down (s) | recovery (s) | note |")
    print("|---|---:|---:|---:|---|")
    for t in timings:
        print(f"| {t.fault} | {t.records_before} | {t.outage_s:.1f} | {t.recovery_s:.2f} | "
              f"{t.note} |")
    print()
    print(f"job {status}: {len(records)} records for {args.trials} trials, each trial "
          f"once, each config once ({failed} failed measurements); "
          f"{time.time() - start:.0f} s in all")


if __name__ == "__main__":
    main()

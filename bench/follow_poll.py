"""What following a tuning job costs the embedded server, poll by poll (issue 17).

``tuner tune`` follows its job every ``POLL_S`` while the worker beside the server
times kernels on the same cores. On a copy of a finished job's database (``bench/models.py
--database-url``), the embedded fleet started on it (its scheduler's passes find no active
job, its worker nothing to lease): this process's CPU for reading the job view, for every
task's trial list (the first page, then asked again with nothing new: what each poll
asked before ``Client.follow`` skipped tasks whose count had not grown; it now asks none
of them) and for ``Client.follow`` of the ended job (one poll), ``--rounds`` times.

    .venv/bin/python bench/follow_poll.py --database-url sqlite:////tmp/r50.db
"""

from __future__ import annotations

import argparse
import resource
import sqlite3
import tempfile
from pathlib import Path

from common import print_header

from tuner.client import Client
from tuner.embedded import EmbeddedFleet


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", required=True, help="a SQLite URL (copied first)")
    p.add_argument("--job", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "follow.db"
        # SQLite's backup: what the write-ahead log still holds comes along
        with sqlite3.connect(args.database_url.removeprefix("sqlite:///")) as source, \
                sqlite3.connect(copy) as target:
            source.backup(target)
        fleet = EmbeddedFleet(f"sqlite:///{copy}", "opencl:0")
        fleet.start()
        try:
            print_header("bench/follow_poll.py", "opencl:0 (the embedded worker's; it "
                         "measures nothing here: the job has ended)")
            with Client(fleet.url, fleet.client_token, timeout=60) as client:
                for _ in range(args.rounds):
                    began = cpu()
                    job = client.job(args.job)
                    viewed = cpu()
                    last = {}  # each task's first page: the first poll's lists
                    for task in job.tasks:
                        page = client.trials(job.id, task.id).items
                        last[task.id] = page[-1].id if page else None
                    first = cpu()
                    for task in job.tasks:  # every task asked again: nothing new
                        client.trials(job.id, task.id, after=last[task.id])
                    every = cpu()
                    client.follow(job.id)  # an ended job: one poll, as Client.follow asks
                    followed = cpu()
                    print(f"job view {(viewed - began) * 1e3:.1f} ms CPU; every task's "
                          f"trials, first page {(first - viewed) * 1e3:.1f} ms, asked again "
                          f"with nothing new {(every - first) * 1e3:.1f} ms ({len(job.tasks)} "
                          f"tasks); Client.follow of the ended job {(followed - every) * 1e3:.1f}"
                          " ms")
        finally:
            fleet.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

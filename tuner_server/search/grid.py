"""Grid search: the space in index order (AutoTVM's GridSearchTuner), skipping what was
visited or does not fit. Only useful on small spaces, and as a baseline.

A cursor marks where the last plan stopped: everything before it was proposed, visited or
invalid, so each plan scans only on from there. That holds only while every config it
proposed stays visited: a caller that drops a plan (one never stored) must drop the tuner
with it, as the scheduler forgets a task whole after a pass that did not commit, or the
dropped configs are skipped for good. The cursor lives with the tuner object and is
derived again by a new one (a restart): its first plan scans from index 0 past what the
database says was visited, once."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.templates import Template
from schemas import DeviceLimits, Workload
from tuner_server.search.base import Measured, Tuner, Visited

# The first block a plan scans is a few times the plan; blocks double from there.
_MIN_BLOCK = 256
_MAX_BLOCK = 65_536


class GridTuner(Tuner):
    name = "grid"

    def __init__(self, template: Template, workload: Workload,
                 limits: DeviceLimits | None = None, seed: int = 0,
                 pool: Sequence[int] | np.ndarray | None = None) -> None:
        super().__init__(template, workload, limits, seed, pool)
        # a position in the listed configs (pool or small space), else an index
        self.cursor = 0

    def propose(self, n: int, visited: Visited, measured: Measured) -> np.ndarray:
        listed = self.listed()
        end = len(self.space) if listed is None else len(listed)
        out: list[np.ndarray] = []
        count = 0
        block = max(4 * n, _MIN_BLOCK)
        while count < n and self.cursor < end:
            stop = min(self.cursor + block, end)
            span = np.arange(self.cursor, stop, dtype=np.int64)
            if listed is None:
                keep = span[self.valid(span) & ~visited.contains(span)]
            else:
                keep = span[~visited.contains(listed[span])]
            take = keep[: n - count]
            out.append(take if listed is None else listed[take])
            count += len(take)
            # past the last one taken when the plan is full, else past the block
            self.cursor = int(take[-1]) + 1 if count >= n else stop
            block = min(2 * block, _MAX_BLOCK)
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

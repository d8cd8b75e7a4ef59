"""The tuner interface: given what was measured, propose the next batch of configs.

Tuners work on config indices of the template's space (AutoTVM's mixed-radix index) with
numpy, so that a batch is chosen among 10^5..10^8 configs in milliseconds; a config is
built only for what is proposed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from compiler.templates import Template
from schemas import Config, DeviceLimits, MeasureResult, Workload

History = Sequence[tuple[Config, MeasureResult]]
# Below this many candidates, list them all instead of drawing and redrawing.
ENUMERATE_BELOW = 200_000


class Tuner(ABC):
    """Decides from what comes in (history, visited): a restarted server resumes a task
    from the database alone. A tuner object may live across plans of one task and keep
    search state that only speeds it up (the annealing chains of ``lgbm``).

    ``pool`` restricts the search to those indices: the benchmark replays a table of
    measured configs, as kernel_tuner's simulation mode does.
    """

    name: str
    needs_history = False  # model-based tuners read the measured configs
    uses_prior = False  # takes a global model (transfer learning) as ``prior``

    def __init__(self, template: Template, workload: Workload,
                 limits: DeviceLimits | None = None, seed: int = 0,
                 pool: Sequence[int] | np.ndarray | None = None) -> None:
        self.template = template
        self.workload = workload
        self.space = template.space(workload)
        self.limits = limits
        self.seed = seed
        self.pool = None if pool is None else np.unique(np.asarray(pool, dtype=np.int64))

    def rng(self, visited: set[int]) -> np.random.Generator:
        """A generator for one plan: the same history gives the same plan."""
        return np.random.default_rng([self.seed, len(visited)])

    def fits(self, config: Config) -> bool:
        return self.limits is None or not self.template.check_limits(
            self.workload, config, self.limits)

    def valid(self, indices: np.ndarray) -> np.ndarray:
        """Which of ``indices`` may be proposed: inside the pool, fitting the limits."""
        ok = np.ones(len(indices), dtype=bool)
        if self.pool is not None:
            ok &= np.isin(indices, self.pool)
        if self.limits is not None and len(indices):
            ok &= self.template.valid_mask(self.workload, indices, self.limits)
        return ok

    def unvisited(self, indices: np.ndarray, visited: set[int]) -> np.ndarray:
        if not visited or not len(indices):
            return np.ones(len(indices), dtype=bool)
        return ~np.isin(indices, np.fromiter(visited, dtype=np.int64, count=len(visited)))

    def candidates(self, visited: set[int]) -> np.ndarray | None:
        """Every valid, unvisited index when they can be listed (pool or small space);
        None for a space too large to list."""
        if self.pool is not None:
            every = self.pool
        elif len(self.space) < ENUMERATE_BELOW:
            every = np.arange(len(self.space), dtype=np.int64)
        else:
            return None
        return every[self.valid(every) & self.unvisited(every, visited)]

    def random_indices(self, n: int, visited: set[int], rng: np.random.Generator,
                       exclude: set[int] = frozenset()) -> np.ndarray:  # type: ignore[assignment]
        """Up to ``n`` distinct valid indices drawn uniformly, none visited or excluded."""
        taken = visited | exclude
        listed = self.candidates(taken)
        if listed is not None:
            return rng.permutation(listed)[:n]
        found: list[int] = []
        seen = set(taken)
        for _ in range(200):  # bounded: a space mostly over the limits yields fewer
            draw = np.unique(rng.integers(0, len(self.space), size=max(4 * n, 64)))
            draw = draw[self.valid(draw)]
            for index in rng.permutation(draw).tolist():
                if index not in seen:
                    seen.add(index)
                    found.append(index)
            if len(found) >= n:
                break
        return np.array(found[:n], dtype=np.int64)

    def configs(self, indices: np.ndarray | Sequence[int]) -> list[Config]:
        return [self.space.get(int(i)) for i in indices]

    @abstractmethod
    def next_batch(self, n: int, visited: set[int], history: History = ()) -> list[Config]:
        """Up to ``n`` configs, none of them in ``visited``, each fitting the limits."""


def perf_of(result: MeasureResult) -> float:
    """What every search maximises: 1/cost; 0 for a failed (or zero-cost) result."""
    cost = result.mean_cost
    return 1.0 / cost if result.ok and cost > 0 else 0.0


def throughput(history: History) -> tuple[np.ndarray, np.ndarray]:
    """(indices, perf_of) of a history."""
    indices = np.array([c.index for c, _ in history], dtype=np.int64)
    perf = np.array([perf_of(r) for _, r in history], dtype=np.float64)
    return indices, perf

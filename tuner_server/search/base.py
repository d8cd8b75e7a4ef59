"""The tuner interface: given what was measured, propose the next batch of configs.

Tuners work on config indices of the template's space (AutoTVM's mixed-radix index) with
numpy, so that a batch is chosen among 10^5..10^8 configs in milliseconds, and they answer
an array of indices: the scheduler builds and stores the configs in bulk. What a task
planned (:class:`Visited`) and measured (:class:`Measured`) grows by appending, so a plan
late in a long job costs what one at its start does."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

import numpy as np

from compiler.templates import Template
from schemas import DeviceLimits, MeasureResult, Workload

# Below this many candidates, list them all instead of drawing and redrawing.
ENUMERATE_BELOW = 200_000


def _int64(indices: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(indices, np.ndarray):
        return indices.astype(np.int64, copy=False).ravel()
    return np.fromiter(indices, dtype=np.int64)


class Visited:
    """The config indices a task has planned, as a sorted array: a batch's membership
    is one vectorised search, and ``add`` merges a batch in without sorting it all
    again."""

    def __init__(self, indices: Iterable[int] | np.ndarray = ()) -> None:
        self._sorted = np.unique(_int64(indices))

    def __len__(self) -> int:
        return len(self._sorted)

    def contains(self, indices: np.ndarray) -> np.ndarray:
        """bool [n]: which of ``indices`` were planned."""
        indices = np.asarray(indices, dtype=np.int64)
        if not len(self._sorted) or not indices.size:
            return np.zeros(indices.shape, dtype=bool)
        at = np.minimum(np.searchsorted(self._sorted, indices), len(self._sorted) - 1)
        return self._sorted[at] == indices

    def add(self, indices: Iterable[int] | np.ndarray) -> None:
        """Add ``indices`` (repeats and known ones are ignored): one ``np.insert`` of the
        new ones at their places, which copies the array (O(planned + batch)), not
        in place, but sorts only the batch."""
        new = np.unique(_int64(indices))
        new = new[~self.contains(new)]
        if new.size:
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, new), new)


class Measured:
    """A task's measured configs and their throughput (:func:`perf_of`), in the order
    they were learnt: what model-based tuners fit on. Appended to as results arrive
    (amortised, like a list), never re-read whole."""

    def __init__(self) -> None:
        self._indices = np.empty(64, dtype=np.int64)
        self._perf = np.empty(64, dtype=np.float64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, indices: Sequence[int] | np.ndarray, perf: Sequence[float] | np.ndarray) -> None:
        """Append configs and their throughputs, one each: a 1-d array apiece, alike."""
        indices = np.asarray(indices, dtype=np.int64)
        perf = np.asarray(perf, dtype=np.float64)
        if indices.ndim != 1 or indices.shape != perf.shape:
            raise ValueError(f"indices of shape {indices.shape} but throughputs of shape "
                             f"{perf.shape}: one throughput per index, in 1-d arrays")
        end = self._n + len(indices)
        if end > len(self._indices):
            size = max(end, 2 * len(self._indices))
            self._indices = np.resize(self._indices, size)
            self._perf = np.resize(self._perf, size)
        self._indices[self._n:end] = indices
        self._perf[self._n:end] = perf
        self._n = end

    @property
    def indices(self) -> np.ndarray:
        return self._indices[:self._n]

    @property
    def perf(self) -> np.ndarray:
        return self._perf[:self._n]

    def best(self, k: int) -> np.ndarray:
        """Positions of the ``k`` highest throughputs, best first (O(n), no full sort)."""
        k = min(k, self._n)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        perf = self.perf
        top = np.argpartition(-perf, k - 1)[:k] if k < self._n else np.arange(self._n)
        return top[np.argsort(-perf[top], kind="stable")]


class Tuner(ABC):
    """Decides from what comes in (visited, measured): a restarted server resumes a task
    from the database alone. A tuner object may live across plans of one task and keep
    state that only speeds it up (the annealing chains of ``lgbm``, grid's cursor, the
    list of valid configs of a small space).

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
        self._listed: np.ndarray | None = None

    def rng(self, visited: Visited) -> np.random.Generator:
        """A generator for one plan: the same history gives the same plan."""
        return np.random.default_rng([self.seed, len(visited)])

    def valid(self, indices: np.ndarray) -> np.ndarray:
        """Which of ``indices`` may be proposed, in one vectorised call: inside the pool,
        passing the template's rules always and the device limits when known."""
        ok = np.ones(len(indices), dtype=bool)
        if self.pool is not None:
            ok &= np.isin(indices, self.pool)
        if len(indices):
            ok &= self.template.valid_mask(self.workload, indices, self.limits)
        return ok

    def listed(self) -> np.ndarray | None:
        """Every valid index, sorted, when they can be listed (pool or small space), else
        None; computed once per tuner (its limits do not change)."""
        if self._listed is None:
            if self.pool is not None:
                every = self.pool
            elif len(self.space) < ENUMERATE_BELOW:
                every = np.arange(len(self.space), dtype=np.int64)
            else:
                return None
            self._listed = every[self.valid(every)]
        return self._listed

    def candidates(self, visited: Visited) -> np.ndarray | None:
        """Every valid, unvisited index when they can be listed; None for a space too
        large to list."""
        listed = self.listed()
        return None if listed is None else listed[~visited.contains(listed)]

    def random_indices(self, n: int, visited: Visited, rng: np.random.Generator,
                       exclude: Sequence[int] | np.ndarray = ()) -> np.ndarray:
        """Up to ``n`` distinct valid indices drawn uniformly, none visited or excluded."""
        exclude = np.asarray(exclude, dtype=np.int64)
        listed = self.candidates(visited)
        if listed is not None:
            return rng.permutation(listed[~np.isin(listed, exclude)])[:n]
        found: list[np.ndarray] = []
        count = 0
        for _ in range(200):  # bounded: a space mostly over the limits yields fewer
            draw = np.unique(rng.integers(0, len(self.space), size=max(4 * n, 64)))
            draw = draw[~visited.contains(draw) & ~np.isin(draw, exclude)]
            for earlier in found:
                draw = draw[~np.isin(draw, earlier)]
            draw = rng.permutation(draw[self.valid(draw)])[: n - count]
            found.append(draw)
            count += len(draw)
            if count >= n:
                break
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

    @abstractmethod
    def propose(self, n: int, visited: Visited, measured: Measured) -> np.ndarray:
        """Up to ``n`` distinct config indices (int64), none of them visited, each valid
        (:meth:`valid`)."""


def perf_of(result: MeasureResult) -> float:
    """What every search maximises: 1/cost; 0 for a failed (or zero-cost) result."""
    cost = result.mean_cost
    return 1.0 / cost if result.ok and cost > 0 else 0.0


def perf_of_columns(mean_cost: np.ndarray, error_no: np.ndarray) -> np.ndarray:
    """:func:`perf_of` from a record's stored ``mean_cost`` and ``error_no`` columns
    (what the result's ``mean_cost`` and ``ok`` were), for many records at once."""
    mean_cost = np.asarray(mean_cost, dtype=np.float64)
    ok = (np.asarray(error_no) == 0) & (mean_cost > 0)
    return np.where(ok, 1.0 / np.where(ok, mean_cost, 1.0), 0.0)

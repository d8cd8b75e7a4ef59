"""Simulated annealing over a config space, scored by a cost model (AutoTVM's
ModelOptimizer): parallel chains walk by random moves, accept worse points with a
probability that cools to zero, and stop early once the best points found stop
changing. The chains persist across plans of a task (the explorer object lives with
its tuner), so each plan continues the walk instead of restarting it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from compiler.templates.space import ConfigSpace

Score = Callable[[np.ndarray], np.ndarray]  # indices -> scores, -inf where invalid


class Walk(Protocol):
    def move(self, indices: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...


class SpaceWalk:
    """A move changes one knob, chosen at random: to the next or previous value (a local
    step: neighbouring split factors) or, with probability ``jump``, to any value."""

    def __init__(self, space: ConfigSpace, jump: float = 0.3) -> None:
        self.space, self.jump = space, jump

    def move(self, indices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        pos = self.space.positions(indices)
        radices = self.space.radices
        knob = rng.integers(0, len(radices), size=len(indices))
        rows = np.arange(len(indices))
        step = pos[rows, knob] + rng.choice((-1, 1), size=len(indices))
        anywhere = rng.integers(0, radices[knob])
        pos[rows, knob] = np.where(rng.random(len(indices)) < self.jump, anywhere,
                                   np.mod(step, radices[knob]))
        return self.space.indices(pos)


class PoolWalk:
    """Moves inside a fixed set of configs (a replayed table): to one of the ``k``
    members nearest in knob values (Hamming distance over knob positions)."""

    def __init__(self, space: ConfigSpace, pool: np.ndarray, k: int = 8) -> None:
        self.pool = np.asarray(pool, dtype=np.int64)
        self._row = {int(i): r for r, i in enumerate(self.pool)}
        pos = space.positions(self.pool)
        k = min(k, len(self.pool) - 1)
        self.near = np.empty((len(self.pool), max(k, 0)), dtype=np.int64)
        for start in range(0, len(self.pool), 1024):  # bounded memory on large pools
            block = pos[start:start + 1024]
            dist = (block[:, None, :] != pos[None, :, :]).sum(axis=2).astype(np.float64)
            dist[np.arange(len(block)), np.arange(start, start + len(block))] = np.inf
            if k > 0:
                # ties broken by a fixed jitter so that equal distances spread
                jitter = np.random.default_rng(start).random(dist.shape) * 0.5
                self.near[start:start + len(block)] = np.argpartition(dist + jitter, k - 1,
                                                                      axis=1)[:, :k]

    def move(self, indices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.near.shape[1] == 0:
            return indices.copy()
        rows = np.array([self._row[int(i)] for i in indices])
        pick = rng.integers(0, self.near.shape[1], size=len(rows))
        return self.pool[self.near[rows, pick]]


class SimulatedAnnealing:
    def __init__(self, walk: Walk, n_chains: int = 64, max_steps: int = 300,
                 early_stop: int = 40, t0: float = 0.1) -> None:
        self.walk = walk
        self.n_chains, self.max_steps, self.early_stop, self.t0 = (
            n_chains, max_steps, early_stop, t0)
        self.points: np.ndarray | None = None
        self.steps_run = 0  # of the last ``explore``, for tests and benchmarks

    def explore(self, score: Score, n_best: int, start: np.ndarray,
                exclude: Callable[[np.ndarray], np.ndarray],
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The ``n_best`` highest-scoring points met (valid, not ``exclude``d), best first.

        ``start`` places the chains (the caller passes the best measured configs, then
        ``self.points``, where the chains of the last call ended: they persist).
        """
        points = np.asarray(start[: self.n_chains], dtype=np.int64).copy()
        if len(points) == 0:
            return np.empty(0, np.int64), np.empty(0)
        current = score(points)
        found: dict[int, float] = {}

        def remember(indices: np.ndarray, scores: np.ndarray) -> bool:
            """Adds new candidates; True when the top ``n_best`` changed."""
            fresh = np.isfinite(scores) & ~exclude(indices)
            threshold = _kth_best(found, n_best)
            changed = False
            for i, s in zip(indices[fresh].tolist(), scores[fresh].tolist()):
                if i not in found:
                    found[i] = s
                    changed |= s > threshold
            return changed

        remember(points, current)
        finite = current[np.isfinite(current)]
        scale = float(np.std(finite)) if len(finite) > 1 and np.std(finite) > 0 else 1.0
        quiet = 0
        self.steps_run = 0
        for step in range(self.max_steps):
            temp = self.t0 * scale * (1 - step / self.max_steps)
            proposed = self.walk.move(points, rng)
            scores = score(proposed)
            with np.errstate(over="ignore", invalid="ignore"):
                gain = np.where(np.isfinite(scores), scores - current, -np.inf)
                accept = (gain >= 0) | (rng.random(len(points)) < np.exp(gain / max(temp, 1e-12)))
            points = np.where(accept, proposed, points)
            current = np.where(accept, scores, current)
            self.steps_run = step + 1
            quiet = 0 if remember(proposed, scores) else quiet + 1
            if quiet >= self.early_stop:
                break
        self.points = points
        ranked = sorted(found.items(), key=lambda kv: -kv[1])[:n_best]
        return (np.array([i for i, _ in ranked], dtype=np.int64),
                np.array([s for _, s in ranked], dtype=np.float64))


def _kth_best(found: dict[int, float], k: int) -> float:
    if len(found) < k:
        return -np.inf
    values = np.fromiter(found.values(), dtype=np.float64, count=len(found))
    return float(np.partition(values, len(values) - k)[len(values) - k])

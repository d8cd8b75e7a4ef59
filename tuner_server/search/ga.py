"""Genetic algorithm (AutoTVM's GATuner, stateless): the population is the fittest
measured configs; children come from fitness-proportional parents, uniform crossover
of knob values and per-knob mutation. Until enough is measured, it samples at random."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.templates import Template
from schemas import DeviceLimits, Workload
from tuner_server.search.base import Measured, Tuner, Visited


class GATuner(Tuner):
    name = "ga"
    needs_history = True

    def __init__(self, template: Template, workload: Workload,
                 limits: DeviceLimits | None = None, seed: int = 0,
                 pool: Sequence[int] | np.ndarray | None = None,
                 pop_size: int = 32, mutation: float = 0.1) -> None:
        super().__init__(template, workload, limits, seed, pool)
        self.pop_size, self.mutation = pop_size, mutation

    def propose(self, n: int, visited: Visited, measured: Measured) -> np.ndarray:
        rng = self.rng(visited)
        perf = measured.perf
        if n <= 0 or int((perf > 0).sum()) < min(self.pop_size, 8):
            return self.random_indices(n, visited, rng)
        top = measured.best(self.pop_size)
        top = top[perf[top] > 0]
        parents = self.space.positions(measured.indices[top])
        weights = perf[top] / perf[top].sum()
        radices = self.space.radices
        chosen = np.empty(0, dtype=np.int64)
        for _ in range(50):  # generations of candidates until the batch is full
            m = 4 * n
            a = parents[rng.choice(len(parents), size=m, p=weights)]
            b = parents[rng.choice(len(parents), size=m, p=weights)]
            child = np.where(rng.random(a.shape) < 0.5, a, b)
            mutate = rng.random(child.shape) < self.mutation
            child = np.where(mutate, rng.integers(0, radices, size=child.shape), child)
            kids = self.space.indices(child)
            # first appearances, in order of birth
            kids = kids[np.sort(np.unique(kids, return_index=True)[1])]
            kids = kids[~visited.contains(kids) & ~np.isin(kids, chosen)]
            kids = kids[self.valid(kids)]
            chosen = np.concatenate([chosen, kids[: n - len(chosen)]])
            if len(chosen) == n:
                return chosen
        # a converged population: fill with random configs
        extra = self.random_indices(n - len(chosen), visited, rng, exclude=chosen)
        return np.concatenate([chosen, extra])

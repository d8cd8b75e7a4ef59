"""Genetic algorithm (AutoTVM's GATuner, stateless): the population is the fittest
measured configs; children come from fitness-proportional parents, uniform crossover
of knob values and per-knob mutation. Until enough is measured, it samples at random."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.templates import Template
from schemas import Config, DeviceLimits, Workload
from tuner_server.search.base import History, Tuner, throughput


class GATuner(Tuner):
    name = "ga"
    needs_history = True

    def __init__(self, template: Template, workload: Workload,
                 limits: DeviceLimits | None = None, seed: int = 0,
                 pool: Sequence[int] | np.ndarray | None = None,
                 pop_size: int = 32, mutation: float = 0.1) -> None:
        super().__init__(template, workload, limits, seed, pool)
        self.pop_size, self.mutation = pop_size, mutation

    def next_batch(self, n: int, visited: set[int], history: History = ()) -> list[Config]:
        rng = self.rng(visited)
        indices, perf = throughput(history)
        alive = perf > 0
        if alive.sum() < min(self.pop_size, 8):
            return self.configs(self.random_indices(n, visited, rng))
        order = np.argsort(-perf[alive])[: self.pop_size]
        parents = self.space.positions(indices[alive][order])
        weights = perf[alive][order]
        weights = weights / weights.sum()
        radices = self.space.radices
        chosen: list[int] = []
        taken = set(visited)
        for _ in range(50):  # generations of candidates until the batch is full
            m = 4 * n
            a = parents[rng.choice(len(parents), size=m, p=weights)]
            b = parents[rng.choice(len(parents), size=m, p=weights)]
            child = np.where(rng.random(a.shape) < 0.5, a, b)
            mutate = rng.random(child.shape) < self.mutation
            child = np.where(mutate, rng.integers(0, radices, size=child.shape), child)
            kids = self.space.indices(child)
            kids = kids[self.valid(kids)]
            for index in kids.tolist():
                if index not in taken:
                    taken.add(index)
                    chosen.append(index)
                    if len(chosen) == n:
                        return self.configs(chosen)
        # a converged population: fill with random configs
        extra = self.random_indices(n - len(chosen), visited, rng, exclude=set(chosen))
        return self.configs(chosen + extra.tolist())

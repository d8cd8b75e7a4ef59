"""Random search: uniform over the valid, unvisited configs of the space."""

from __future__ import annotations

from schemas import Config
from tuner_server.search.base import History, Tuner


class RandomTuner(Tuner):
    name = "random"

    def next_batch(self, n: int, visited: set[int], history: History = ()) -> list[Config]:
        return self.configs(self.random_indices(n, visited, self.rng(visited)))

"""Random search: uniform over the valid, unvisited configs of the space."""

from __future__ import annotations

import numpy as np

from tuner_server.search.base import Measured, Tuner, Visited


class RandomTuner(Tuner):
    name = "random"

    def propose(self, n: int, visited: Visited, measured: Measured) -> np.ndarray:
        return self.random_indices(n, visited, self.rng(visited))

"""Grid search: the space in index order (AutoTVM's GridSearchTuner), skipping what was
visited or does not fit. Only useful on small spaces, and as a baseline."""

from __future__ import annotations

import numpy as np

from schemas import Config
from tuner_server.search.base import History, Tuner

_CHUNK = 65_536


class GridTuner(Tuner):
    name = "grid"

    def next_batch(self, n: int, visited: set[int], history: History = ()) -> list[Config]:
        listed = self.candidates(visited)
        if listed is not None:
            return self.configs(np.sort(listed)[:n])
        out: list[int] = []
        start = 0
        while len(out) < n and start < len(self.space):
            chunk = np.arange(start, min(start + _CHUNK, len(self.space)), dtype=np.int64)
            chunk = chunk[self.valid(chunk) & self.unvisited(chunk, visited)]
            out += chunk[: n - len(out)].tolist()
            start += _CHUNK
        return self.configs(out)

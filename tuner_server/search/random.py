"""Random search: uniform over the valid, unvisited configs of the space."""

from __future__ import annotations

import random
from collections.abc import Sequence

from schemas import Config, MeasureResult
from tuner_server.search.base import Tuner

# Below this many configs, enumerate what is left instead of drawing and redrawing.
_ENUMERATE_BELOW = 100_000


class RandomTuner(Tuner):
    name = "random"

    def next_batch(self, n: int, visited: set[int],
                   history: Sequence[tuple[Config, MeasureResult]] = ()) -> list[Config]:
        rng = random.Random(self.seed * 1_000_003 + len(visited))
        size = len(self.space)
        out: list[Config] = []
        if size < _ENUMERATE_BELOW:
            left = [i for i in range(size) if i not in visited]
            rng.shuffle(left)
            for index in left:
                config = self.space.get(index)
                if self.fits(config):
                    out.append(config)
                    if len(out) == n:
                        break
            return out
        taken = set(visited)
        for _ in range(200 * n):
            index = rng.randrange(size)
            if index in taken:
                continue
            taken.add(index)
            config = self.space.get(index)
            if self.fits(config):
                out.append(config)
                if len(out) == n:
                    break
        return out

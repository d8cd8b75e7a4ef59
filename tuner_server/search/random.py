"""Random search: uniform over the valid, unvisited configs of the space."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from schemas import Config, MeasureResult
from tuner_server.search.base import Tuner

# Below this many configs, shuffle what is left instead of drawing and redrawing.
_ENUMERATE_BELOW = 100_000


class RandomTuner(Tuner):
    name = "random"

    def _candidates(self, rng: random.Random, visited: set[int], n: int) -> Iterator[int]:
        size = len(self.space)
        if size < _ENUMERATE_BELOW:
            left = [i for i in range(size) if i not in visited]
            rng.shuffle(left)
            yield from left
            return
        taken = set(visited)
        for _ in range(200 * n):  # bounded: a space mostly over the limits yields fewer
            index = rng.randrange(size)
            if index not in taken:
                taken.add(index)
                yield index

    def next_batch(self, n: int, visited: set[int],
                   history: Sequence[tuple[Config, MeasureResult]] = ()) -> list[Config]:
        rng = random.Random(self.seed * 1_000_003 + len(visited))
        out: list[Config] = []
        for index in self._candidates(rng, visited, n):
            config = self.space.get(index)
            if self.fits(config):
                out.append(config)
                if len(out) == n:
                    break
        return out

"""Config spaces with AutoTVM's encoding: split and other knobs, mixed-radix ``index``.

A TopHub record names its config by ``index`` (mixed radix over the knobs in definition
order, first knob least significant) and by ``entity``; both decode to the same point
here only if knobs enumerate their values exactly as AutoTVM does, which this module
reproduces (split factors by depth-first search over the divisors, innermost factor
varying slowest).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, reduce
from typing import Any

import numpy as np

from schemas import Config, KnobEntity


class ConfigError(ValueError):
    """A config that is not a point of this space (AutoTVM's instantiation error)."""


def divisors(n: int) -> list[int]:
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


def _prime_exponents(n: int) -> list[int]:
    exponents, p = [], 2
    while p * p <= n:
        if n % p == 0:
            e = 0
            while n % p == 0:
                n, e = n // p, e + 1
            exponents.append(e)
        p += 1
    return exponents + ([1] if n > 1 else [])


def split_count(extent: int, num_outputs: int) -> int:
    """How many ordered ways ``extent`` splits into ``num_outputs`` factors."""
    return _prod([math.comb(e + num_outputs - 1, num_outputs - 1)
                  for e in _prime_exponents(extent)])


# A split knob with more values than this (an extent with very many divisors, such as
# 735134400 in four) would take minutes to enumerate: no real layer has one.
MAX_SPLIT_VALUES = 250_000


def _prod(values: Sequence[int]) -> int:
    return reduce(lambda a, b: a * b, values, 1)


@dataclass(frozen=True)
class SplitKnob:
    """Split an axis of ``extent`` into ``num_outputs`` exact factors (outermost first)."""

    name: str
    extent: int
    num_outputs: int
    keep: Callable[[tuple[int, ...]], bool] | None = field(default=None, compare=False)
    kind: str = "sp"

    def __post_init__(self) -> None:
        if self.extent < 1 or self.num_outputs < 1:
            raise ConfigError(f"{self.name}: cannot split extent {self.extent}")
        if (count := split_count(self.extent, self.num_outputs)) > MAX_SPLIT_VALUES:
            raise ConfigError(f"{self.name}: extent {self.extent} splits {count} ways into "
                              f"{self.num_outputs} factors, more than {MAX_SPLIT_VALUES} "
                              f"(too many divisors to tune)")
        if self.keep is None:
            self.__dict__["_count"] = count  # what ``_count`` would work out again

    # The values are enumerated when first asked for: checking a config (``decode``)
    # and counting them (``__len__``, unpruned) need no enumeration, and a lookup of
    # 10,000 workloads' best records checks one config of each.
    @cached_property
    def values(self) -> tuple[tuple[int, ...], ...]:
        factors = divisors(self.extent)
        found: list[tuple[int, ...]] = []
        stack: list[int] = [1] * (self.num_outputs - 1)

        def dfs(depth: int, inner: int) -> None:
            if depth == self.num_outputs - 1:
                found.append((self.extent // inner, *reversed(stack)))
                return
            for f in factors:
                # a prefix whose product does not divide the extent has no valid
                # completion: pruning it keeps AutoTVM's order and skips the rest
                if self.extent % (inner * f) == 0:
                    stack[depth] = f
                    dfs(depth + 1, inner * f)

        dfs(0, 1)
        if self.keep is not None:
            found = [e for e in found if self.keep(e)]
        return tuple(found)

    @cached_property
    def _where(self) -> dict[tuple[int, ...], int]:
        return {e: i for i, e in enumerate(self.values)}

    @cached_property
    def _count(self) -> int:
        return split_count(self.extent, self.num_outputs) if self.keep is None \
            else len(self.values)

    def __len__(self) -> int:
        return self._count

    def encode(self, value: tuple[int, ...]) -> Any:
        # Modern AutoTVM writes -1 for the outermost factor: it is implied by the rest.
        return [-1, *value[1:]]

    def decode(self, value: Any) -> tuple[int, ...]:
        if not isinstance(value, (list, tuple)) or len(value) != self.num_outputs:
            raise ConfigError(f"{self.name}: expected a split of {self.num_outputs} factors")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.name}: split factors must be integers, got {list(value)}")
        inner = list(value[1:])
        if any(v < 1 for v in inner) or self.extent % max(_prod(inner), 1):
            raise ConfigError(
                f"{self.name}: inner factors {inner} do not divide the extent {self.extent}"
            )
        outer = self.extent // _prod(inner)
        if value[0] not in (-1, outer):
            raise ConfigError(
                f"{self.name}: {list(value)} multiplies to "
                f"{value[0] * _prod(inner)}, not the extent {self.extent}"
            )
        full = (outer, *inner)
        # every exact split is a value unless ``keep`` prunes it
        if self.keep is not None and not self.keep(full):
            raise ConfigError(f"{self.name}: {list(full)} is pruned from this space")
        return full

    def index_of(self, value: tuple[int, ...]) -> int:
        return self._where[value]

    def nearest(self, inner: Sequence[int]) -> tuple[int, ...]:
        """The value whose inner factors are closest (in log scale) to ``inner``.

        AutoTVM's fallback configs may leave tails ([-1, 16, 2] on an extent of 24); our
        kernels need exact splits, so a fallback takes the nearest exact one instead.
        """
        def distance(value: tuple[int, ...]) -> float:
            return sum(abs(math.log2(v) - math.log2(w)) for v, w in zip(value[1:], inner))

        return min(self.values, key=distance)


@dataclass(frozen=True)
class OtherKnob:
    """A knob picked from a list of candidates (AutoTVM's define_knob, kind ``ot``)."""

    name: str
    candidates: tuple[Any, ...]
    kind: str = "ot"

    @property
    def values(self) -> tuple[Any, ...]:
        return self.candidates

    def __len__(self) -> int:
        return len(self.candidates)

    def encode(self, value: Any) -> Any:
        return value

    def decode(self, value: Any) -> Any:
        for cand in self.candidates:
            # TopHub writes both 0/1 and false/true; Python's 1 == True maps them together.
            if cand == value:
                return cand
        raise ConfigError(f"{self.name}: {value!r} is not one of {list(self.candidates)}")

    def index_of(self, value: Any) -> int:
        return self.candidates.index(value)


Knob = SplitKnob | OtherKnob


def _value_table(knob: Knob) -> np.ndarray:
    # cached on the (frozen) knob: spaces are cached per workload, so this is built once
    table = knob.__dict__.get("_table")
    if table is None:
        table = np.array(knob.values)
        object.__setattr__(knob, "_table", table)
    return table


def _json_table(knob: Knob) -> list[Any]:
    """The knob's values as a config's JSON writes them (``encode``, tuples as lists),
    by position; cached on the knob like ``_value_table``."""
    table = knob.__dict__.get("_json")
    if table is None:
        table = [list(v) if isinstance(v, tuple) else v
                 for v in (knob.encode(value) for value in knob.values)]
        object.__setattr__(knob, "_json", table)
    return table


class ConfigSpace:
    """The product of a template's knobs for one workload."""

    def __init__(self, knobs: Sequence[Knob]) -> None:
        self.knobs: tuple[Knob, ...] = tuple(knobs)
        self._by_name = {k.name: k for k in self.knobs}
        for knob in self.knobs:
            if len(knob) == 0:
                raise ConfigError(f"{knob.name}: no valid value for this workload")

    def __len__(self) -> int:
        return _prod([len(k) for k in self.knobs])

    def __iter__(self) -> Iterator[Knob]:
        return iter(self.knobs)

    def values_at(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise ConfigError(f"index {index} is outside the space of {len(self)} configs")
        out: dict[str, Any] = {}
        for knob in self.knobs:
            index, pos = divmod(index, len(knob))
            out[knob.name] = knob.values[pos]
        return out

    def index_of(self, values: dict[str, Any]) -> int:
        index, stride = 0, 1
        for knob in self.knobs:
            index += knob.index_of(values[knob.name]) * stride
            stride *= len(knob)
        return index

    @property
    def radices(self) -> np.ndarray:
        """Each knob's number of values, in definition order (first least significant)."""
        return np.array([len(k) for k in self.knobs], dtype=np.int64)

    def positions(self, indices: np.ndarray) -> np.ndarray:
        """[n, knobs] value positions of ``indices`` (vectorised ``values_at``)."""
        rest = np.asarray(indices, dtype=np.int64).copy()
        out = np.empty((rest.shape[0], len(self.knobs)), dtype=np.int64)
        for j, radix in enumerate(self.radices):
            rest, out[:, j] = np.divmod(rest, radix)
        return out

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Inverse of ``positions``."""
        strides = np.cumprod(np.concatenate(([1], self.radices[:-1])))
        return np.asarray(positions, dtype=np.int64) @ strides

    def columns(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Knob values of ``indices`` as arrays: a split knob gives [n, num_outputs]
        factors, any other knob [n] values (what ``values_at`` gives, one row per index)."""
        pos = self.positions(indices)
        out: dict[str, np.ndarray] = {}
        for j, knob in enumerate(self.knobs):
            out[knob.name] = _value_table(knob)[pos[:, j]]
        return out

    def get(self, index: int) -> Config:
        return self.to_config(self.values_at(index))

    def configs_json(self, indices: np.ndarray | Sequence[int]) -> list[dict[str, Any]]:
        """``get(i).to_json()`` for each of ``indices``, built from per-knob tables of
        encoded values without a pydantic object per config: what a plan of thousands
        of trials stores (the scheduler's bulk insert). Rows share the knobs' value
        lists: read them, do not change them."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise ConfigError(f"indices outside the space of {len(self)} configs")
        pos = self.positions(indices).tolist()
        tables = [(k.name, k.kind, _json_table(k)) for k in self.knobs]
        return [{"index": index, "code_hash": None,
                 "entity": [[name, kind, table[p]] for (name, kind, table), p in zip(tables, row)]}
                for index, row in zip(indices.tolist(), pos)]

    def to_config(self, values: dict[str, Any]) -> Config:
        entity = [
            KnobEntity(name=k.name, kind=k.kind, value=k.encode(values[k.name]))
            for k in self.knobs
        ]
        return Config(index=self.index_of(values), entity=tuple(entity))

    def decode(self, config: Config) -> dict[str, Any]:
        """Knob values of a config, read from its entity (AutoTVM applies the entity)."""
        given = {item.name: item for item in config.entity}
        missing = [k.name for k in self.knobs if k.name not in given]
        extra = [n for n in given if n not in self._by_name]
        if missing or extra:
            raise ConfigError(
                "config knobs do not match the space: "
                + ", ".join([f"missing {m}" for m in missing] + [f"unknown {e}" for e in extra])
            )
        out = {}
        for knob in self.knobs:
            item = given[knob.name]
            if item.kind != knob.kind:
                raise ConfigError(f"{knob.name}: kind {item.kind!r}, expected {knob.kind!r}")
            out[knob.name] = knob.decode(item.value)
        return out

    def normalize(self, config: Config) -> Config:
        """The same point, re-encoded: entity in definition order and its true index."""
        return self.to_config(self.decode(config))

    def sample(self, rng: random.Random) -> Config:
        return self.get(rng.randrange(len(self)))

    def describe(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for k in self.knobs:
            row: dict[str, Any] = {"name": k.name, "kind": k.kind, "size": len(k)}
            if isinstance(k, SplitKnob):
                row.update(extent=k.extent, num_outputs=k.num_outputs)
            else:
                row.update(candidates=list(k.candidates))
            rows.append(row)
        return rows

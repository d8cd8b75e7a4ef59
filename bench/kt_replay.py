"""Replay a measured table with kernel_tuner's own strategies (its simulation mode), so
the tuning benchmark can put kernel_tuner's simulated annealing and genetic algorithm
next to our tuners on exactly the same configs and costs.

The table is written as a kernel_tuner 1.5 cache file and the search space is restricted
to the table's configs, so kernel_tuner never proposes a config we did not measure.

    .venv/bin/python bench/kt_replay.py      # self-check on a synthetic table
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

# kernel_tuner's simulation mode needs a kernel and device name that match the cache.
_KERNEL = "kt_replay"
_DEVICE = "replayed table"
# How kernel_tuner 1.5 marks a config that was tried but gave no time; our table does not
# say why (compile error, wrong answer, launch failure), so all failures get this one.
_FAILED = "RuntimeFailedConfig"
# Filter itertools.product instead of running the constraint solver: the space's list
# order (which kernel_tuner's random samples index into) is then plainly fixed, and the
# 16k-config filter costs ~20-35 ms against the solver's ~10-20 ms.
_SPACE_OPTIONS = {"framework": "bruteforce"}


def _param_names(knob_sizes: dict[str, int]) -> list[str]:
    """Neutral names, so a knob called e.g. ``time`` or ``block_size_x`` cannot hit
    kernel_tuner's forbidden names, result keys or default thread-count restriction."""
    return [f"k{j}" for j in range(len(knob_sizes))]


def _strides(knob_sizes: dict[str, int]) -> list[int]:
    return [math.prod(list(knob_sizes.values())[:j]) for j in range(len(knob_sizes))]


def _positions(index: int, knob_sizes: dict[str, int]) -> tuple[int, ...]:
    pos = []
    for size in knob_sizes.values():
        index, p = divmod(index, size)
        pos.append(p)
    return tuple(pos)


def _cache_json(knob_sizes: dict[str, int], table: dict[int, float | None]) -> str:
    """The table as kernel_tuner writes a cache: params + time (ms) per config, and for a
    failed config no time but ``__error__`` naming the ErrorConfig subclass."""
    names = _param_names(knob_sizes)
    entries: dict[str, dict[str, Any]] = {}
    for index in sorted(table):
        pos = _positions(index, knob_sizes)
        entry: dict[str, Any] = dict(zip(names, pos))
        cost = table[index]
        if cost is None:
            entry["__error__"] = _FAILED
        else:
            entry["time"] = float(cost) * 1e3
            entry["times"] = [float(cost) * 1e3]
        # zero timings: simulated time stays 0 and kernel_tuner's timing totals add up
        entry.update(compile_time=0.0, verification_time=0.0, benchmark_time=0.0,
                     strategy_time=0.0, framework_time=0.0)
        entries[",".join(map(str, pos))] = entry
    # "cache" last: kernel_tuner checks the file ends in "}}}" to see it was closed
    doc = {
        "device_name": _DEVICE,
        "kernel_name": _KERNEL,
        "problem_size": [1],
        "tune_params_keys": names,
        "tune_params": {n: list(range(s)) for n, s in zip(names, knob_sizes.values())},
        "objective": "time",
        "cache": entries,
    }
    return json.dumps(doc)


def _write_cache(workdir: Path, text: str) -> Path:
    """Content-named and written atomically, so repeated or concurrent replays of one
    table share a file and never read a half-written one."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"kt_cache_{hashlib.sha1(text.encode()).hexdigest()[:16]}.json"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=workdir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def _restriction(knob_sizes: dict[str, int], table: dict[int, float | None]) -> Any:
    """One constraint over all knobs: the config is a row of the table (failed rows too,
    since a failure is something the tuner pays a trial to find out)."""
    from constraint import FunctionConstraint

    rows = frozenset(_positions(i, knob_sizes) for i in table)

    def in_table(*pos: int) -> bool:
        return pos in rows

    return FunctionConstraint(in_table)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """kernel_tuner 1.5's SA, GA and random sampling draw from the global ``random`` and
    ``numpy.random`` streams (its ``seed=`` only reaches the pymoo strategies), so seed
    both, and put the caller's streams back afterwards."""
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Its warnings (e.g. a probe outside the table) and prints; exceptions still pass."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _tune(knob_sizes: dict[str, int], table: dict[int, float | None], strategy: str,
          budget: int, seed: int, workdir: Path) -> list[dict[str, Any]]:
    if not table:
        raise ValueError("empty table")
    size = math.prod(knob_sizes.values())
    if any(not 0 <= i < size for i in table):
        raise ValueError(f"table index outside the {size}-config space")
    cache = _write_cache(Path(workdir), _cache_json(knob_sizes, table))
    names = _param_names(knob_sizes)
    with _quiet():
        import kernel_tuner

        with _seeded(seed):
            results, _env = kernel_tuner.tune_kernel(
                _KERNEL, "", (1,), [],
                {n: list(range(s)) for n, s in zip(names, knob_sizes.values())},
                restrictions=[_restriction(knob_sizes, table)],
                strategy=strategy,
                strategy_options={"max_fevals": budget,
                                  "searchspace_construction_options": _SPACE_OPTIONS},
                cache=str(cache), simulation_mode=True, objective="time",
                verbose=False, quiet=True, seed=seed)
    return results


def replay(knob_sizes: dict[str, int], table: dict[int, float | None], strategy: str,
           budget: int, seed: int, workdir: Path) -> list[float | None]:
    """Run kernel_tuner's ``strategy`` in simulation mode on ``table`` and return the cost
    (seconds) of each configuration it evaluated, in evaluation order (None for a failed
    config), at most ``budget`` of them.

    A trial is a distinct config: kernel_tuner's results repeat configs it revisits (free
    in its budget too, which counts unique configs), so only each config's first
    evaluation is returned. Probes outside the table (kernel_tuner treats them as invalid
    without spending budget) are dropped. Fewer than ``budget`` come back when the
    strategy ends on its own: kernel_tuner 1.5's SA finishes its cooling schedule after
    ~75% of ``max_fevals`` (T starts at 0.1 but the schedule length assumes 1.0), and its
    GA stops breeding once its evaluations, revisits included, near the table size.

    The same ``seed`` gives the same sequence (across processes too); the caller's
    ``random``/``numpy.random`` state is left as it was. The cache file goes to
    ``workdir`` (named by content, reused across calls).
    """
    strides = _strides(knob_sizes)
    names = _param_names(knob_sizes)
    seen: set[int] = set()
    costs: list[float | None] = []
    for r in _tune(knob_sizes, table, strategy, budget, seed, workdir):
        index = sum(r[n] * s for n, s in zip(names, strides))
        if index in table and index not in seen:
            seen.add(index)
            costs.append(table[index])
    return costs[:budget]


# ---------------------------------------------------------------- self-check


def _synthetic(knob_sizes: dict[str, int], n: int, fail: float,
               seed: int) -> dict[int, float | None]:
    """Costs from a smooth bowl over the positions (each knob its own optimum and weight)
    times 5% log-normal noise; ``fail`` of the rows fail."""
    rng = random.Random(seed)
    centres = [rng.random() for _ in knob_sizes]
    weights = [rng.uniform(0.5, 3.0) for _ in knob_sizes]
    total = math.prod(knob_sizes.values())
    table: dict[int, float | None] = {}
    for index in rng.sample(range(total), n):
        if rng.random() < fail:
            table[index] = None
            continue
        pos = _positions(index, knob_sizes)
        x = [p / (s - 1) for p, s in zip(pos, knob_sizes.values())]
        bowl = 1 + sum(w * (xj - c) ** 2 for w, xj, c in zip(weights, x, centres))
        table[index] = 1e-3 * bowl * math.exp(rng.gauss(0, 0.05))
    return table


def _trials_to(costs: list[float | None], target: float) -> int | None:
    """1-based trial at which the best-so-far cost first reaches ``target``."""
    for t, c in enumerate(costs, 1):
        if c is not None and c <= target:
            return t
    return None


def _time(f: Callable[[], Any]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def _self_check() -> None:
    knob_sizes = {"a": 7, "b": 7, "c": 8, "d": 2, "e": 5, "f": 4}
    table = _synthetic(knob_sizes, 1100, 0.03, seed=1)
    ok = [c for c in table.values() if c is not None]
    best = min(ok)
    budget, seeds = 300, range(5)
    strategies = ("simulated_annealing", "genetic_algorithm", "random_sample")
    print(f"space {math.prod(knob_sizes.values())} configs, table {len(table)} "
          f"({len(table) - len(ok)} failed), best {best * 1e3:.4f} ms, budget {budget}")

    from kernel_tuner.searchspace import Searchspace

    tp = {n: list(range(s)) for n, s in zip(_param_names(knob_sizes), knob_sizes.values())}
    for fw in ("bruteforce", "PythonConstraint"):
        space: list[Searchspace] = []
        dt = _time(lambda: space.append(
            Searchspace(tp, [_restriction(knob_sizes, table)], 1 << 30, framework=fw)))
        assert space[0].size == len(table)
        print(f"search space build ({fw}): {dt * 1e3:.0f} ms")

    with tempfile.TemporaryDirectory() as d:
        workdir = Path(d)
        dt = _time(lambda: _write_cache(workdir, _cache_json(knob_sizes, table)))
        print(f"cache JSON + write: {dt * 1e3:.0f} ms")
        # kernel_tuner itself must read each failed row back as an ErrorConfig
        from kernel_tuner.util import ErrorConfig, read_cache

        cached = read_cache(str(next(workdir.glob("kt_cache_*.json"))), open_cache=False)
        n_err = sum(isinstance(e.get("__error__"), ErrorConfig) for e in cached["cache"].values())
        assert n_err == len(table) - len(ok), n_err

        target95, target90 = best / 0.95, best / 0.90
        print(f"\ntrials to 90% / 95% / 100% of best throughput (min cost), '-' = not in {budget}")
        found_best: dict[str, list[int | None]] = {}
        for strategy in strategies:
            found_best[strategy] = []
            for seed in seeds:
                runs: list[list[float | None]] = []
                dt = _time(lambda: runs.append(
                    replay(knob_sizes, table, strategy, budget, seed, workdir)))
                costs = runs[0]
                raw = _tune(knob_sizes, table, strategy, budget, seed, workdir)
                assert len(costs) <= budget, len(costs)
                assert all(c is None or c in ok for c in costs)
                if seed == 0:  # same seed, same trials; another seed, other trials
                    assert replay(knob_sizes, table, strategy, budget, 0, workdir) == costs
                    assert replay(knob_sizes, table, strategy, budget, 1, workdir) != costs
                t90, t95, t100 = (_trials_to(costs, x) for x in (target90, target95, best))
                found_best[strategy].append(t100)
                print(f"  {strategy:20s} seed {seed}: {_fmt(t90):>4s} / {_fmt(t95):>4s} / "
                      f"{_fmt(t100):>4s}   ({len(costs)} distinct, {len(raw)} kt results, "
                      f"{sum(c is None for c in costs)} failed, {dt:.2f} s)")

    print(f"\nmean trials to the table's best (not found counted as {budget}):")
    for strategy, ts in found_best.items():
        hits = [t for t in ts if t is not None]
        mean = statistics.mean(t if t is not None else budget for t in ts)
        print(f"  {strategy:20s} {mean:6.1f}   found in {len(hits)}/{len(ts)} seeds")
    sa = statistics.mean(t or budget for t in found_best["simulated_annealing"])
    rs = statistics.mean(t or budget for t in found_best["random_sample"])
    print("SA faster than random to the best:", "yes" if sa < rs else "no")


def _fmt(t: int | None) -> str:
    return "-" if t is None else str(t)


if __name__ == "__main__":
    _self_check()

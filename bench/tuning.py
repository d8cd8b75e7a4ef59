"""How many measurements a good schedule costs, per tuner: the tuning-efficiency benchmark.

1. The table (``bench/tuning_cache.py``): >= 1,000 distinct valid configs of each of
   ResNet-50's 3x3 conv layers, measured once on this machine's OpenCL device into
   ``bench/data/tuning_cache.log`` (a rerun measures only what is missing).
2. Replay (kernel_tuner's simulation mode): each tuner searches only the table's configs
   and a trial's cost is read from the table. Over ``--seeds`` seeds it prints the median
   number of trials to reach 90% and 95% of the table's best throughput, for random,
   grid, ga, lgbm, lgbm with transfer (a global model fitted on the other workloads'
   records only) and, where kernel_tuner imports, its simulated_annealing and
   genetic_algorithm strategies on the same table.
3. The cost model's own speed: fit on 10,000 records, rank 100,000 candidates.

    .venv/bin/python bench/tuning.py [--seeds 10] [--plan-size 8] [--budget 600]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from common import cpu_model, git_revision
from tuning_cache import CACHE, OPTIONS, fill, load, workloads

from compiler.templates import get_template
from schemas import Record, Workload
from tuner_server.search import Measured, Visited, make_tuner
from tuner_server.search.base import perf_of
from tuner_server.search.cost_model import CostModel
from tuner_server.search.transfer import GlobalModel, fit_global

LEVELS = (0.90, 0.95)
TARGETS = {"lgbm": 1 / 3, "lgbm+transfer": 1 / 10}  # the issue's: trials vs random at 95%


@dataclass
class Table:
    """One workload's measured configs: what a replayed trial returns."""

    workload: Workload
    records: dict[int, Record]

    @cached_property
    def best(self) -> float:
        return max(perf(r) for r in self.records.values())

    @property
    def indices(self) -> np.ndarray:
        return np.array(sorted(self.records), dtype=np.int64)


def perf(record: Record) -> float:
    return perf_of(record.result)


def tables(records: list[Record]) -> list[Table]:
    out = []
    for workload in workloads():
        rows = {r.config.index: r for r in records if r.workload == workload}
        if rows:
            out.append(Table(workload, rows))
    return out


def replay_ours(table: Table, tuner_name: str, seed: int, budget: int, plan_size: int,
                prior: GlobalModel | None = None, **kwargs: object) -> list[float]:
    """Throughput of each trial, in order, until 95% of the best or the budget."""
    template = get_template(table.workload.template)
    if prior is not None:
        kwargs["prior"] = prior
    tuner = make_tuner(tuner_name, template=template, workload=table.workload, seed=seed,
                       pool=table.indices, **kwargs)
    visited = Visited()
    measured = Measured()
    out: list[float] = []
    goal = max(LEVELS) * table.best
    while len(out) < budget and (not out or max(out) < goal):
        batch = tuner.propose(min(plan_size, budget - len(out)), visited, measured)
        if not len(batch):
            break
        indices = batch.tolist()
        if (len(set(indices)) < len(indices) or visited.contains(batch).any()
                or any(i not in table.records for i in indices)):
            raise AssertionError(f"{tuner_name} proposed a config twice or outside the table")
        visited.add(batch)
        got = [perf(table.records[i]) for i in indices]
        measured.add(batch, got)
        out += got
    return out


def replay_kernel_tuner(table: Table, strategy: str, seed: int, budget: int,
                        workdir: Path) -> list[float]:
    from kt_replay import replay

    space = get_template(table.workload.template).space(table.workload)
    costs = {i: (r.result.mean_cost if r.result.ok else None)
             for i, r in table.records.items()}
    got = replay({k.name: len(k) for k in space}, costs, strategy, budget, seed, workdir)
    return [1.0 / c if c else 0.0 for c in got]


def trials_to(curve: list[float], best: float, level: float) -> int | None:
    running = 0.0
    for t, p in enumerate(curve, 1):
        running = max(running, p)
        if running >= level * best:
            return t
    return None


def median_trials(counts: list[int | None], budget: int) -> tuple[float, int]:
    """Median with runs that never got there counted as ``budget + 1`` (censored), and
    how many such runs there were."""
    missed = sum(c is None for c in counts)
    return statistics.median([budget + 1 if c is None else c for c in counts]), missed


def transfer_prior(all_tables: list[Table], exclude: Workload) -> GlobalModel | None:
    examples = [(t.workload, r.config, perf(r), "table")
                for t in all_tables if t.workload != exclude for r in t.records.values()]
    return fit_global(get_template(exclude.template), examples)


def time_cost_model(all_tables: list[Table], n_fit: int, n_rank: int) -> dict[str, float]:
    """Seconds to fit on ``n_fit`` records (the tables' records, resampled to that many,
    grouped by workload) and to rank ``n_rank`` candidates (features + prediction)."""
    rng = np.random.default_rng(0)
    template = get_template(all_tables[0].workload.template)
    feats, perfs, groups = [], [], []
    for g, table in enumerate(all_tables):
        picks = rng.choice(table.indices, size=n_fit // len(all_tables))
        feats.append(template.feature_matrix(table.workload, picks))
        perfs.append(np.array([perf(table.records[int(i)]) for i in picks]))
        groups.append(np.full(len(picks), g))
    x, y, grp = np.concatenate(feats), np.concatenate(perfs), np.concatenate(groups)
    t0 = time.perf_counter()
    model = CostModel().fit(x, y, grp)
    fit_s = time.perf_counter() - t0
    workload = all_tables[0].workload
    candidates = rng.integers(0, len(template.space(workload)), size=n_rank)
    t0 = time.perf_counter()
    cand_feats = template.feature_matrix(workload, candidates)
    t1 = time.perf_counter()
    scores = model.predict(cand_feats)
    np.argsort(-scores)
    t2 = time.perf_counter()
    return {"rows": float(len(y)), "features": float(x.shape[1]), "fit_s": fit_s,
            "rank_features_s": t1 - t0, "rank_predict_s": t2 - t1, "rank_s": t2 - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--plan-size", type=int, default=8,
                   help="configs per plan (each tuner refits/replans after each) (8)")
    p.add_argument("--budget", type=int, default=600, help="trials per replay, at most")
    p.add_argument("--per-workload", type=int, default=1000,
                   help="valid configs each table must hold; missing ones are measured")
    p.add_argument("--no-measure", action="store_true",
                   help="replay the table as it is, even when it is short")
    p.add_argument("--tuners", default="random,grid,ga,lgbm,lgbm+transfer,kt:simulated_annealing,"
                   "kt:genetic_algorithm")
    p.add_argument("--skip-timing", action="store_true")
    args = p.parse_args(argv)

    if not args.no_measure:
        from compiler.runtime import open_device

        device = open_device()
        for workload in workloads():
            fill(workload, device, args.per_workload)
    all_tables = tables(load())
    if not all_tables:
        p.error(f"{CACHE} holds no records; run without --no-measure")
    names = [n for n in args.tuners.split(",") if n]
    kt_version = "not run"
    if any(n.startswith("kt:") for n in names):
        try:
            import kernel_tuner
            kt_version = kernel_tuner.__version__
        except ImportError:
            kt_version = "not installed (pip install '.[bench]')"
            names = [n for n in names if not n.startswith("kt:")]

    print(f"# bench/tuning.py  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"# command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# host: {platform.machine()} {cpu_model()}, {os.cpu_count()} CPUs | "
          f"python {platform.python_version()} | {git_revision()}")
    print(f"# table: {CACHE.relative_to(CACHE.parents[2])}: {sum(len(t.records) for t in all_tables)}"
          f" records; each cost: number>={OPTIONS.number}, repeat={OPTIONS.repeat}, "
          f"min_repeat_ms={OPTIONS.min_repeat_ms:g}")
    print(f"# replay: {args.seeds} seeds, plan size {args.plan_size}, budget {args.budget} "
          f"trials; kernel_tuner {kt_version}")
    print("# a run that never reached a level within the budget counts as budget+1 "
          "(n missed shown as '+n')")
    print()
    summary: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for table in all_tables:
            valid = sum(r.result.ok for r in table.records.values())
            near = {lv: sum(perf(r) >= lv * table.best for r in table.records.values())
                    for lv in LEVELS}
            print(f"## {table.workload.key}")
            print(f"   {len(table.records)} configs ({valid} valid); best "
                  f"{1e3 / table.best:.3f} ms; configs within 90%: {near[0.90]}, "
                  f"within 95%: {near[0.95]}")
            prior = transfer_prior(all_tables, table.workload) if "lgbm+transfer" in names else None
            print(f"   {'tuner':28s} {'to 90%':>10s} {'to 95%':>10s} {'s/replay':>9s}")
            for name in names:
                counts: dict[float, list[int | None]] = {lv: [] for lv in LEVELS}
                started = time.time()
                for seed in range(args.seeds):
                    if name.startswith("kt:"):
                        curve = replay_kernel_tuner(table, name[3:], seed, args.budget,
                                                    Path(tmp))
                    elif name == "lgbm+transfer":
                        curve = replay_ours(table, "lgbm", seed, args.budget, args.plan_size,
                                            prior)
                    else:
                        curve = replay_ours(table, name, seed, args.budget, args.plan_size)
                    for lv in LEVELS:
                        counts[lv].append(trials_to(curve, table.best, lv))
                cells = []
                for lv in LEVELS:
                    med, missed = median_trials(counts[lv], args.budget)
                    summary.setdefault(name, {}).setdefault(f"{lv:.2f}", []).append(med)
                    cells.append(f"{med:g}" + (f" +{missed}" if missed else ""))
                print(f"   {name:28s} {cells[0]:>10s} {cells[1]:>10s} "
                      f"{(time.time() - started) / args.seeds:9.2f}", flush=True)
            print()
    print("## trials to 95% against random's (median per workload; target lgbm <= 1/3, "
          "with transfer <= 1/10)")
    base = summary.get("random", {}).get("0.95")
    for name, per_level in summary.items():
        if base and name != "random":
            ratios = [m / b for m, b in zip(per_level["0.95"], base)]
            verdict = ""
            if name in TARGETS:
                verdict = "  met" if max(ratios) <= TARGETS[name] else "  MISSED"
            print(f"   {name:28s} " + "  ".join(f"{r:.3f}" for r in ratios) + verdict)
    if not args.skip_timing:
        t = time_cost_model(all_tables, 10_000, 100_000)
        print()
        print(f"## cost model: fit on {t['rows']:.0f} records x {t['features']:.0f} features: "
              f"{t['fit_s']:.3f} s (target <= 1 s); rank 100,000 candidates: "
              f"{t['rank_s']:.3f} s (features {t['rank_features_s']:.3f} + predict "
              f"{t['rank_predict_s']:.3f}; target <= 0.3 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

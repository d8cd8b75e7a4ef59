"""The cost model: a LightGBM LambdaRank model over config features, grouped by task.

It learns which configs of a workload are faster than others, not how fast they are:
ranking transfers across workloads and devices whose absolute speeds differ, and a
plan only needs the order. Labels are throughput relative to the best of the group,
in 0..30 (LightGBM's default label gains)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# LightGBM's OpenMP threads spin while they wait; on a busy host (a worker measuring
# beside the server, parallel test runs) a 64-row fit then took 13 s instead of 0.04 s.
# libgomp reads this once, when lightgbm loads, so it is set before that import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# LightGBM's lambdarank refuses queries over 10,000 rows, and its cost grows with the
# pairs inside a query: large tasks are cut into random sub-groups of this size (ranking
# within each is still the task's ranking). 1024 took 2.8 s to fit 10,000 records
# here, 256 0.85 s.
MAX_GROUP = 256
LABELS = 30
SMALL = 4096


@dataclass
class FitParams:
    rounds: int = 50
    leaves: int = 31
    learning_rate: float = 0.2
    min_data_in_leaf: int = 4
    max_bin: int = 63
    threads: int = 0  # 0: one thread for small fits, every core from SMALL rows up

    def n_threads(self, rows: int) -> int:
        """Waking OpenMP threads costs ~5 ms a boosting round here (passive waits):
        small fits, the common case of a task's own model, run faster on one."""
        if self.threads:
            return self.threads
        return 1 if rows < SMALL else os.cpu_count() or 1

    def lightgbm(self, rows: int) -> dict[str, object]:
        return {
            "objective": "lambdarank", "metric": "None", "verbosity": -1,
            "num_leaves": self.leaves, "learning_rate": self.learning_rate,
            "min_data_in_leaf": self.min_data_in_leaf, "max_bin": self.max_bin,
            "num_threads": self.n_threads(rows),
            "lambdarank_truncation_level": 32, "deterministic": True,
            "force_col_wise": True, "feature_pre_filter": False,
        }


def relevance(perf: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Integer labels: throughput over the best of its group, scaled to 0..LABELS
    (failed configs, throughput 0, are 0)."""
    labels = np.zeros(len(perf), dtype=np.int32)
    for g in np.unique(groups):
        rows = groups == g
        best = perf[rows].max()
        if best > 0:
            labels[rows] = np.rint(LABELS * perf[rows] / best).astype(np.int32)
    return labels


class CostModel:
    """Fit on (features, throughput, group) and score candidates: higher is faster."""

    def __init__(self, params: FitParams | None = None, seed: int = 0) -> None:
        self.params = params or FitParams()
        self.seed = seed
        self._booster = None

    def fit(self, features: np.ndarray, perf: np.ndarray,
            groups: Sequence[int] | np.ndarray | None = None) -> CostModel:
        import lightgbm as lgb  # heavy import, only where a model is fitted

        groups = np.zeros(len(perf), dtype=np.int64) if groups is None else np.asarray(groups)
        labels = relevance(np.asarray(perf, dtype=np.float64), groups)
        order, sizes = self._query_order(groups)
        data = lgb.Dataset(features[order], label=labels[order], group=sizes,
                           params={"max_bin": self.params.max_bin, "verbosity": -1},
                           free_raw_data=True)
        params = self.params.lightgbm(len(labels)) | {"seed": self.seed}
        self._booster = lgb.train(params, data, num_boost_round=self.params.rounds)
        return self

    def _query_order(self, groups: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Rows sorted into contiguous queries of at most MAX_GROUP rows."""
        rng = np.random.default_rng(self.seed)
        order: list[np.ndarray] = []
        sizes: list[int] = []
        for g in np.unique(groups):
            rows = rng.permutation(np.flatnonzero(groups == g))
            for start in range(0, len(rows), MAX_GROUP):
                part = rows[start:start + MAX_GROUP]
                order.append(part)
                sizes.append(len(part))
        return np.concatenate(order), sizes

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None:
            raise RuntimeError("the cost model is not fitted")
        threads = self.params.n_threads(len(features))
        return np.asarray(self._booster.predict(features, num_threads=threads),
                          dtype=np.float64)

"""Transfer learning: one global cost model per (template, target kind), fitted on
every record the database holds for them (other workloads, other device models,
TopHub imports), warm-starts the search of a new task."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np

from compiler.templates import ConfigError, Template
from schemas import Config, Workload
from tuner_server.search.cost_model import CostModel, FitParams

log = logging.getLogger("tuner.search")
# (workload, config, throughput; 0 for a failed config, the group: device model)
Example = tuple[Workload, Config, float, str]


@dataclass
class GlobalModel:
    """A cost model over many workloads of one template; scores configs of any of them
    (through the template's features, which include the workload's)."""

    model: CostModel
    n_workloads: int


def fit_global(template: Template, examples: Iterable[Example],
               params: FitParams | None = None, seed: int = 0) -> GlobalModel | None:
    """Fitted on ``examples`` grouped by (workload, device); None when no group has a
    working config to learn from. Configs outside this version's space are skipped."""
    by_group: dict[tuple[Workload, str], tuple[list[int], list[float]]] = {}
    for workload, config, perf, device in examples:
        try:
            index = template.space(workload).index_of(template.decode(workload, config))
        except (ConfigError, ValueError):
            continue
        rows = by_group.setdefault((workload, device), ([], []))
        rows[0].append(index)
        rows[1].append(perf)
    feats, perfs, groups = [], [], []
    for g, ((workload, _device), (indices, perf)) in enumerate(by_group.items()):
        if max(perf) <= 0:
            continue
        feats.append(template.feature_matrix(workload, np.array(indices, dtype=np.int64)))
        perfs.append(np.array(perf))
        groups.append(np.full(len(perf), g))
    if not feats:
        return None
    model = CostModel(params, seed).fit(np.concatenate(feats), np.concatenate(perfs),
                                        np.concatenate(groups))
    return GlobalModel(model, len({w for w, _ in by_group}))


class GlobalModels:
    """The server's cache of global models: refitted when the records they were fitted
    on grew by ``refit_growth`` (or on first use); shared by every task's tuner.

    With ``background``, a due fit runs on a thread of its own and ``get`` answers the
    last fitted model meanwhile (None before the first): a fit takes about a second at
    10,000 records, and a scheduler pass must not wait for it. A tuner holds the
    :meth:`latest` provider, so it picks up a model that lands after it was made.
    ``quiet`` (see ``Scheduler``) is held through a background fit: it runs on every core."""

    def __init__(self, refit_growth: float = 0.2, min_new: int = 64,
                 quiet: AbstractContextManager[object] | None = None) -> None:
        self._models: dict[tuple[str, str], tuple[int, GlobalModel | None]] = {}
        self._fitting: dict[tuple[str, str], threading.Thread] = {}
        self._lock = threading.Lock()
        self._quiet = quiet or nullcontext()
        self.refit_growth, self.min_new = refit_growth, min_new

    def get(self, template: Template, target_kind: str, count: Callable[[], int],
            load: Callable[[], Iterable[Example]],
            background: bool = False) -> GlobalModel | None:
        key = (template.name, target_kind)
        n = count()
        with self._lock:
            cached = self._models.get(key)
            if cached is not None:
                fitted_at, model = cached
                if n - fitted_at < max(self.min_new, self.refit_growth * fitted_at):
                    return model
            previous = cached[1] if cached is not None else None
            if not n:
                self._models[key] = (0, previous)
                return previous
            if not background:
                model = self._fitted(key, template, load, previous)
                self._models[key] = (n, model)
                return model
            if key not in self._fitting:
                thread = threading.Thread(target=self._fit_apart,
                                          args=(key, template, n, load, previous),
                                          name=f"global-model-{template.name}", daemon=True)
                self._fitting[key] = thread
                thread.start()
            return previous

    @staticmethod
    def _fitted(key: tuple[str, str], template: Template, load: Callable[[], Iterable[Example]],
                previous: GlobalModel | None) -> GlobalModel | None:
        try:
            return fit_global(template, load())
        except Exception:  # transfer only speeds a search up: never fail a job on it
            log.exception("global model of %s on %s: fit failed; keeping the last one", *key)
            return previous

    def _fit_apart(self, key: tuple[str, str], template: Template, n: int,
                   load: Callable[[], Iterable[Example]], previous: GlobalModel | None) -> None:
        with self._quiet:
            model = self._fitted(key, template, load, previous)
        with self._lock:
            self._models[key] = (n, model)
            self._fitting.pop(key, None)

    def latest(self, template: Template, target_kind: str) -> Callable[[], GlobalModel | None]:
        """A provider of the newest model of (template, kind): what a tuner holds."""
        key = (template.name, target_kind)

        def current() -> GlobalModel | None:
            cached = self._models.get(key)
            return cached[1] if cached is not None else None
        return current

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the fits running now (a scheduler that stops, a test); whether all
        ended within ``timeout``."""
        with self._lock:
            threads = list(self._fitting.values())
        for thread in threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in threads)

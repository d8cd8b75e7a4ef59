"""The counters behind ``GET /metrics`` (Prometheus text format), kept by
``prometheus_client`` so that several server processes answer with their sum.

One process (no ``PROMETHEUS_MULTIPROC_DIR``): each :class:`Metrics` keeps its own
registry in memory, so two apps in one process (tests) do not share counts.
Several processes (``tuner serve --workers N`` sets ``PROMETHEUS_MULTIPROC_DIR`` before
they start): every process writes its counts to files in that directory, and whichever
process answers a scrape reads them all (prometheus_client's multiprocess mode). The
directory must be set before the process starts and be empty at the fleet's start.

The gauges read from the database and the queue (queue depth, workers alive, records)
are the same whichever process answers; they are computed per scrape, never summed."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# what render() writes: Prometheus's text format 0.0.4
METRICS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Recorded trials are counted in one-second slots per process, a ring of this many: the
# window's seconds (the current one included) and spares, so that a slot is reused only
# once its second has left the window.
_SLOTS = 12
# The slot gauges are bookkeeping for tuner_trials_per_second, not for scrapers.
_SLOT_COUNT = "tuner_recorded_slot_count"
_SLOT_SECOND = "tuner_recorded_slot_second"
_HIDDEN = {_SLOT_COUNT, _SLOT_SECOND}


def multiprocess_dir() -> str | None:
    """The directory shared by this fleet's server processes, or None (one process)."""
    return os.environ.get(MULTIPROC_ENV) or None


class _Collected(Collector):
    """Metrics collected already, for one scrape's registry."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


class Metrics:
    """Counters of one server process; :meth:`render` answers for all of the fleet's."""

    def __init__(self, window_s: int = 10) -> None:
        if window_s > _SLOTS - 2:
            raise ValueError(f"window_s must be at most {_SLOTS - 2} s (got {window_s})")
        self._dir = multiprocess_dir()
        # multiprocess mode: values live in the shared files, whatever registry holds the
        # objects; one process: this registry is the only place they are
        self._own = None if self._dir else CollectorRegistry(auto_describe=True)
        self._window = window_s
        self._lock = threading.Lock()  # a slot's reset and increment go together
        self._slot_held: dict[str, int] = {}  # slot -> the second it counts (this process)
        self._leased = Counter("tuner_trials_leased", "trials handed to workers",
                               registry=self._own)
        self._recorded = Counter("tuner_trials_recorded", "trial results stored",
                                 registry=self._own)
        self._expired = Counter("tuner_lease_expiries",
                                "leases that expired and were requeued", registry=self._own)
        # per process (multiprocess_mode "all" keeps one value per pid): how many trials
        # it recorded in each one-second slot, and which second each slot holds now
        self._slot_count = Gauge(_SLOT_COUNT, "trials recorded in a one-second slot",
                                 ["slot"], registry=self._own, multiprocess_mode="all")
        self._slot_second = Gauge(_SLOT_SECOND, "the second a slot counts",
                                  ["slot"], registry=self._own, multiprocess_mode="all")

    def leased(self, n: int) -> None:
        if n:
            self._leased.inc(n)

    def recorded(self, n: int) -> None:
        if not n:
            return
        self._recorded.inc(n)
        second = int(time.time())
        slot = str(second % _SLOTS)
        with self._lock:
            if self._slot_held.get(slot) != second:
                self._slot_held[slot] = second
                self._slot_count.labels(slot).set(0)
                self._slot_second.labels(slot).set(second)
            self._slot_count.labels(slot).inc(n)

    def expired(self, n: int) -> None:
        if n:
            self._expired.inc(n)

    def _collect(self) -> list[Metric]:
        """The counters and slots of every process (multiprocess mode) or this one."""
        if self._own is not None:
            return list(self._own.collect())
        return list(MultiProcessCollector(None, path=self._dir).collect())

    def trials_per_second(self, collected: list[Metric] | None = None) -> float:
        """Trials recorded per second over the last ``window_s`` whole seconds (the
        current one included), by every process of the fleet."""
        now = int(time.time())
        counts: dict[tuple[str, str], float] = {}
        seconds: dict[tuple[str, str], float] = {}
        for metric in self._collect() if collected is None else collected:
            into = {_SLOT_COUNT: counts, _SLOT_SECOND: seconds}.get(metric.name)
            if into is None:
                continue
            for sample in metric.samples:
                into[(sample.labels.get("pid", ""), sample.labels["slot"])] = sample.value
        total = sum(n for key, n in counts.items()
                    if now - self._window < seconds.get(key, -1) <= now)
        return total / self._window

    def render(self, queue_depth: int, workers_alive: int, records: int) -> str:
        """The Prometheus text: the fleet's counters and this scrape's gauges."""
        collected = self._collect()
        scraped = [
            ("tuner_queue_depth", "trials waiting for a worker", queue_depth),
            ("tuner_trials_per_second",
             f"trials recorded per second, last {self._window} s",
             round(self.trials_per_second(collected), 3)),
            ("tuner_workers_alive", "workers alive: not deregistered, seen within the lease",
             workers_alive),
            ("tuner_records", "records in the database", records),
        ]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collected(
            [m for m in collected if m.name not in _HIDDEN]
            + [GaugeMetricFamily(name, help_text, value=value)
               for name, help_text, value in scraped]))
        return generate_latest(registry).decode()

"""Process-local counters behind ``GET /metrics`` (Prometheus text format)."""

from __future__ import annotations

import threading
import time
from collections import deque


class Metrics:
    def __init__(self, window_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._window = window_s
        self._recent: deque[tuple[float, int]] = deque()
        self.trials_leased = 0
        self.trials_recorded = 0
        self.lease_expiries = 0

    def leased(self, n: int) -> None:
        with self._lock:
            self.trials_leased += n

    def recorded(self, n: int) -> None:
        now = time.time()
        with self._lock:
            self.trials_recorded += n
            self._recent.append((now, n))

    def expired(self, n: int) -> None:
        with self._lock:
            self.lease_expiries += n

    def trials_per_second(self) -> float:
        now = time.time()
        with self._lock:
            while self._recent and self._recent[0][0] < now - self._window:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / self._window

    def render(self, queue_depth: int, workers_alive: int, records: int) -> str:
        rows = [
            ("tuner_queue_depth", "gauge", "trials waiting for a worker", queue_depth),
            ("tuner_trials_per_second", "gauge", "trials recorded per second, last 10 s",
             round(self.trials_per_second(), 3)),
            ("tuner_trials_leased_total", "counter", "trials handed to workers",
             self.trials_leased),
            ("tuner_trials_recorded_total", "counter", "trial results stored",
             self.trials_recorded),
            ("tuner_lease_expiries_total", "counter", "leases that expired and were requeued",
             self.lease_expiries),
            ("tuner_workers_alive", "gauge", "workers alive: not deregistered, seen within the lease", workers_alive),
            ("tuner_records", "gauge", "records in the database", records),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(out) + "\n"

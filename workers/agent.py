"""The worker loop: register, lease trials, measure each in an isolated child, report.

A kernel that hangs or crashes costs one trial (error 7 or 4) because measuring runs in
a child process; a lost server is retried with backoff; SIGTERM finishes the trial in
hand and gives the rest of the lease back.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from typing import Any

import httpx

from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest
from schemas import Config, MeasureOptions, Workload

log = logging.getLogger("tuner.worker")


class WorkerAgent:
    def __init__(self, server: str, token: str | None, device: str | None = None,
                 name: str | None = None, batch: int = 1, wait_s: float = 10.0,
                 heartbeat_s: float = 10.0, extra_modules: tuple[str, ...] = ()) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=server, headers=headers, timeout=wait_s + 30)
        self._measurer = IsolatedMeasurer(device, extra_modules=extra_modules)
        self._name = name or f"{socket.gethostname()}:{device or 'default'}"
        self._batch, self._wait_s, self._heartbeat_s = batch, wait_s, heartbeat_s
        self._held: list[int] = []
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.worker_id: int | None = None
        self.measured = 0

    # -- HTTP with retries: the server may restart under us ---------------------------
    def _post(self, path: str, body: dict[str, Any], retry: bool = True) -> Any:
        delay = 0.2
        while True:
            try:
                response = self._http.post(path, json=body)
                if response.status_code < 500:
                    if response.is_error:
                        raise RuntimeError(f"{path}: {response.status_code} {response.text}")
                    return response.json()
                reason = f"{response.status_code} {response.text[:200]}"
            except httpx.TransportError as err:
                reason = str(err) or type(err).__name__
            if not retry or (self.stopping.is_set() and not path.endswith(("/results",
                                                                            "/release"))):
                raise RuntimeError(f"{path}: {reason}")
            log.warning("server unavailable (%s); retrying in %.1f s", reason, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def register(self) -> int:
        info = self._measurer.start()
        body = {"name": self._name, "target": str(info.target),
                "limits": info.limits.model_dump(), "device": info.name[:255] or None}
        self.worker_id = int(self._post("/api/v1/workers", body)["id"])
        log.info("registered as worker %s for %s (%s)", self.worker_id, info.target, info.name)
        return self.worker_id

    def _heartbeats(self) -> None:
        last = time.time()
        while not self.stopping.wait(0.2):  # short waits: the interval may shrink
            if time.time() - last < self._heartbeat_s:
                continue
            last = time.time()
            with self._lock:
                held = list(self._held)
            if held:
                try:
                    self._post(f"/api/v1/workers/{self.worker_id}/heartbeat",
                               {"trial_ids": held}, retry=False)
                except RuntimeError as err:
                    log.warning("heartbeat failed: %s", err)

    def run(self, max_trials: int | None = None, idle_exit_s: float | None = None) -> int:
        """Serve until stopped (or ``max_trials`` measured, or idle ``idle_exit_s``)."""
        if self.worker_id is None:
            self.register()
        beat = threading.Thread(target=self._heartbeats, daemon=True)
        beat.start()
        idle_since = time.time()
        try:
            while not self.stopping.is_set():
                if max_trials is not None and self.measured >= max_trials:
                    break
                try:
                    leased = self._post(f"/api/v1/workers/{self.worker_id}/lease",
                                        {"max_trials": self._batch, "wait_s": self._wait_s})
                except RuntimeError:
                    if self.stopping.is_set():
                        break
                    raise
                trials = leased["trials"]
                if "lease_seconds" in leased:  # beat well inside the server's lease
                    self._heartbeat_s = min(self._heartbeat_s, leased["lease_seconds"] / 3)
                if not trials:
                    if idle_exit_s is not None and time.time() - idle_since > idle_exit_s:
                        break
                    continue
                idle_since = time.time()
                with self._lock:
                    self._held = [t["trial_id"] for t in trials]
                for trial in trials:
                    if self.stopping.is_set():
                        break
                    self._measure_and_report(trial)
                self._release_held()
        finally:
            self.stopping.set()
            self._release_held()
            self._measurer.close()
        return self.measured

    def _measure_and_report(self, trial: dict[str, Any]) -> None:
        log.info("measuring trial %s (%s)", trial["trial_id"], trial["template"])
        request = MeasureRequest(
            template=trial["template"],
            workload=Workload(template=trial["template"], args=trial["args"]),
            config=Config.model_validate(trial["config"]),
            options=MeasureOptions.model_validate(trial["measure"]),
        )
        result = self._measurer.measure(request)
        info = {"device": self._measurer.device_info.name} if self._measurer.device_info else {}
        self._post(f"/api/v1/workers/{self.worker_id}/results", {"results": [{
            "trial_id": trial["trial_id"], "result": result.model_dump(mode="json"),
            "info": info}]})
        self.measured += 1
        with self._lock:
            if trial["trial_id"] in self._held:
                self._held.remove(trial["trial_id"])

    def _release_held(self) -> None:
        with self._lock:
            held, self._held = list(self._held), []
        if held and self.worker_id is not None:
            try:
                self._post(f"/api/v1/workers/{self.worker_id}/release", {"trial_ids": held},
                           retry=False)
            except RuntimeError as err:
                log.warning("could not return %d trials (their leases will expire): %s",
                            len(held), err)

    def stop_on_signals(self) -> None:
        """SIGTERM/SIGINT: finish the trial in hand, return the rest of the lease."""
        def handler(signum: int, _frame: Any) -> None:
            log.info("signal %s: finishing the trial in hand", signum)
            self.stopping.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

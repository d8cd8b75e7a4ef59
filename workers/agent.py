"""The worker loop: register, lease trials, measure each in an isolated child, report.

A kernel that hangs or crashes costs one trial (error 7 or 4) because measuring runs in
a child process; a trial that cannot even be set up (bad options, a config that does not
decode, an error in the measurer) is reported as that trial's failure (error 1 or 8), so
no one job can stop a worker. A lost or overloaded server (a transport error, any 5xx,
503 included) is retried with backoff; a result the server fails on repeatedly (500) or
refuses (4xx) is dropped, not retried forever; a 409 on a heartbeat or a result (the
trial is no longer ours) drops it at once, and stops measuring it. A 409 on a lease
("register again": deregistered) registers again; a 401/403 (the token was revoked)
stops the worker with one log line saying so.

SIGTERM finishes the trial in hand, reports it (retried for about a lease, then given
up: the lease expires), gives the rest of the lease back and deregisters; a crash gives
nothing back, so the server counts the lease as an attempt (a trial that kills two
workers is failed, not handed to a third).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from typing import Any

import httpx
from pydantic import ValidationError

from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest
from schemas import Config, MeasureErrorNo, MeasureOptions, MeasureResult, Workload
from schemas.text import first_problem, one_line

log = logging.getLogger("tuner.worker")

MAX_MESSAGE = 2000  # characters of an exception's text reported with a failed trial
MAX_500 = 5  # results the server failed on (500) this often are dropped, not retried
DEFAULT_LEASE_S = 120.0  # the server's default lease, until its first lease answer says


class ServerRefused(RuntimeError):
    """The server answered 4xx: retrying the same request would not help."""

    def __init__(self, path: str, status: int, detail: str) -> None:
        super().__init__(f"{path}: {status} {detail}")
        self.status = status


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return str(body.get("detail", body))[:500] if isinstance(body, dict) else str(body)[:500]


class WorkerAgent:
    def __init__(self, server: str, token: str | None, device: str | None = None,
                 name: str | None = None, batch: int = 1, wait_s: float = 10.0,
                 heartbeat_s: float = 10.0, extra_modules: tuple[str, ...] = ()) -> None:
        self._token = token  # registers; the answer's token does the rest
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=server, headers=headers, timeout=wait_s + 30)
        self._measurer = IsolatedMeasurer(device, extra_modules=extra_modules)
        self._name = name or f"{socket.gethostname()}:{device or 'default'}"
        self._batch, self._wait_s, self._heartbeat_s = batch, wait_s, heartbeat_s
        self._lease_s = DEFAULT_LEASE_S
        self._held: list[int] = []
        self._current: int | None = None  # the trial being measured
        self._dropped: set[int] = set()  # trials of this batch that are no longer ours
        self._give_up_at: float | None = None  # stopping: when to stop retrying reports
        self._lock = threading.Lock()
        self._aborted = False
        self.stopping = threading.Event()
        self.worker_id: int | None = None
        self.measured = 0

    # -- HTTP with retries: the server may restart under us ---------------------------
    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              retry: bool = True, headers: dict[str, str] | None = None) -> Any:
        """The answer's JSON; retries a server that is down or overloaded. Raises
        :class:`ServerRefused` for a 4xx, RuntimeError when it gives up: at once without
        ``retry``; while stopping, at once but for results and releases, which are
        retried for about a lease after the first failure (then the lease expires)."""
        delay = 0.2
        errors = 0  # 500s: a server that fails on this very body, not one that is down
        while True:
            try:
                response = self._http.request(method, path, json=body, headers=headers)
                if response.status_code < 500:
                    if response.is_error:
                        raise ServerRefused(path, response.status_code, _detail(response))
                    return response.json()
                reason = f"{response.status_code} {_detail(response)[:200]}"
                errors += response.status_code == 500
                if errors >= MAX_500 and path.endswith("/results"):
                    raise ServerRefused(path, 500, _detail(response))
            except httpx.TransportError as err:
                reason = str(err) or type(err).__name__
            if not retry or (self.stopping.is_set() and not path.endswith(("/results",
                                                                            "/release"))):
                raise RuntimeError(f"{path}: {reason}")
            if self.stopping.is_set():
                if self._give_up_at is None:
                    self._give_up_at = time.time() + self._lease_s
                if time.time() >= self._give_up_at:
                    raise RuntimeError(f"{path}: {reason}; given up, stopping")
            log.warning("server unavailable (%s); retrying in %.1f s", reason, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _post(self, path: str, body: dict[str, Any], retry: bool = True) -> Any:
        return self._call("POST", path, body, retry)

    def register(self) -> int:
        """Register with the token given (a fleet's bootstrap token may only do this) and
        use the token the answer hands back, which speaks for this worker alone."""
        info = self._measurer.start()
        body = {"name": self._name, "target": str(info.target),
                "limits": info.limits.model_dump(), "device": info.name[:255] or None}
        auth = {"Authorization": f"Bearer {self._token}"} if self._token else None
        answer = self._call("POST", "/api/v1/workers", body, headers=auth)
        self.worker_id = int(answer["id"])
        token = answer.get("token", self._token)
        if token:
            self._http.headers["Authorization"] = f"Bearer {token}"
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
                self._beat(held)

    def _beat(self, trial_ids: list[int]) -> None:
        """Extend these leases. A 409 (nothing extended) means some are no longer ours
        (requeued after an expiry, measured by another): beat them one by one to learn
        which, and drop those."""
        try:
            self._post(f"/api/v1/workers/{self.worker_id}/heartbeat",
                       {"trial_ids": trial_ids}, retry=False)
        except ServerRefused as err:
            if err.status != 409:
                log.warning("heartbeat refused: %s", err)
            elif len(trial_ids) == 1:
                self._drop(trial_ids[0], err)
            else:
                for trial_id in trial_ids:
                    self._beat([trial_id])
        except RuntimeError as err:
            log.warning("heartbeat failed: %s", err)

    def _drop(self, trial_id: int, err: Exception) -> None:
        """The server says this trial is no longer ours: forget it, kill its measurement
        if it is in hand (the next trial starts a fresh child), and report nothing."""
        log.warning("trial %s is no longer leased to this worker; dropped (%s)", trial_id, err)
        with self._lock:
            self._dropped.add(trial_id)
            if trial_id in self._held:
                self._held.remove(trial_id)
            if self._current == trial_id:
                self._measurer.close()

    def run(self, max_trials: int | None = None, idle_exit_s: float | None = None) -> int:
        """Serve until stopped (or ``max_trials`` measured, or idle ``idle_exit_s``).

        A clean end gives back the trials not measured and deregisters; an exception
        escaping the loop does neither (the leases expire and count as attempts)."""
        if self.worker_id is None:
            self.register()
        beat = threading.Thread(target=self._heartbeats, daemon=True)
        beat.start()
        clean = False
        try:
            self._serve(max_trials, idle_exit_s)
            clean = True
        finally:
            self.stopping.set()
            self._measurer.close()
            if clean:
                self._release_held()
                self.deregister()
        return self.measured

    def _serve(self, max_trials: int | None, idle_exit_s: float | None) -> None:
        idle_since = time.time()
        while not self.stopping.is_set():
            if max_trials is not None and self.measured >= max_trials:
                return
            try:
                leased = self._post(f"/api/v1/workers/{self.worker_id}/lease",
                                    {"max_trials": self._batch, "wait_s": self._wait_s})
            except RuntimeError as err:
                if self.stopping.is_set():
                    return
                if isinstance(err, ServerRefused) and err.status == 409:
                    # "deregistered; register again" (or a row that no longer parses)
                    log.warning("%s: registering again", err)
                    self.register()
                    continue
                raise
            trials = leased["trials"]
            if "lease_seconds" in leased:  # beat well inside the server's lease
                self._lease_s = float(leased["lease_seconds"])
                self._heartbeat_s = min(self._heartbeat_s, self._lease_s / 3)
            if not trials:
                if idle_exit_s is not None and time.time() - idle_since > idle_exit_s:
                    return
                continue
            idle_since = time.time()
            with self._lock:
                self._held = [t["trial_id"] for t in trials]
                self._dropped = set()
            for trial in trials:
                if self.stopping.is_set():
                    break
                self._measure_and_report(trial)
            self._release_held()

    def measure_trial(self, trial: dict[str, Any]) -> MeasureResult:
        """The trial's result; whatever goes wrong becomes an AutoTVM error number."""
        try:
            request = MeasureRequest(
                template=trial["template"],
                workload=Workload(template=trial["template"], args=trial["args"]),
                config=Config.model_validate(trial["config"]),
                options=MeasureOptions.model_validate(trial["measure"]),
            )
        except (ValidationError, KeyError, TypeError, ValueError) as err:
            return MeasureResult.failure(MeasureErrorNo.INSTANTIATION_ERROR,
                                         f"cannot set up the trial: {_text(err)}")
        try:
            return self._measurer.measure(request)
        except Exception as err:
            # killed on purpose (Ctrl-C, no longer ours): not worth a traceback
            if not (self._aborted or self._no_longer_ours(trial.get("trial_id"))):
                log.exception("measuring trial %s raised", trial.get("trial_id"))
            self._measurer.close()  # its state is unknown: the next trial starts a fresh one
            error_no = (MeasureErrorNo.INSTANTIATION_ERROR
                        if isinstance(err, (OverflowError, ValidationError))
                        else MeasureErrorNo.UNKNOWN_ERROR)
            return MeasureResult.failure(error_no, f"the worker could not measure it: "
                                                   f"{_text(err)}")

    def _no_longer_ours(self, trial_id: Any) -> bool:
        with self._lock:
            return trial_id in self._dropped

    def _measure_and_report(self, trial: dict[str, Any]) -> None:
        trial_id = trial["trial_id"]
        with self._lock:
            if trial_id in self._dropped:  # a heartbeat learned it is no longer ours
                return
            self._current = trial_id
        log.info("measuring trial %s (%s)", trial_id, trial.get("template"))
        try:
            result = self.measure_trial(trial)
        finally:
            with self._lock:
                self._current = None
        if self._aborted or self._no_longer_ours(trial_id):  # goes back, or is not ours
            return
        self._report(trial_id, result)
        self.measured += 1
        with self._lock:
            if trial_id in self._held:
                self._held.remove(trial_id)

    def _report(self, trial_id: int, result: MeasureResult) -> None:
        """Post one result. A 4xx or a server that fails on it repeatedly drops it (its
        lease expires: the server retries or fails the trial), but a 401/403, which means
        this worker's token was revoked, stops the worker (raised). Stopping, a server
        still down after about a lease is given up on: the result is dropped."""
        info = {"device": self._measurer.device_info.name} if self._measurer.device_info else {}
        path = f"/api/v1/workers/{self.worker_id}/results"

        def post(measured: MeasureResult) -> None:
            self._post(path, {"results": [{"trial_id": trial_id, "info": info,
                                           "result": measured.model_dump(mode="json")}]})

        try:
            try:
                post(result)
            except ServerRefused as err:
                if not (err.status == 422 and result.ok):
                    raise
                log.error("trial %s: the server refused its result (%s); reporting it failed",
                          trial_id, err)
                post(MeasureResult.failure(MeasureErrorNo.UNKNOWN_ERROR,
                                           f"the server refused the result: {err}"))
        except ServerRefused as err:
            if err.status in (401, 403):
                log.error("the server no longer accepts this worker's token (%s): it was "
                          "revoked, or another process registered as this worker; stopping "
                          "(leased trials return when their leases expire)", err)
                raise
            if err.status == 409:  # no longer ours (lease expired, job cancelled)
                log.warning("trial %s is no longer leased to this worker; dropped (%s)",
                            trial_id, err)
            else:
                log.error("trial %s: the server did not store its result; dropped (%s)",
                          trial_id, err)
        except RuntimeError as err:
            if not self.stopping.is_set():
                raise
            log.error("trial %s: its result could not be reported while stopping; dropped "
                      "(its lease expires): %s", trial_id, err)

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

    def deregister(self) -> None:
        """Tell the server this worker is gone, so it no longer shows alive."""
        if self.worker_id is None:
            return
        try:
            self._call("DELETE", f"/api/v1/workers/{self.worker_id}", retry=False)
            log.info("deregistered worker %s", self.worker_id)
        except RuntimeError as err:
            log.warning("could not deregister worker %s: %s", self.worker_id, err)

    def abort(self) -> None:
        """Stop now (Ctrl-C): kill the trial being measured, report nothing more; the run
        loop still gives the lease back and deregisters."""
        self._aborted = True
        self.stopping.set()
        self._measurer.close()

    def stop_on_signals(self) -> None:
        """SIGTERM/SIGINT: finish the trial in hand, return the rest of the lease."""
        def handler(signum: int, _frame: Any) -> None:
            log.info("signal %s: finishing the trial in hand", signum)
            self.stopping.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _text(err: BaseException) -> str:
    """An exception as one bounded line: its type, and its message."""
    message = first_problem(err) if isinstance(err, ValidationError) else str(err)
    return one_line(f"{type(err).__name__}: {message}", MAX_MESSAGE)

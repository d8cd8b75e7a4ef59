"""The worker loop: register, lease trials, measure each in an isolated child, report,
all through ``tuner_client``. A leased batch's kernels are first built ahead by builder
processes (``compiler.runtime.prebuild``), so the measuring child finds them compiled;
its verification trials are then timed side by side, their repeats interleaved, so the
configs a build chooses between are compared under the same device speed.

A kernel that hangs or crashes costs one trial (error 7 or 4) because measuring runs in
a child process; a trial that cannot even be set up (bad options, a config that does not
decode, an error in the measurer) is reported as that trial's failure (error 1 or 8), so
no one job can stop a worker. A lost or overloaded server is retried with backoff by
the client (``retries=None``: until the worker stops), which sends a registration or a
lease again only when it never reached the server; one that may have (a read timeout, a
5xx) is made again here, after the client's backoff, because a worker cannot do without
it: a lost lease's trials return when it expires, a lost registration shows as a live
twin until then. A result the server fails on repeatedly (500, the client's
``MAX_500``) or refuses (4xx) is dropped, not retried forever; a 409 on a heartbeat or
a result (the trial is no longer ours) drops it at once, and stops measuring it. A 409
on a lease ("register again": deregistered) registers again; a 401/403 (the token was
revoked) stops the worker with one log line saying so.

SIGTERM finishes the trial in hand (or the batch's verification trials it times side by
side: a second or two each), reports it (retried for about a lease, then given up: the
lease expires), gives the rest of the lease back and deregisters; a crash gives nothing
back, so the server counts the lease as an attempt (a trial that kills two
workers is failed, not handed to a third).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from pydantic import ValidationError

from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest, cold_weights, timed_layout
from schemas import Config, MeasureErrorNo, MeasureOptions, MeasureResult, Workload
from schemas.api import LeasedTrial, TrialResult, WorkerRegistration
from schemas.record import COLD_INFO
from schemas.text import first_problem, one_line
from tuner_client import (
    ApiError,
    Conflict,
    Invalid,
    TunerClient,
    Unauthorized,
    Unavailable,
)

log = logging.getLogger("tuner.worker")

MAX_MESSAGE = 2000  # characters of an exception's text reported with a failed trial
DEFAULT_LEASE_S = 120.0  # the server's default lease, until its first lease answer says
REQUEST_TIMEOUT_S = 30.0  # per request; a lease adds its long-poll wait


def _outage(err: ApiError) -> bool:
    """The server is down or failing (no answer, any 5xx): the same request may succeed
    later. Anything else is a refusal that retrying would not change."""
    return isinstance(err, Unavailable) or (err.status or 0) >= 500


class WorkerAgent:
    def __init__(self, server: str, token: str | None, device: str | None = None,
                 name: str | None = None, batch: int = 1, wait_s: float = 10.0,
                 heartbeat_s: float = 10.0, extra_modules: tuple[str, ...] = (),
                 quiet: AbstractContextManager[object] | None = None) -> None:
        self._token = token  # registers; the answer's token does the rest
        # held while a trial is measured: the embedded server plans only between trials
        self._quiet = quiet or nullcontext()
        self.stopping = threading.Event()
        # Retried for as long as the worker serves; no more once it is told to stop.
        self._api = TunerClient(server, token, timeout=REQUEST_TIMEOUT_S, retries=None,
                                stop=self.stopping)
        self._measurer = IsolatedMeasurer(device, extra_modules=extra_modules)
        self._name = name or f"{socket.gethostname()}:{device or 'default'}"
        self._batch, self._wait_s, self._heartbeat_s = batch, wait_s, heartbeat_s
        self._lease_s = DEFAULT_LEASE_S
        self._held: list[int] = []
        self._current: set[int] = set()  # the trials being measured
        self._dropped: set[int] = set()  # trials of this batch that are no longer ours
        self._give_up_at: float | None = None  # stopping: when to stop retrying reports
        self._lock = threading.Lock()
        self._aborted = False
        self.worker_id: int | None = None
        self.measured = 0

    # -- retries: the server may restart under us -------------------------------------
    @property
    def _once(self) -> TunerClient:
        """The client, trying once: heartbeats (the next beat replaces one), release and
        deregister (the leases expire anyway)."""
        return self._api.with_retries(0)

    @property
    def _reports(self) -> TunerClient:
        """The client, retrying a result until :meth:`_give_up`."""
        return self._api.with_retries(None, stop=self._give_up)

    def _give_up(self) -> bool:
        """Whether to stop retrying a result: never while serving; stopping, once about a
        lease has passed since (then its lease expires anyway)."""
        if not self.stopping.is_set():
            return False
        if self._give_up_at is None:
            self._give_up_at = time.time() + self._lease_s
        return time.time() >= self._give_up_at

    def _again(self, err: ApiError, attempt: int, what: str) -> bool:
        """After ``err`` on a request the worker cannot do without (register, lease):
        whether to make it again, after the client's backoff. Not for a refusal (4xx,
        an answer that is not the API's), nor once stopping."""
        if not _outage(err) or self.stopping.is_set():
            return False
        log.warning("%s failed (%s); trying again", what, err)
        return self._api.backoff(attempt)

    def register(self) -> int:
        """Register with the token given (a fleet's bootstrap token may only do this) and
        use the token the answer hands back, which speaks for this worker alone."""
        info = self._measurer.start()
        registration = WorkerRegistration(name=self._name, target=info.target,
                                          limits=info.limits, device=info.name[:255] or None)
        self._api.use_token(self._token)  # registering again: not the revoked one
        attempt = 0
        while True:
            try:
                answer = self._api.register_worker(registration)
                break
            except ApiError as err:
                if not self._again(err, attempt, "registering"):
                    raise
                attempt += 1
        self.worker_id = answer.id
        self._api.use_token(answer.token)
        log.info("registered as worker %s for %s (%s)", self.worker_id, info.target, info.name)
        return self.worker_id

    def _worker(self) -> int:
        """This worker's id (it registers before anything else is asked)."""
        if self.worker_id is None:
            raise RuntimeError("the worker is not registered")
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
        worker_id = self._worker()
        try:
            self._once.heartbeat(worker_id, trial_ids)
        except Conflict as err:
            if len(trial_ids) == 1:
                self._drop(trial_ids[0], err)
            else:
                for trial_id in trial_ids:
                    self._beat([trial_id])
        except ApiError as err:
            log.warning("heartbeat failed: %s", err)

    def _drop(self, trial_id: int, err: Exception) -> None:
        """The server says this trial is no longer ours: forget it, kill its measurement
        if it is in hand (the next trial starts a fresh child), and report nothing."""
        log.warning("trial %s is no longer leased to this worker; dropped (%s)", trial_id, err)
        with self._lock:
            self._dropped.add(trial_id)
            if trial_id in self._held:
                self._held.remove(trial_id)
            if trial_id in self._current:
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
            self.close()
        return self.measured

    def close(self) -> None:
        """Close the connections to the server (:meth:`run` does, as it ends)."""
        self._api.close()

    def _serve(self, max_trials: int | None, idle_exit_s: float | None) -> None:
        idle_since = time.time()
        outages = 0
        while not self.stopping.is_set():
            if max_trials is not None and self.measured >= max_trials:
                return
            try:
                leased = self._api.lease(self._worker(), self._batch, self._wait_s)
            except ApiError as err:
                if self.stopping.is_set():
                    return
                if isinstance(err, Conflict):
                    # "deregistered; register again" (or a row that no longer parses)
                    log.warning("%s: registering again", err)
                    self.register()
                    continue
                if self._again(err, outages, "leasing"):
                    outages += 1
                    continue
                if self.stopping.is_set():
                    return
                raise
            outages = 0
            trials = leased.trials
            self._lease_s = leased.lease_seconds  # beat well inside the server's lease
            self._heartbeat_s = min(self._heartbeat_s, self._lease_s / 3)
            if not trials:
                if idle_exit_s is not None and time.time() - idle_since > idle_exit_s:
                    return
                continue
            idle_since = time.time()
            with self._lock:
                self._held = [t.trial_id for t in trials]
                self._dropped = set()
            requests = {t.trial_id: self._request(t) for t in trials}
            self._prebuild([r for r in requests.values() if isinstance(r, MeasureRequest)])
            done = self._measure_side_by_side(
                [t for t in trials if t.verify_round
                 and isinstance(requests[t.trial_id], MeasureRequest)], requests)
            for trial in trials:
                if self.stopping.is_set():
                    break
                if trial.trial_id not in done:
                    self._measure_and_report(trial, requests[trial.trial_id])
            self._release_held()

    def _prebuild(self, requests: list[MeasureRequest]) -> None:
        """Build the batch's kernels ahead, in parallel processes, before any is timed.
        Only a gain: a kernel not built here is built by the measuring child, which
        reports its error, so no failure here costs a trial or stops the worker."""
        try:
            report = self._measurer.prebuild(requests, stop=self.stopping.is_set)
        except Exception as err:  # noqa: BLE001 - the trials are measured all the same
            log.warning("building the batch ahead failed (%s); measuring it as it comes",
                        _text(err))
            return
        if report is not None:
            log.info("built %d of %d kernels ahead in %.2f s", report.built,
                     len(requests), report.seconds)
            for request, outcome in zip(requests, report.outcomes):
                if outcome:
                    log.info("config %s of %s was not built ahead: %s", request.config.index,
                             request.template, one_line(outcome, MAX_MESSAGE))

    @staticmethod
    def _request(trial: LeasedTrial) -> MeasureRequest | MeasureResult:
        """What the measurer is sent for ``trial``, or its failure (error 1) when the
        trial cannot even be set up."""
        try:
            return MeasureRequest(
                template=trial.template,
                workload=Workload(template=trial.template, args=tuple(trial.args)),
                config=Config.model_validate(trial.config),
                options=MeasureOptions.model_validate(trial.measure),
            )
        except (ValidationError, TypeError, ValueError) as err:
            return MeasureResult.failure(MeasureErrorNo.INSTANTIATION_ERROR,
                                         f"cannot set up the trial: {_text(err)}")

    def measure_trial(self, trial: LeasedTrial,
                      request: MeasureRequest | MeasureResult | None = None) -> MeasureResult:
        """The trial's result; whatever goes wrong becomes an AutoTVM error number.
        ``request`` is :meth:`_request`'s answer where the caller has it already."""
        if request is None:
            request = self._request(trial)
        if isinstance(request, MeasureResult):
            return request
        try:
            return self._measurer.measure(request)
        except Exception as err:
            # killed on purpose (Ctrl-C, no longer ours): not worth a traceback
            if not (self._aborted or self._no_longer_ours(trial.trial_id)):
                log.exception("measuring trial %s raised", trial.trial_id)
            self._measurer.close()  # its state is unknown: the next trial starts a fresh one
            error_no = (MeasureErrorNo.INSTANTIATION_ERROR
                        if isinstance(err, (OverflowError, ValidationError))
                        else MeasureErrorNo.UNKNOWN_ERROR)
            return MeasureResult.failure(error_no, f"the worker could not measure it: "
                                                   f"{_text(err)}")

    def _no_longer_ours(self, trial_id: int) -> bool:
        with self._lock:
            return trial_id in self._dropped

    def _measure_side_by_side(self, trials: list[LeasedTrial],
                              requests: dict[int, MeasureRequest | MeasureResult]) -> set[int]:
        """A batch's verification trials (two or more) timed side by side, their repeats
        interleaved (``IsolatedMeasurer.measure_group``), so the device's drift within
        seconds falls on every config alike and their costs compare; returns the ids
        reported. Any the group left unmeasured (it hung, crashed, or a device error
        ended it) are the caller's to measure alone, where a failure is blamed on the
        trial that caused it."""
        with self._lock:
            trials = [t for t in trials if t.trial_id not in self._dropped]
            if len(trials) < 2 or self.stopping.is_set():
                return set()
            self._current = {t.trial_id for t in trials}
        log.info("measuring trials %s side by side", ", ".join(str(t.trial_id) for t in trials))
        group = [requests[t.trial_id] for t in trials]
        results: list[MeasureResult | None] = [None] * len(trials)
        try:
            with self._quiet:
                results = self._measurer.measure_group(group)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - each is measured alone instead
            if not self._aborted:
                log.warning("measuring trials side by side failed (%s); measuring each "
                            "alone", _text(err))
            self._measurer.close()
        finally:
            with self._lock:
                self._current = set()
        done = set()
        for trial, result in zip(trials, results, strict=True):
            if result is not None:
                done.add(trial.trial_id)
                self._finish(trial, requests[trial.trial_id], result)
        return done

    def _measure_and_report(self, trial: LeasedTrial,
                            request: MeasureRequest | MeasureResult) -> None:
        trial_id = trial.trial_id
        with self._lock:
            if trial_id in self._dropped:  # a heartbeat learned it is no longer ours
                return
            self._current = {trial_id}
        log.info("measuring trial %s (%s)", trial_id, trial.template)
        try:
            with self._quiet:
                result = self.measure_trial(trial, request)
        finally:
            with self._lock:
                self._current = set()
        self._finish(trial, request, result)

    def _finish(self, trial: LeasedTrial, request: MeasureRequest | MeasureResult,
                result: MeasureResult) -> None:
        """Report a measured trial, unless it went back or is no longer ours."""
        trial_id = trial.trial_id
        if self._aborted or self._no_longer_ours(trial_id):
            return
        layout = timed_layout(request) if isinstance(request, MeasureRequest) else None
        cold = isinstance(request, MeasureRequest) and cold_weights(
            request.options, self._measurer.device_info)
        self._report(trial_id, result, layout, cold)
        self.measured += 1
        with self._lock:
            if trial_id in self._held:
                self._held.remove(trial_id)

    def _report(self, trial_id: int, result: MeasureResult, layout: str | None = None,
                cold: bool = False) -> None:
        """Post one result, with the device's name, the layout the kernel was timed in
        (``timed_layout``) and whether its weight was cold (``cpu_cache_flush``) kept in
        its record's info. A 4xx or a server that fails on it
        repeatedly drops it (its lease expires: the server retries or fails the trial),
        but a 401/403, which means this worker's token was revoked, stops the worker
        (raised). Stopping, a server still down after about a lease is given up on: the
        result is dropped."""
        info = {"device": self._measurer.device_info.name} if self._measurer.device_info else {}
        if layout is not None:
            info["layout"] = layout
        if cold:
            info[COLD_INFO] = True
        worker_id = self._worker()

        def post(measured: MeasureResult) -> None:
            results = [TrialResult(trial_id=trial_id, result=measured, info=info)]
            self._reports.report_results(worker_id, results)

        try:
            try:
                post(result)
            except (Invalid, ValidationError) as err:  # the server's rule, checked here too
                if not result.ok:
                    raise
                why = err if isinstance(err, Invalid) else _text(err)
                log.error("trial %s: the server refused its result (%s); reporting it failed",
                          trial_id, why)
                post(MeasureResult.failure(MeasureErrorNo.UNKNOWN_ERROR,
                                           f"the server refused the result: {why}"))
        except Unauthorized as err:
            log.error("the server no longer accepts this worker's token (%s): it was "
                      "revoked, or another process registered as this worker; stopping "
                      "(leased trials return when their leases expire)", err)
            raise
        except Conflict as err:  # no longer ours (lease expired, job cancelled)
            log.warning("trial %s is no longer leased to this worker; dropped (%s)",
                        trial_id, err)
        except ApiError as err:
            if self.stopping.is_set() and _outage(err):
                log.error("trial %s: its result could not be reported while stopping; "
                          "dropped (its lease expires): %s", trial_id, err)
            else:
                log.error("trial %s: the server did not store its result; dropped (%s)",
                          trial_id, err)

    def _release_held(self) -> None:
        with self._lock:
            held, self._held = list(self._held), []
        if held and self.worker_id is not None:
            worker_id = self.worker_id
            try:
                self._once.release(worker_id, held)
            except ApiError as err:
                log.warning("could not return %d trials (their leases will expire): %s",
                            len(held), err)

    def deregister(self) -> None:
        """Tell the server this worker is gone, so it no longer shows alive."""
        worker_id = self.worker_id
        if worker_id is None:
            return
        try:
            self._once.deregister(worker_id)
            log.info("deregistered worker %s", worker_id)
        except ApiError as err:
            log.warning("could not deregister worker %s: %s", worker_id, err)

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


"""Trials in a child process with a deadline, so a hanging or crashing kernel costs
one trial (AutoTVM errors 6, 7 or 4), never the caller.

The child opens its device once and serves trials over a pipe until it is killed; a
trial past its deadline, or one that ends in a device error (error 4: a CUDA context
after an illegal address is dead, an OpenCL queue after a CL error may be), kills it and
the next trial starts a fresh one. The child leads its own process group, and killing it
kills the group: a device compiler it runs (pycuda runs nvcc and ptxas as processes)
dies with it on a build timeout instead of running on.

A group of trials (a batch's verification) can be timed side by side in the child
(:meth:`IsolatedMeasurer.measure_group`); whatever ends it early leaves the members it did
not finish to be measured one at a time, so a failure still costs only its own trial.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from compiler.runtime.child import child_connection, kill_group, spawn_child
from compiler.runtime.device import is_cpu
from compiler.runtime.measure import MeasureRequest, measure, measure_group
from compiler.runtime.prebuild import BuildPool, PrebuildReport, prebuild_enabled
from schemas import MeasureErrorNo, MeasureResult

MAX_POLL_S = 3600.0  # longest single wait on the child; poll() overflows past ~1e9 s


def _serve(conn: Connection, device_spec: str | None, target: str | None,
           extra_modules: tuple[str, ...]) -> None:
    """The child's loop (run as ``python -m compiler.runtime.isolate FD``)."""
    import importlib

    from compiler.runtime import open_device

    for name in extra_modules:  # templates registered outside the library (tests)
        importlib.import_module(name)
    try:
        device = open_device(device_spec, target)
    except Exception as err:  # report and exit: the parent turns it into results
        conn.send(("error", f"cannot open device: {err}"))
        return
    conn.send(("ready", device.info))
    with device:  # closed when the parent hangs up (a CUDA context is released)
        while True:
            try:
                request = conn.recv()
            except EOFError:
                return
            if isinstance(request, list):  # a group, timed side by side
                results = measure_group(device, request,
                                        on_stage=lambda s: conn.send(("stage", s)))
                conn.send(("results", results))
                continue
            result = measure(device, request, on_stage=lambda s: conn.send(("stage", s)))
            conn.send(("result", result))


class IsolatedMeasurer:
    """A child process that owns one device and measures trials under a deadline."""

    def __init__(self, device_spec: str | None = None, target: str | None = None,
                 extra_modules: tuple[str, ...] = ()) -> None:
        self._args = (device_spec, target, extra_modules)
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._pool: BuildPool | None = None
        self._ahead: dict[int, threading.Event] = {}  # id(request) -> built ahead (overlap)
        self._ahead_thread: threading.Thread | None = None
        self.device_info: Any = None

    def _start(self) -> None:
        self._proc, self._conn = spawn_child("compiler.runtime.isolate", self._args)
        try:
            ready = self._conn.poll(120)
            kind, payload = self._conn.recv() if ready else ("error", "device start timed out")
        except (EOFError, OSError):
            kind, payload = "error", f"measurement process exited with {self._exitcode()}"
        if kind != "ready":
            self._kill_child()
            raise RuntimeError(payload)
        self.device_info = payload

    def start(self) -> Any:
        """Start the child now (it starts lazily otherwise); returns its DeviceInfo."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        return self.device_info

    def prebuild(self, requests: Sequence[MeasureRequest],
                 stop: Callable[[], bool] | None = None,
                 overlap: bool | None = None) -> PrebuildReport | None:
        """Build a batch's kernels ahead of measuring them, in builder processes (see
        ``prebuild``). On a CPU device it returns when they are built: no compile may run
        while a kernel is timed on the cores. With ``overlap`` (the default on other
        devices, a GPU: builders compile on host cores and launch nothing) it returns at
        once, the batch builds meanwhile, and :meth:`measure` of a request waits for the
        builders' try at it; that overlap is not measured on this project's CPU machine.
        None where no report is ready: building ahead is switched off
        ($TUNER_PREBUILD=0), the batch holds one kernel (it builds no faster apart), or
        it overlaps measuring."""
        if len(requests) < 2 or not prebuild_enabled():
            return None
        info = self.start()
        self._join_ahead()
        if self._pool is None:
            self._pool = BuildPool(info.spec, self._args[2])
        pool = self._pool
        if not (not is_cpu(info) if overlap is None else overlap):
            return pool.prebuild(requests, stop, largest_first=True)
        events = {id(r): threading.Event() for r in requests}
        self._ahead = events

        def build() -> None:
            try:
                pool.prebuild(requests, stop, lambda i: events[id(requests[i])].set())
            except Exception:  # noqa: BLE001 - measuring builds what was not built ahead
                pass
            finally:
                for event in events.values():
                    event.set()

        self._ahead_thread = threading.Thread(target=build, daemon=True)
        self._ahead_thread.start()
        return None

    def _join_ahead(self) -> None:
        """Wait for the last overlapped batch's builders to finish with it."""
        thread, self._ahead_thread = self._ahead_thread, None
        if thread is not None:
            thread.join()

    def _wait_ahead(self, request: MeasureRequest) -> None:
        """A request being built ahead: the builders' try first, within its deadline."""
        ahead = self._ahead.pop(id(request), None)
        if ahead is not None:
            ahead.wait(request.options.timeout_s)

    def measure(self, request: MeasureRequest) -> MeasureResult:
        self._wait_ahead(request)
        start = time.time()
        conn = self._send(request)
        if conn is None:
            return MeasureResult.failure(
                MeasureErrorNo.RUNTIME_DEVICE, "the measurement process could not be "
                "restarted (it died between trials)", all_cost=time.time() - start)
        kind, payload = self._receive(conn, "build", start + request.options.timeout_s)
        if kind == "died":
            code = self._exitcode()  # before _kill_child(), which forgets the process
            self._kill_child()
            return MeasureResult.failure(
                MeasureErrorNo.RUNTIME_DEVICE,
                f"measurement process died during {payload} (exit code {code})",
                all_cost=time.time() - start)
        if kind == "timeout":
            self._kill_child()
            return self._timed_out(request, payload, start)
        if payload.error_no == MeasureErrorNo.RUNTIME_DEVICE:
            self._kill_child()  # the device may be unusable: the next trial, a fresh child
        return payload  # type: ignore[no-any-return]

    def measure_group(self, requests: Sequence[MeasureRequest]
                      ) -> list[MeasureResult | None]:
        """Time ``requests`` side by side in the child (``measure.measure_group``): their
        results, None for each one the group left unmeasured, to be measured alone
        (:meth:`measure`), where an error lands on the trial that caused it. A member's
        deadline is its ``timeout_s`` from each step the child starts on it (its build,
        its check, each of its repeats), not from the group's start. One past it fails
        (error 6 or 7, as alone) and the rest are left unmeasured; a child that dies
        leaves every member unmeasured (which one killed it is unknown). Either, or a
        device error in the group, replaces the child."""
        results: list[MeasureResult | None] = [None] * len(requests)
        if not requests:
            return results
        for request in requests:
            self._wait_ahead(request)
        start = time.time()
        conn = self._send(list(requests))
        if conn is None:
            return results
        kind, payload = self._receive(
            conn, (0, "build"), start + requests[0].options.timeout_s,
            lambda stage: time.time() + requests[stage[0]].options.timeout_s)
        if kind == "timeout":
            member, stage = payload
            results[member] = self._timed_out(requests[member], stage, start)
        if kind in ("died", "timeout") or None in payload:
            self._kill_child()  # the device may be unusable: the rest, a fresh child
            return results
        return payload  # type: ignore[no-any-return]

    def _timed_out(self, request: MeasureRequest, stage: str, start: float) -> MeasureResult:
        error_no = (MeasureErrorNo.RUN_TIMEOUT if stage == "run"
                    else MeasureErrorNo.BUILD_TIMEOUT)
        return MeasureResult.failure(
            error_no, f"{stage} did not finish within {request.options.timeout_s:g} s",
            all_cost=time.time() - start)

    def _receive(self, conn: Connection, stage: Any, deadline: float,
                 restart: Callable[[Any], float] | None = None) -> tuple[str, Any]:
        """The child's answer to what was sent: ("result" or "results", it), or
        ("died", stage) or ("timeout", stage) with the stage it was in. The child names
        each stage it starts; ``restart`` gives a stage its own deadline (else one
        deadline covers them all). Any deadline, even 1e300 s or infinity: waited for in
        steps a poll() can take."""
        while True:
            left = deadline - time.time()
            try:
                ready = left > 0 and conn.poll(min(left, MAX_POLL_S))
                if ready:
                    kind, payload = conn.recv()
            except (EOFError, OSError):  # the child died, or close() from another thread
                return "died", stage
            if not ready:
                if left > 0:  # a step of a long deadline, not the end of it
                    continue
                return "timeout", stage
            if kind != "stage":
                return kind, payload
            stage = payload
            if restart is not None:
                deadline = restart(stage)

    def _send(self, request: MeasureRequest | list[MeasureRequest]) -> Connection | None:
        """Hand ``request`` to the child, starting a fresh one if the last one died
        between trials; None if even a fresh one cannot take it."""
        for _attempt in range(2):
            self.start()
            conn = self._conn
            if conn is None:
                continue
            try:
                conn.send(request)
                return conn
            except (OSError, EOFError):
                self._kill_child()
        return None

    def _exitcode(self) -> int | None:
        if self._proc is None:
            return None
        try:
            return self._proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before it starts and after it is killed)."""
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """Kill the child and its process group (a compiler it started included), and the
        builders; safe to call from another thread while one is measuring."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # an overlapped batch's thread then ends, its events set
        self._kill_child()

    def _kill_child(self) -> None:
        """Kill the measuring child alone (a trial's failure): the builders stay."""
        proc, conn = self._proc, self._conn
        self._proc, self._conn = None, None
        if proc is not None:
            kill_group(proc)
        if conn is not None:
            conn.close()

    def __enter__(self) -> IsolatedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _main() -> None:
    conn = child_connection()
    device_spec, target, extra_modules = conn.recv()
    _serve(conn, device_spec, target, extra_modules)


if __name__ == "__main__":
    _main()

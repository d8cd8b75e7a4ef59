"""Trials in a child process with a deadline, so a hanging or crashing kernel costs
one trial (AutoTVM errors 6, 7 or 4), never the caller.

The child opens its device once and serves trials over a pipe until it is killed; a
trial past its deadline, or one that ends in a device error (error 4: a CUDA context
after an illegal address is dead, an OpenCL queue after a CL error may be), kills it and
the next trial starts a fresh one. The child leads its own process group, and killing it
kills the group: a device compiler it runs (pycuda runs nvcc and ptxas as processes)
dies with it on a build timeout instead of running on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from compiler.runtime.measure import MeasureRequest, measure
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
            result = measure(device, request, on_stage=lambda s: conn.send(("stage", s)))
            conn.send(("result", result))


class IsolatedMeasurer:
    """A child process that owns one device and measures trials under a deadline."""

    def __init__(self, device_spec: str | None = None, target: str | None = None,
                 extra_modules: tuple[str, ...] = ()) -> None:
        self._args = (device_spec, target, extra_modules)
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self.device_info: Any = None

    def _start(self) -> None:
        # A fresh interpreter, not multiprocessing: no re-import of the caller's __main__
        # and no OpenCL state inherited through fork.
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "compiler.runtime.isolate", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, process_group=0,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(self._args)
        try:
            ready = self._conn.poll(120)
            kind, payload = self._conn.recv() if ready else ("error", "device start timed out")
        except (EOFError, OSError):
            kind, payload = "error", f"measurement process exited with {self._exitcode()}"
        if kind != "ready":
            self.close()
            raise RuntimeError(payload)
        self.device_info = payload

    def start(self) -> Any:
        """Start the child now (it starts lazily otherwise); returns its DeviceInfo."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        return self.device_info

    def measure(self, request: MeasureRequest) -> MeasureResult:
        start = time.time()
        conn = self._send(request)
        if conn is None:
            return MeasureResult.failure(
                MeasureErrorNo.RUNTIME_DEVICE, "the measurement process could not be "
                "restarted (it died between trials)", all_cost=time.time() - start)
        # Any deadline, even 1e300 s or infinity: waited for in steps a poll() can take.
        deadline = start + request.options.timeout_s
        stage = "build"
        while True:
            left = deadline - time.time()
            try:
                ready = left > 0 and conn.poll(min(left, MAX_POLL_S))
                if ready:
                    kind, payload = conn.recv()
            except (EOFError, OSError):  # the child died, or close() from another thread
                code = self._exitcode()  # before close(), which forgets the process
                self.close()
                return MeasureResult.failure(
                    MeasureErrorNo.RUNTIME_DEVICE,
                    f"measurement process died during {stage} (exit code "
                    f"{code})", all_cost=time.time() - start)
            if not ready:
                if left > 0:  # a step of a long deadline, not the end of it
                    continue
                self.close()
                error_no = (MeasureErrorNo.RUN_TIMEOUT if stage == "run"
                            else MeasureErrorNo.BUILD_TIMEOUT)
                return MeasureResult.failure(
                    error_no, f"{stage} did not finish within {request.options.timeout_s:g} s",
                    all_cost=time.time() - start)
            if kind == "stage":
                stage = payload
                continue
            if payload.error_no == MeasureErrorNo.RUNTIME_DEVICE:
                self.close()  # the device may be unusable: the next trial gets a fresh child
            return payload  # type: ignore[no-any-return]

    def _send(self, request: MeasureRequest) -> Connection | None:
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
                self.close()
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
        """Kill the child and its process group (a compiler it started included); safe
        to call from another thread while one is measuring."""
        proc, conn = self._proc, self._conn
        self._proc, self._conn = None, None
        if proc is not None:
            try:  # the group outlives its leader: kill it even when the child has exited
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # gone (or its id reused)
                pass
            proc.wait(5)
        if conn is not None:
            conn.close()

    def __enter__(self) -> IsolatedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _main() -> None:
    # The parent decides what happens to the trial in hand on Ctrl-C (finish it, or kill
    # this child), not a traceback here, even where a SIGINT reaches this group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(sys.argv[1]))
    device_spec, target, extra_modules = conn.recv()
    _serve(conn, device_spec, target, extra_modules)


if __name__ == "__main__":
    _main()

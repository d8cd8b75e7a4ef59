"""A leased batch's kernels compiled ahead of their measurement, in builder processes.

On PoCL nearly all of a trial is the compiler: the front end at build and, at the first
launch, the work-group function for the kernel's local size (docs/BENCHMARKS.md,
"Overhead per trial"). Threads cannot overlap those builds (PoCL holds one global lock),
so a pool of builder processes does: each opens the device, builds a kernel of the batch
and, where the driver compiles at first launch (a CPU device), launches one work-group
of it on the trial's own operands. Both land in the driver's on-disk kernel cache, which
every device-owning process shares (``child.kernel_cache_dir``); the measuring child
then finds the kernel compiled. Nothing else passes between them, so a kernel the builders
could not build (it does not compile, it hangs, it crashes them) costs nothing but the
try: the measuring child builds it again and reports its own error number.

On a CPU device a compile on one core perturbs a kernel timed on all of them: the whole
batch is built first, then timed with no compile running, so the batch waits for its last
build; the builders take its largest kernel sources first (sized by a code generation in
a builder, where a template that hangs costs only its deadline), which leaves less of a
long compile to the end while the other builders wait. On a GPU device the builders
only compile, on host cores (they launch nothing), so ``IsolatedMeasurer.prebuild`` lets
them run while earlier trials are timed; that overlap is not measured (no GPU on the
machine this was written on).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from compiler.runtime.child import child_connection, kill_group, spawn_child
from compiler.runtime.device import Device, is_cpu
from compiler.runtime.measure import (
    MeasureRequest,
    TrialFailure,
    build_kernel,
    operand_buffers,
    request_kernel,
)
from compiler.templates import Kernel
from schemas import MeasureErrorNo

SWITCH_ENV = "TUNER_PREBUILD"  # "0" (or off/false/no) measures as before: no builders
MAX_BUILDERS = 8  # each holds a device context and a task's operands
START_TIMEOUT_S = 120.0  # as the measuring child's start
STEP_S = 0.2  # longest wait between looks at ``stop``


def prebuild_enabled() -> bool:
    """Whether batches are built ahead: not switched off, and the driver keeps what it
    compiles (PoCL's POCL_KERNEL_CACHE=0 would make every build in vain)."""
    off = ("0", "off", "false", "no")
    return (os.environ.get(SWITCH_ENV, "1").strip().lower() not in off
            and os.environ.get("POCL_KERNEL_CACHE", "1").strip() != "0")


def default_builders() -> int:
    """One builder per core this process may use (at most MAX_BUILDERS)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_BUILDERS))


def lease_batch() -> int:
    """Trials a worker leases at once so that its builders have work: four per builder
    (at most 16); one where building ahead is off (a trial waits for no other)."""
    return min(16, 4 * default_builders()) if prebuild_enabled() else 1


def one_group(kernel: Kernel) -> Kernel:
    """``kernel`` launched as one work-group (per stage). PoCL compiles the work-group
    function at the first launch and keys it by the local size, a zero global offset and a
    grid within 32 bits, not by the number of groups (its cache: ``4-1-1-goffs0-smallgrid``),
    so one group compiles what the measuring child's launch needs, without running the
    whole kernel on every core beside the other builders' compiles."""
    return dataclasses.replace(kernel, grid=(1, 1, 1), stages=tuple(
        dataclasses.replace(stage, grid=(1, 1, 1)) for stage in kernel.stages))


def warm(device: Device, request: MeasureRequest, launch: bool) -> tuple[int, str]:
    """Build ``request``'s kernel as the measuring child would and, with ``launch``, run
    one work-group of it (``one_group``) on the task's operands; (0, "") or the error
    number and why."""
    try:
        template, kernel = request_kernel(device, request)
        program = build_kernel(device, kernel)
        if launch:
            device.run(program, one_group(kernel),
                       operand_buffers(device, template, kernel, request))
        return 0, ""
    except TrialFailure as err:
        return int(err.error_no), str(err)
    except Exception as err:  # noqa: BLE001 - a launch that failed: the measurer says why
        return int(MeasureErrorNo.RUNTIME_DEVICE), f"{type(err).__name__}: {err}"
    finally:
        unload = getattr(device, "unload", None)
        if unload is not None:
            unload()


def source_size(device: Device, request: MeasureRequest
                ) -> tuple[str, int] | tuple[str, int, str]:
    """("sized", the length of ``request``'s kernel source), or ("done", error number,
    why) where its code generation fails (the build would fail alike). In a builder, not
    the worker: a template's code generation that hangs then costs only its deadline."""
    try:
        _template, kernel = request_kernel(device, request)
    except TrialFailure as err:
        return "done", int(err.error_no), str(err)
    return "sized", len(kernel.source)


@dataclass
class PrebuildReport:
    """What became of a batch: per request, "" (built) or why not ("error N: ..." where the
    builder met a trial's failure, "not built: ..." where it met none: a deadline, a crash)."""

    outcomes: list[str]
    builder_pids: set[int] = field(default_factory=set)
    seconds: float = 0.0

    @property
    def built(self) -> int:
        return sum(1 for o in self.outcomes if not o)


@dataclass
class _Builder:
    proc: subprocess.Popen[bytes]
    conn: Connection
    ready: bool = False
    job: int | None = None  # index of the request in hand
    deadline: float = 0.0


class BuildPool:
    """Builder processes for one device, kept between batches; :meth:`close` kills them."""

    def __init__(self, device_spec: str, extra_modules: tuple[str, ...] = (),
                 size: int | None = None) -> None:
        self._hello = (device_spec, extra_modules)
        self.size = size or default_builders()
        self._builders: list[_Builder] = []
        self._closed = False
        self._broken = ""  # why builders cannot work on this device, once one said so

    def prebuild(self, requests: Sequence[MeasureRequest],
                 stop: Callable[[], bool] | None = None,
                 settled: Callable[[int], None] | None = None,
                 largest_first: bool = False) -> PrebuildReport:
        """Build every request of the batch ahead, each within its own ``timeout_s``:
        in order, or with ``largest_first`` (a batch timed only once all of it is
        built) the largest kernel source first among those the builders have generated
        (a longest-first order: a long compile started last keeps the batch waiting
        while the other builders idle); its sizing and its build each get that deadline.
        Returns when all are done, failed or past their deadline (a builder past it is
        killed, with any compiler it runs), or when ``stop()`` turns true (builders
        still at work then are killed). ``settled(i)`` is called as request ``i``'s
        outcome is known."""
        began = time.time()
        self._closed = False
        outcomes: list[str | None] = [None] * len(requests)
        pending = list(range(len(requests)))  # to build
        # an order to choose only where there are more kernels than builders
        ranked = largest_first and len(requests) > self.size
        to_size = deque(pending if ranked else ())
        sizes: dict[int, int] = {}  # request -> its source's length, once generated

        def settle(index: int, outcome: str) -> None:
            outcomes[index] = outcome
            if index in pending:  # failed at its sizing: nothing to build
                pending.remove(index)
            if settled is not None:
                settled(index)

        def next_build() -> int | None:
            """In order, or the largest sized (the first of equals); None while the
            rest are being sized."""
            if not ranked:
                return pending.pop(0) if pending else None
            sized = [i for i in pending if i in sizes]
            if not sized:
                return None
            index = max(sized, key=lambda i: (sizes[i], -i))
            pending.remove(index)
            return index

        pids = {b.proc.pid for b in self._builders}
        if self._broken:  # a builder could not open the device: no use trying again
            return PrebuildReport([f"not built: {self._broken}"] * len(requests), pids)
        while len(self._builders) < min(self.size, len(requests)):
            self._add(pids)
        while not self._closed and (pending or any(b.job is not None for b in self._builders)):
            if stop is not None and stop():
                break
            for builder in self._builders:
                if not builder.ready or builder.job is not None:
                    continue
                if to_size:
                    self._hand(builder, to_size.popleft(), requests, sizing=True)
                elif (index := next_build()) is not None:
                    self._hand(builder, index, requests)
            now = time.time()
            for builder in list(self._builders):
                if builder.job is not None and now > builder.deadline:
                    settle(builder.job, f"not built: past its "
                                        f"{requests[builder.job].options.timeout_s:g} s")
                    self._replace(builder, bool(pending), pids)
                elif not builder.ready and now > builder.deadline:
                    self._retire(builder)  # never came up: the others go on
            if not self._builders:
                break
            self._wait_and_read(settle, sizes, pending, pids)
        for builder in list(self._builders):
            if builder.job is not None:  # stopped mid-build: its answer would name an
                self._retire(builder)    # index of this batch in the next one's outcomes
        why = ("stopped" if self._closed or (stop is not None and stop())
               else self._broken or "no builder process came up")
        return PrebuildReport([o if o is not None else f"not built: {why}" for o in outcomes],
                              pids, time.time() - began)

    def _hand(self, builder: _Builder, index: int, requests: Sequence[MeasureRequest],
              sizing: bool = False) -> None:
        request = requests[index]
        builder.job, builder.deadline = index, time.time() + request.options.timeout_s
        try:
            builder.conn.send(("size" if sizing else "build", request))
        except OSError:  # it died idle: read as its end below
            pass

    def _wait_and_read(self, settle: Callable[[int, str], None], sizes: dict[int, int],
                       pending: list[int], pids: set[int]) -> None:
        conns = {b.conn: b for b in self._builders}
        deadlines = [b.deadline for b in self._builders if b.job is not None or not b.ready]
        timeout = max(0.0, min([STEP_S, *(d - time.time() for d in deadlines)]))
        try:
            ready = wait(list(conns), timeout)
        except (OSError, ValueError):  # closed from another thread
            return
        for conn in ready:
            builder = conns[conn]  # type: ignore[index]
            try:
                kind, *payload = builder.conn.recv()
            except (EOFError, OSError):  # it died: a crash in the compiler or the launch
                if builder.job is None:  # at its start: starting another would too
                    self._retire(builder)
                    continue
                settle(builder.job, f"not built: the builder died (exit code "
                                    f"{builder.proc.poll()})")
                self._replace(builder, bool(pending), pids)
                continue
            if kind == "ready":
                builder.ready = True
            elif kind == "sized" and builder.job is not None:
                sizes[builder.job] = payload[0]
                builder.job = None
            elif kind == "done" and builder.job is not None:
                error_no, why = payload
                settle(builder.job, f"error {error_no}: {why}" if error_no else "")
                builder.job = None
                if error_no == MeasureErrorNo.RUNTIME_DEVICE:  # its device may be unusable
                    self._replace(builder, bool(pending), pids)
            else:  # "error": it could not open the device; no use starting another
                self._broken = str(payload[0]) if payload else "a builder failed to start"
                self._retire(builder)

    def _replace(self, builder: _Builder, work_left: bool, pids: set[int]) -> None:
        """Kill ``builder`` (its job is settled) and start another if work is left."""
        builder.job = None
        self._retire(builder)
        if work_left:
            self._add(pids)

    def _add(self, pids: set[int]) -> None:
        if not self._closed:
            proc, conn = spawn_child("compiler.runtime.prebuild", self._hello)
            self._builders.append(_Builder(proc, conn, deadline=time.time() + START_TIMEOUT_S))
            pids.add(proc.pid)

    def _retire(self, builder: _Builder) -> None:
        if builder in self._builders:
            self._builders.remove(builder)
        kill_group(builder.proc)
        builder.conn.close()

    def close(self) -> None:
        """Kill every builder (and any compiler it runs); safe from another thread."""
        self._closed = True
        builders, self._builders = self._builders, []
        for builder in builders:
            kill_group(builder.proc)
            builder.conn.close()


def _main() -> None:
    """A builder (``python -m compiler.runtime.prebuild FD``): open the device, then size
    or build the requests it is sent until the parent hangs up."""
    import importlib

    from compiler.runtime import open_device

    conn = child_connection()
    device_spec, extra_modules = conn.recv()
    for name in extra_modules:  # templates registered outside the library (tests)
        importlib.import_module(name)
    try:
        device: Any = open_device(device_spec)
    except Exception as err:  # noqa: BLE001 - reported; the parent stops using builders
        conn.send(("error", f"cannot open device: {err}"))
        return
    conn.send(("ready",))
    launch = is_cpu(device.info)  # PoCL compiles the work-group function at first launch
    with device:
        while True:
            try:
                kind, request = conn.recv()
            except EOFError:
                return
            conn.send(source_size(device, request) if kind == "size"
                      else ("done", *warm(device, request, launch)))


if __name__ == "__main__":
    _main()

"""Build, check against numpy, time: one trial, with AutoTVM's error numbers."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any, Protocol, runtime_checkable

import numpy as np

from compiler.runtime.device import (
    BuildError,
    Device,
    DeviceInfo,
    DeviceRuntimeError,
    LaunchLimitError,
    is_cpu,
)
from compiler.templates import (
    ConfigError,
    Epilogue,
    Kernel,
    Template,
    WorkloadError,
    get_template,
)
from compiler.templates.base import from_blocked
from schemas import Config, MeasureErrorNo, MeasureOptions, MeasureResult, Workload

# Launches timed back to back behind one hold at most: CUDA queues about a thousand
# pending launches before a launch blocks, and past that the host's launch rate, not
# the kernel, would set the time. More launches are timed in batches of this many.
MAX_TIMED_LAUNCHES = 1000


@dataclass(frozen=True)
class MeasureRequest:
    """Everything a (possibly remote, possibly child) process needs to run one trial."""

    template: str
    workload: Workload
    config: Config
    options: MeasureOptions = MeasureOptions()
    epilogue: Epilogue = Epilogue()
    seed: int = 0


def max_abs_error_ok(out: np.ndarray, ref: np.ndarray, options: MeasureOptions) -> tuple[bool, str]:
    """allclose with the absolute tolerance scaled to the output's magnitude.

    float32 sums of thousands of terms legitimately differ from a float64 reference by
    ~1e-6 of the largest partial sums; outputs that cancel to near zero would fail a
    pure relative test, so the absolute term is ``atol * max|ref|``.
    """
    if np.issubdtype(ref.dtype, np.integer):  # integer kernels are exact
        if out.shape == ref.shape and np.array_equal(out, ref):
            return True, ""
        bad = out != ref
        where = np.unravel_index(int(np.argmax(bad)), ref.shape)
        return False, (f"{int(bad.sum())} of {ref.size} outputs differ from numpy; first at "
                       f"{tuple(int(i) for i in where)}: got {out[where]!r}, expected "
                       f"{ref[where]!r}")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    atol = options.atol * max(scale, 1.0)
    if not np.all(np.isfinite(out)):
        return False, "output has NaN or Inf"
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    bad = diff > atol + options.rtol * np.abs(ref)
    if bad.any():
        where = np.unravel_index(int(np.argmax(diff)), ref.shape)
        return False, (f"{int(bad.sum())} of {ref.size} outputs differ from numpy; worst at "
                       f"{tuple(int(i) for i in where)}: got {out[where]!r}, expected {ref[where]!r}")
    return True, ""


@lru_cache(maxsize=4)
def task_operands(template_name: str, workload: Workload, epilogue: Epilogue,
              seed: int) -> tuple[list[np.ndarray], Callable[[], np.ndarray]]:
    """Inputs and (lazily) the numpy reference of a task, kept across its trials: the
    float64 reference of a large conv takes seconds, longer than building the kernel."""
    template = get_template(template_name)
    arrays = template.make_inputs(workload, epilogue, np.random.default_rng(seed))
    return arrays, lru_cache(maxsize=1)(lambda: template.reference(workload, arrays, epilogue))


@runtime_checkable
class _Unloads(Protocol):
    """A backend that keeps compiled modules and can drop them (OpenCL, CUDA)."""

    def unload(self) -> None: ...


def _fill_value(dtype: np.dtype[Any]) -> float | int:
    """What an output holds before the kernel runs: NaN, or for integers the value
    furthest from any real result, so an output the kernel skips never passes the check."""
    if np.issubdtype(dtype, np.floating):
        return float("nan")
    info = np.iinfo(dtype)
    return int(info.min) if info.min < 0 else int(info.max)


def measure(device: Device, request: MeasureRequest,
            on_stage: Callable[[str], None] | None = None) -> MeasureResult:
    """Run one trial on ``device``; every failure becomes a result, never an exception.

    Modules built for the trial are dropped after it (when the backend keeps them), so
    no trial runs on the state of another.
    """
    try:
        return _measure(device, request, on_stage or (lambda _s: None))
    finally:
        _unload(device)


def measure_group(device: Device, requests: Sequence[MeasureRequest],
                  on_stage: Callable[[tuple[int, str]], None] | None = None
                  ) -> list[MeasureResult | None]:
    """Trials timed side by side: each is built and checked, then their repeats are
    interleaved (a repeat of each in turn, the order turned by one every round), so a
    drift in the device's speed within seconds falls on every member alike and their
    costs compare. What a verification needs: timed one after another, two configs
    4-11% apart were ranked right 65 times in 80 on a VM whose speed moves within a
    second, interleaved 78 in 80 (``bench/verify_interleave.py``).

    A member that fails before it is timed (errors 1, 3 and 5) reports its failure. A
    device error (error 4) ends the group and leaves every member without such a
    failure None, itself included: the device may be unusable, and the error may be
    the group's (every member's buffers are alive at once), so each is measured alone,
    where an error is its own. ``on_stage`` hears (member, stage) before each step
    (build, run: the check, then each repeat), a deadline's cue.

    Members with cold weights share ``GROUP_COLD_BYTES`` of copies, ``COLD_BYTES`` each
    up to 4 members: with more, a member's launches come back to a copy sooner (after 32
    MiB of its own copies at 16 members, a cache's size here), though across its repeats
    every other member's launches pass in between.
    """
    stage = on_stage or (lambda _s: None)
    budget = min(COLD_BYTES, GROUP_COLD_BYTES // max(1, len(requests)))
    results: list[MeasureResult | None] = [None] * len(requests)
    ready: dict[int, ReadyTrial] = {}
    try:
        for i, request in enumerate(requests):
            began = time.time()
            try:
                ready[i] = ready_trial(device, request, partial(_staged, stage, i), budget)
            except TrialFailure as err:
                if err.error_no == MeasureErrorNo.RUNTIME_DEVICE:
                    return results
                results[i] = MeasureResult.failure(err.error_no, str(err),
                                                   all_cost=time.time() - began)
                continue
            ready[i].seconds = time.time() - began
        members = list(ready)
        for round_ in range(max((r.request.options.repeat for r in ready.values()), default=0)):
            shift = round_ % len(members)
            for i in members[shift:] + members[:shift]:
                if len(ready[i].costs) < ready[i].request.options.repeat:
                    stage((i, "run"))
                    try:
                        ready[i].repeat()
                    except TrialFailure:
                        return results
        for i, member in ready.items():
            results[i] = _result(member.costs, member.seconds)
        return results
    finally:
        _unload(device)


def _staged(stage: Callable[[tuple[int, str]], None], member: int, name: str) -> None:
    stage((member, name))


def _unload(device: Device) -> None:
    if isinstance(device, _Unloads):
        try:
            device.unload()
        except Exception:  # noqa: BLE001 - a dead context: the child is replaced anyway
            pass


class TrialFailure(Exception):
    """A trial that ends before it is timed, with the AutoTVM error number it reports."""

    def __init__(self, error_no: MeasureErrorNo, message: str) -> None:
        super().__init__(message)
        self.error_no = error_no


def request_kernel(device: Device, request: MeasureRequest) -> tuple[Template, Kernel]:
    """The kernel a trial runs on ``device``: the config decoded, checked against the
    device's limits and generated. One code path for measuring and for building ahead
    (``prebuild``); raises :class:`TrialFailure` (error 1)."""
    try:
        template: Template = get_template(request.template)
        template.decode(request.workload, request.config)
        problems = template.check_limits(request.workload, request.config, device.limits,
                                         device.dialect)
    except (KeyError, WorkloadError, ConfigError) as err:
        raise TrialFailure(MeasureErrorNo.INSTANTIATION_ERROR,
                           f"not a config of this space: {err}") from None
    except Exception as err:  # noqa: BLE001 - a template bug fails this config alone
        raise TrialFailure(MeasureErrorNo.INSTANTIATION_ERROR, _describe(err)) from None
    if problems:
        raise TrialFailure(MeasureErrorNo.INSTANTIATION_ERROR,
                           f"config does not fit {device.info.name}: " + "; ".join(problems))
    try:
        kernel = template.codegen(request.workload, request.config, device.dialect,
                                  request.epilogue,
                                  template.measure_io(request.workload, request.config))
    except (WorkloadError, ConfigError) as err:
        raise TrialFailure(MeasureErrorNo.INSTANTIATION_ERROR, str(err)) from None
    except Exception as err:  # noqa: BLE001
        raise TrialFailure(MeasureErrorNo.INSTANTIATION_ERROR, _describe(err)) from None
    return template, kernel


def build_kernel(device: Device, kernel: Kernel) -> Any:
    """``device.build(kernel)`` with its failures as error numbers (3, 1 or 4)."""
    try:
        return device.build(kernel)
    except BuildError as err:
        raise TrialFailure(MeasureErrorNo.COMPILE_DEVICE,
                           f"device compiler failed: {err}") from None
    except LaunchLimitError as err:
        raise TrialFailure(MeasureErrorNo.INSTANTIATION_ERROR,
                           f"config does not fit {device.info.name}: {err}") from None
    except DeviceRuntimeError as err:  # a multi-stage kernel's scratch did not fit
        raise TrialFailure(MeasureErrorNo.RUNTIME_DEVICE, str(err)) from None
    except Exception as err:  # noqa: BLE001 - module load or kernel lookup in the backend
        raise TrialFailure(MeasureErrorNo.RUNTIME_DEVICE,
                           f"loading the kernel failed: {_describe(err)}") from None


def operand_buffers(device: Device, template: Template, kernel: Kernel,
                    request: MeasureRequest) -> list[Any]:
    """The kernel's arguments on the device: the task's inputs (as the kernel takes them)
    and an output filled with a value no real result holds. Raises the backend's errors."""
    out = kernel.buffers[-1]
    arrays, _reference = task_operands(request.template, request.workload, request.epilogue,
                                       request.seed)
    io = template.measure_io(request.workload, request.config)
    buffers = [device.upload(a) for a in template.kernel_inputs(request.workload,
                                                                request.config, arrays, io)]
    out_buf = device.alloc(out.shape, out.dtype)
    dtype = np.dtype(out.dtype)
    device.write(out_buf, np.full(out.shape, _fill_value(dtype), dtype=dtype))
    buffers.append(out_buf)
    return buffers


def plain_output(template: Template, request: MeasureRequest, out: np.ndarray) -> np.ndarray:
    """A trial's output as the reference has it (NCHW), from the layout it was timed in
    (``Template.measure_io``)."""
    io = template.measure_io(request.workload, request.config)
    return from_blocked(out, io.out_block) if io is not None else out


def timed_layout(request: MeasureRequest) -> str | None:
    """The activations' layout a trial's kernel is timed in where its template has a
    choice (``Template.measure_io``), e.g. ``NCHW16c->NCHW64c``, as a record's info keeps
    it: records timed before trials took the build's layout have none, and their costs
    are of plain NCHW kernels. None also for a request that does not decode (its
    measurement reports why)."""
    try:
        io = get_template(request.template).measure_io(request.workload, request.config)
    except Exception:  # noqa: BLE001 - the measurement reports what is wrong with it
        return None
    if io is None:
        return None
    return "->".join(f"NCHW{b}c" if b else "NCHW" for b in (io.data_block, io.out_block))


# Bytes of input copies a trial with cold weights launches on in turn (4x a 32 MiB
# last-level cache: each copy is evicted before its next turn), and at most this many
# copies (a small weight's 128 copies may still fit a cache; its read costs little).
COLD_BYTES = 128 << 20
MAX_COLD_COPIES = 128
# A verification group (``measure_group``) holds its members' copies at once: they
# share this many bytes (a batch's 16 members would hold 2 GiB at COLD_BYTES each).
GROUP_COLD_BYTES = 4 * COLD_BYTES


def cold_weights(options: MeasureOptions, info: DeviceInfo | None) -> bool:
    """Whether a trial with ``options`` on the device of ``info`` is timed with cold
    weights (``enable_cpu_cache_flush`` on a CPU device), as its record's info says."""
    return options.enable_cpu_cache_flush and info is not None and is_cpu(info)


def cold_operands(device: Device, kernel: Kernel, buffers: list[Any],
                  budget: int | None = None) -> list[list[Any]]:
    """More operand sets for ``Device.time``'s ``rotate``: ``buffers`` with every input
    but the first (the data: the weight, and a bias or residual where fused) replaced by
    a copy of its own: ``budget`` (default ``COLD_BYTES``) of these inputs in all,
    ``buffers``' own counted (at most ``MAX_COLD_COPIES`` sets), so that a launch does
    not find them in the cache the launch before left them in (AutoTVM's
    ``enable_cpu_cache_flush`` flushes the same arguments; copies need no flush
    instruction). None (``[]``) where the inputs alone are the budget: no cache holds
    them."""
    budget = COLD_BYTES if budget is None else budget
    inputs = range(1, len(kernel.buffers) - 1)
    nbytes = sum(kernel.buffers[i].nbytes for i in inputs)
    copies = min(MAX_COLD_COPIES, math.ceil(budget / nbytes)) - 1 if nbytes else 0
    if copies <= 0:
        return []
    host = {i: device.download(buffers[i], kernel.buffers[i].shape, kernel.buffers[i].dtype)
            for i in inputs}
    return [[device.upload(host[i]) if i in host else b for i, b in enumerate(buffers)]
            for _ in range(copies)]


@dataclass
class ReadyTrial:
    """A trial built, checked and sized (launches a repeat), its repeats still to time.
    With ``rotation`` (cold weights) its launches take ``buffers`` and each set of it in
    turn, going on where the last repeat stopped."""

    request: MeasureRequest
    device: Device
    program: Any
    kernel: Kernel
    buffers: list[Any]
    number: int
    costs: list[float] = field(default_factory=list)
    seconds: float = 0.0  # spent on it so far (its all_cost)
    rotation: list[list[Any]] = field(default_factory=list)
    turn: int = 0

    def repeat(self) -> float:
        """Time one repeat (kept in ``costs``, and returned); a device error raises
        :class:`TrialFailure` (error 4)."""
        began = time.time()
        try:
            self.costs.append(_time(self.device, self.program, self.kernel,
                                    [self.buffers, *self.rotation], self.number, self.turn))
            self.turn += self.number
            return self.costs[-1]
        except Exception as err:  # noqa: BLE001 - as a failure of this trial
            raise _device_failure(err) from None
        finally:
            self.seconds += time.time() - began


def _device_failure(err: Exception) -> TrialFailure:
    what = str(err) if isinstance(err, DeviceRuntimeError) else _describe(err)
    return TrialFailure(MeasureErrorNo.RUNTIME_DEVICE, f"kernel failed on the device: {what}")


def ready_trial(device: Device, request: MeasureRequest,
                stage: Callable[[str], None] = lambda _s: None,
                cold_budget: int | None = None) -> ReadyTrial:
    """The trial's kernel built, run once and checked against numpy, and the launches a
    repeat takes (``number``, raised to last ``min_repeat_ms``); raises
    :class:`TrialFailure`: error 1, 3, 4 or 5 (a wrong answer). ``cold_budget``: the
    bytes of its cold copies (``cold_operands``)."""
    opts = request.options
    stage("build")
    template, kernel = request_kernel(device, request)
    program = build_kernel(device, kernel)
    stage("run")
    out = kernel.buffers[-1]
    try:
        buffers = operand_buffers(device, template, kernel, request)
        device.run(program, kernel, buffers)
        if opts.check_correctness:
            _arrays, reference = task_operands(request.template, request.workload,
                                               request.epilogue, request.seed)
            got = plain_output(template, request, device.download(buffers[-1], out.shape,
                                                                  out.dtype))
            ok, why = max_abs_error_ok(got, reference(), opts)
            if not ok:
                raise TrialFailure(MeasureErrorNo.WRONG_ANSWER, why)
        rotation = (cold_operands(device, kernel, buffers, cold_budget)
                    if cold_weights(opts, device.info) else [])
        # the operand set the next launch takes: the one the check (on set 0) and the
        # sizing launch left longest ago
        sets = len(rotation) + 1
        turn = 1 % sets
        number = opts.number
        floor_ms = max(opts.min_repeat_ms, device.min_repeat_ms)
        if floor_ms > 0:
            once = device.time(program, kernel, [buffers, *rotation][turn], 1)
            turn = 2 % sets
            number = max(number, math.ceil(floor_ms / 1e3 / max(once, 1e-9)))
    except TrialFailure:
        raise
    except Exception as err:  # noqa: BLE001 - allocation (out of memory), copies, launch
        raise _device_failure(err) from None
    return ReadyTrial(request, device, program, kernel, buffers, number, rotation=rotation,
                      turn=turn)


def _result(costs: list[float], seconds: float) -> MeasureResult:
    if len(costs) > 2:  # as AutoTVM: drop the fastest and slowest repeat
        costs = sorted(costs)[1:-1]
    return MeasureResult(costs=tuple(costs), error_no=MeasureErrorNo.NO_ERROR,
                         all_cost=seconds)


def _measure(device: Device, request: MeasureRequest,
             stage: Callable[[str], None]) -> MeasureResult:
    start = time.time()
    try:
        ready = ready_trial(device, request, stage)
        for _ in range(request.options.repeat):
            ready.repeat()
    except TrialFailure as err:
        return MeasureResult.failure(err.error_no, str(err), all_cost=time.time() - start)
    return _result(ready.costs, time.time() - start)


def _time(device: Device, program: Any, kernel: Any, sets: list[list[Any]],
          number: int, turn: int = 0) -> float:
    """Seconds per launch over ``number`` launches on the operand ``sets`` in turn, from
    set ``turn`` on, timed in batches of at most ``MAX_TIMED_LAUNCHES`` (each behind its
    own hold): device time over launches."""
    total, left = 0.0, number
    while left:
        batch = min(left, MAX_TIMED_LAUNCHES)
        at = (turn + number - left) % len(sets)
        turned = sets[at:] + sets[:at]
        total += device.time(program, kernel, turned[0], batch, turned[1:]) * batch
        left -= batch
    return total / number


def _describe(err: BaseException) -> str:
    """The exception's type and message: backend errors often say little without it."""
    return f"{type(err).__name__}: {err}"

"""Run a compiled graph on one device: every kernel built once, constants uploaded once,
intermediates in a pool of device buffers reused as soon as their last reader has run.

``compiler/build_module.py`` lowers a graph to a ``Program`` (typed value ids, one ``Step`` per
kernel launch); ``GraphExecutor`` runs it, times it as a whole (TVM's time_evaluator:
warm-up, ``number`` runs per repeat, one cost per repeat) and per step.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir import TensorType
from compiler.runtime.device import BuildError, Device, LaunchLimitError
from compiler.templates import Kernel


@dataclass(frozen=True)
class Step:
    """One kernel launch: ``args`` are value ids, one per ``kernel.buffers`` entry."""

    name: str
    kernel: Kernel
    args: tuple[int, ...]


@dataclass
class Program:
    """What ``compiler/build_module.py`` hands the executor."""

    values: list[TensorType]
    inputs: list[tuple[str, int]]
    outputs: list[int]
    constants: dict[int, np.ndarray]
    steps: list[Step]
    # value id -> value id whose storage it shares (reshape / flatten: no copy)
    aliases: dict[int, int] = field(default_factory=dict)
    # value id -> channel block b of a value stored in NCHW[b]c (its type stays NCHW;
    # only the template kernels that write and read it know); absent: plain NCHW
    blocks: dict[int, int] = field(default_factory=dict)
    # value id (a part) -> (value id of a whole, element offset): the part is stored in
    # the whole's storage from that element on, so the step writing the part writes its
    # slice of the whole in place (a concatenation without a copy). A whole has no step
    # of its own: its parts tile it exactly, and it is defined once they all are.
    views: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchmarkResult:
    """Whole-graph latency, seconds per run, one cost per repeat."""

    costs: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.costs)

    @property
    def median(self) -> float:
        return statistics.median(self.costs)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.costs)


@dataclass(frozen=True)
class StepTime:
    """One step's device time per run and its share of all steps' time."""

    name: str
    seconds: float
    share: float


@dataclass(frozen=True)
class StoragePlan:
    """Where each value lives: ``slot[root value] = pool index``; pinned values (graph
    inputs, constants, outputs) own their storage and are not in ``slot``."""

    slot: dict[int, int]
    pool_bytes: tuple[int, ...]


class GraphExecutor:
    """A ``Program`` made ready to run on ``device``."""

    def __init__(self, program: Program, device: Device) -> None:
        self.program = program
        self.device = device
        _check_ids(program)
        self._place = [place(program, v) for v in range(len(program.values))]
        self._root = [r for r, _ in self._place]
        self._check()
        self._pinned = pinned_roots(program)
        kernels = self._build_all(program.steps)
        self.plan = plan_storage(program)
        pool = [device.alloc_bytes(n) for n in self.plan.pool_bytes]
        storage: dict[int, Any] = {}
        for vid, array in program.constants.items():
            # an empty tensor (a zero-size slice, say) has storage but nothing to copy
            storage[self._root[vid]] = (
                device.upload(np.ascontiguousarray(array, program.values[vid].dtype))
                if program.values[vid].size else device.alloc_bytes(0))
        for root in self._pinned - set(storage):
            storage[root] = device.alloc_bytes(program.values[root].nbytes)
        for root, index in self.plan.slot.items():
            storage[root] = pool[index]
        self._storage = storage
        self._views: dict[tuple[int, int, int], Any] = {}
        # every run makes the same launches: their sizes and argument handles once
        self._launches = [device.prepare(built, step.kernel, [self._buffer(v) for v in step.args])
                          for built, step in zip(kernels, program.steps)]
        self._inputs_set = not program.inputs

    def _buffer(self, vid: int) -> Any:
        """The device buffer value ``vid`` lives in: its root's storage, or a view of it
        from the value's byte offset (one view object per distinct slice)."""
        root, offset = self._place[vid]
        if not offset:
            return self._storage[root]
        key = (root, offset, self.program.values[vid].nbytes)
        if key not in self._views:
            self._views[key] = self.device.view(self._storage[root], offset, key[2])
        return self._views[key]

    # ---- setup

    def _check(self) -> None:
        """Arguments fit their kernels; every value is written once, before it is read."""
        p = self.program
        count = len(p.values)
        self._check_views()
        base = [_root(p.aliases, v) for v in range(count)]  # the value an alias reads
        parts: dict[int, list[int]] = {}
        for part, (whole, _) in p.views.items():
            parts.setdefault(whole, []).append(part)

        def define(vid: int) -> None:
            """``vid`` is now written; so is every whole whose last part it completes."""
            defined.add(vid)
            while vid in p.views:
                vid = base[p.views[vid][0]]
                if vid in defined or not all(base[q] in defined for q in parts[vid]):
                    return
                defined.add(vid)

        defined = {base[v] for _, v in p.inputs} | {base[v] for v in p.constants}
        for step in p.steps:
            if len(step.args) != len(step.kernel.buffers):
                raise ValueError(f"step {step.name}: {len(step.args)} arguments for "
                                 f"{len(step.kernel.buffers)} kernel buffers")
            if step.kernel.dialect != self.device.dialect:
                raise ValueError(f"step {step.name}: a {step.kernel.dialect} kernel on a "
                                 f"{self.device.dialect} device")
            written = []
            for vid, buf in zip(step.args, step.kernel.buffers):
                if p.values[vid].size != math.prod(buf.shape):
                    raise ValueError(f"step {step.name}: value {vid} of type "
                                     f"{p.values[vid]} for buffer {buf.name} {list(buf.shape)}")
                if buf.role == "out":
                    written.append(base[vid])
                elif base[vid] not in defined:
                    raise ValueError(f"step {step.name}: reads value {vid} before any step "
                                     "writes it")
            for vid in written:
                if vid in defined or vid in parts:
                    raise ValueError(f"step {step.name}: value {vid} is already an input, "
                                     "a constant, another step's result or made of parts")
                define(vid)
        missing = [v for v in p.outputs if base[v] not in defined]
        if missing:
            raise ValueError(f"output value(s) {missing} are never computed")

    def _check_views(self) -> None:
        """Each whole's parts tile it exactly (same dtype, in bounds, no overlap, no
        gap) and at offsets the device can view; no input or constant is a part or a
        whole (their storage is their own), nor an alias (a view is of a value)."""
        p = self.program
        own = {v for _, v in p.inputs} | set(p.constants) | set(p.aliases)
        tiles: dict[int, list[tuple[int, int]]] = {}
        for part, (whole, offset) in p.views.items():
            if part in own or whole in own:
                raise ValueError(f"view of value {part} in value {whole}: inputs, constants "
                                 "and aliases cannot be parts or wholes")
            a, b = p.values[part], p.values[whole]
            if a.dtype != b.dtype or offset < 0 or offset + a.size > b.size:
                raise ValueError(f"value {part} ({a}) at element {offset} does not fit in "
                                 f"value {whole} ({b})")
            tiles.setdefault(whole, []).append((offset, a.size))
        for whole, spans in tiles.items():
            end = 0
            for offset, size in sorted(spans):
                if offset != end:
                    raise ValueError(f"the parts of value {whole} overlap or leave a gap at "
                                     f"element {min(offset, end)}")
                end = offset + size
            if end != p.values[whole].size:
                raise ValueError(f"the parts of value {whole} cover {end} of its "
                                 f"{p.values[whole].size} elements")
        align, spec = self.device.view_align, self.device.info.spec
        for vid, (_, offset) in enumerate(self._place):
            if offset and not align:
                raise ValueError(f"value {vid} lies at byte {offset} of its storage: "
                                 f"{spec} makes no buffer views")
            if offset and offset % align:
                raise ValueError(f"value {vid} lies at byte {offset} of its storage: "
                                 f"{spec} views only at multiples of {align} bytes")

    def _build_all(self, steps: Sequence[Step]) -> list[Any]:
        """Each distinct source once, on a few threads: device compilers (PoCL's LLVM,
        nvcc) release the GIL, and a DenseNet has ~300 distinct kernels."""
        first: dict[str, Step] = {}
        for step in steps:
            first.setdefault(step.kernel.source, step)
        workers = max(1, min(len(first), os.cpu_count() or 1, 8))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            built = dict(zip(first, pool.map(self._build, first.values())))
        return [built[step.kernel.source] for step in steps]

    def _build(self, step: Step) -> Any:
        try:
            return self.device.build(step.kernel)
        except BuildError as err:
            raise BuildError(f"step {step.name}: {err}") from None
        except LaunchLimitError as err:
            raise LaunchLimitError(f"step {step.name}: {err}") from None

    @property
    def planned_bytes(self) -> int:
        """Device bytes this executor holds: the pool plus inputs, constants and outputs."""
        return sum(self.plan.pool_bytes) + sum(self.program.values[r].nbytes
                                               for r in self._pinned)

    @property
    def naive_bytes(self) -> int:
        """Device bytes with one buffer per value (aliases still share theirs)."""
        used = self._pinned | {self._root[v] for s in self.program.steps for v in s.args}
        return sum(self.program.values[r].nbytes for r in used)

    # ---- running

    def set_inputs(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> None:
        """Check every graph input (given by name, or in order), then copy them over."""
        names = self.program.inputs
        if isinstance(inputs, Mapping):
            missing = [n for n, _ in names if n not in inputs]
            if missing:
                raise ValueError(f"missing input(s): {', '.join(missing)}")
            given = [inputs[n] for n, _ in names]
        else:
            if len(inputs) != len(names):
                raise ValueError(f"the graph takes {len(names)} input(s), got {len(inputs)}")
            given = list(inputs)
        arrays = []
        for (name, vid), array in zip(names, given):
            ty = self.program.values[vid]
            array = np.asarray(array)
            if tuple(array.shape) != ty.shape:
                raise ValueError(f"input {name}: shape {list(array.shape)}, expected "
                                 f"{list(ty.shape)}")
            arrays.append(np.ascontiguousarray(array, dtype=ty.dtype))
        for (_, vid), array in zip(names, arrays):
            if array.size:
                self.device.write(self._buffer(vid), array)
        self._inputs_set = True

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> list[np.ndarray]:
        """Outputs of one run, in ``program.outputs`` order."""
        self.set_inputs(inputs)
        self._launch_all()
        self.device.synchronize()
        return [self._download(v) for v in self.program.outputs]

    def _download(self, vid: int) -> np.ndarray:
        ty = self.program.values[vid]
        if not ty.size:
            return np.empty(ty.shape, ty.dtype)
        return self.device.download(self._buffer(vid), ty.shape, ty.dtype)

    def _launch_all(self, timed: bool = False) -> list[Any]:
        return [launch(timed) for launch in self._launches]

    def _seconds_per_run(self, number: int) -> float:
        """``number`` back-to-back runs, timed from the first launch's start to the last
        one's end (only those two launches carry events)."""
        first = last = None
        count = len(self._launches)
        for run in range(number):
            for k, launch in enumerate(self._launches):
                opens = run == 0 and k == 0
                closes = run == number - 1 and k == count - 1
                handle = launch(opens or closes)
                first = handle if opens else first
                last = handle if closes else last
        return self.device.elapsed(first, last) / number

    def _require_inputs(self, what: str) -> None:
        """Timing needs defined inputs, not their values: without ``set_inputs`` (or a
        run) the graph is timed on seeded uniform [0, 1) inputs."""
        if not self._inputs_set:
            rng = np.random.default_rng(0)
            self.set_inputs([rng.uniform(0, 1, size=self.program.values[vid].shape)
                             for _, vid in self.program.inputs])
        if not self.program.steps:
            raise RuntimeError(f"{what}: the program has no steps to time")

    def benchmark(self, number: int = 10, repeat: int = 3,
                  min_repeat_ms: float = 0.0) -> BenchmarkResult:
        """Whole-graph seconds per run, as TVM's time_evaluator: a warm-up run, then
        ``repeat`` costs of ``number`` runs each; ``number`` grows until one repeat
        lasts at least ``min_repeat_ms``."""
        self._require_inputs("benchmark")
        if number < 1 or repeat < 1:
            raise ValueError(f"benchmark: number ({number}) and repeat ({repeat}) must be >= 1")
        once = self._seconds_per_run(1)
        if min_repeat_ms > 0:
            number = max(number, math.ceil(min_repeat_ms / 1e3 / max(once, 1e-9)))
        costs = tuple(self._seconds_per_run(number) for _ in range(repeat))
        return BenchmarkResult(costs)

    def profile(self, number: int = 3) -> list[StepTime]:
        """Device seconds per step (mean of ``number`` runs with every launch timed,
        after a warm-up run), in program order: what a "slowest layers" report sorts."""
        self._require_inputs("profile")
        self._launch_all()
        totals = [0.0] * len(self.program.steps)
        for _ in range(number):
            for k, handle in enumerate(self._launch_all(timed=True)):
                totals[k] += self.device.elapsed(handle)
        total = sum(totals) or 1.0
        return [StepTime(step.name, t / number, t / total)
                for step, t in zip(self.program.steps, totals)]


def _check_ids(p: Program) -> None:
    """Every value id the program names is one of its values."""
    count = len(p.values)
    for vid in (*(v for _, v in p.inputs), *p.outputs, *p.constants, *p.aliases,
                *p.aliases.values(), *p.views, *(w for w, _ in p.views.values()),
                *(a for s in p.steps for a in s.args)):
        if not 0 <= vid < count:
            raise ValueError(f"value id {vid} is not one of the program's {count} values")


def _root(aliases: Mapping[int, int], vid: int) -> int:
    seen = {vid}
    while vid in aliases:
        vid = aliases[vid]
        if vid in seen:
            raise ValueError(f"value {vid} aliases itself through a cycle")
        seen.add(vid)
    return vid


def place(program: Program, vid: int) -> tuple[int, int]:
    """(root, byte offset): the value whose storage ``vid`` lives in, through aliases
    (same storage) and views (a slice of a whole's), and where in it ``vid`` starts."""
    offset, seen = 0, {vid}
    while True:
        if vid in program.aliases:
            vid = program.aliases[vid]
        elif vid in program.views:
            whole, elements = program.views[vid]
            offset += elements * np.dtype(program.values[vid].dtype).itemsize
            vid = whole
        else:
            return vid, offset
        if vid in seen:
            raise ValueError(f"value {vid} lies in itself through a cycle of aliases/views")
        seen.add(vid)


def pinned_roots(program: Program) -> set[int]:
    """Storage the pool never hands out: graph inputs, constants and outputs."""
    return {place(program, v)[0]
            for v in (*(v for _, v in program.inputs), *program.constants, *program.outputs)}


def plan_storage(program: Program) -> StoragePlan:
    """Greedy liveness-based sharing: walking the steps in order, the first step that
    writes a value (or any part of it, ``Program.views``) takes for it the smallest free
    pool buffer it fits (a new one if none does), and the buffer goes back to the pool
    after the last step that reads or writes the value, an alias or a part of it (right
    after its own step if nothing reads it). Assumes each value is written once."""
    root = [place(program, v)[0] for v in range(len(program.values))]
    pinned = pinned_roots(program)
    last_read: dict[int, int] = {}  # last step that touches each root
    for k, step in enumerate(program.steps):
        for vid in step.args:
            last_read[root[vid]] = k
    slot: dict[int, int] = {}
    sizes: list[int] = []
    free: list[int] = []
    for k, step in enumerate(program.steps):
        for vid, buf in zip(step.args, step.kernel.buffers):
            r = root[vid]
            if buf.role != "out" or r in pinned or r in slot:
                continue
            need = program.values[r].nbytes
            fits = [i for i in free if sizes[i] >= need]
            if fits:
                slot[r] = min(fits, key=lambda i: sizes[i])
                free.remove(slot[r])
            else:
                slot[r] = len(sizes)
                sizes.append(need)
        # the output was placed first, so it never shares with this step's own operands
        for r in {root[v] for v in step.args}:
            if r in slot and last_read.get(r, k) == k:
                free.append(slot[r])
    return StoragePlan(slot, tuple(sizes))


__all__ = ["BenchmarkResult", "GraphExecutor", "Program", "Step", "StepTime", "StoragePlan",
           "pinned_roots", "place", "plan_storage"]

"""Graph-level layout tuning (issue 17, point 3), as AutoTVM's graph tuner does for x86.

Each CPU conv's config fixes the channel blocks it reads its data in fastest (``ic_bn``)
and writes its output in (``oc_bn``: the build stores a blocked layer's output in it,
``build_module.plan_layouts``). Our blocked templates read any data block (scalar loads:
no layout_transform op is ever inserted), but a data block other than the one a config
was built around changes its index math and cache walk, and a residual blocked other
than oc_bn is read through a pointer per vector (lane by lane where vec does not divide
its block: ``IOLayout.residual_vectors``). Taking each layer's
fastest record alone (``select_layers``) ignores that; this module chooses one record
per layer minimising, over the whole graph,

    sum of layer costs (the records' measured seconds)
    + for each blocked value a layer reads (data or residual) in a block other than
      its config's own: the measured extra seconds of that read (``ReadCosts``: the
      layer's kernel timed reading that block against reading its own, in
      interleaved rounds, cached per (device, workload, config, epilogue, both
      layouts, both kernels' source) in a JSON file).

States of a layer are its ``Option``s: the best record of each distinct layout
(template, data block, output block) of this device's records, the ``top_k`` cheapest
layouts. The solve (``solve``) is exact dynamic programming over the data edges (each
conv reads its data from one producer, so those edges form a forest: a bottom-up pass
of min-sums, then a top-down pass picking states), as TVM's DPTuner runs over its
stages; a layer's second blocked input, a fused residual (ResNet's shortcut, a
multi-input node), is handled as TVM's fallback for such nodes: greedily, by sweeps of
each layer's best state given all others (iterated conditional modes) until none
changes, starting from the DP's answer, so the total never rises above it.

Sits in ``compiler/`` beside ``build_module`` (which calls it) and ``tasks``: it reads
records (``compiler.records``), templates and, to measure read costs, the runtime;
nothing below it imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler.ir import Graph, Node
from compiler.ir.ops import node_epilogue
from compiler.kernels import BLOCKED_POOLS
from compiler.records import THIS_DEVICE, Candidate, Choice, RecordSource, rank
from compiler.runtime.child import cache_home
from compiler.runtime.device import Device
from compiler.runtime.measure import max_abs_error_ok
from compiler.tasks import candidates
from compiler.templates import Epilogue, IOLayout, get_template
from compiler.templates.base import Kernel, from_blocked, to_blocked
from compiler.templates.history import problem
from schemas import DeviceLimits, MeasureOptions, Target
from schemas.record import timed_cold

log = logging.getLogger(__name__)

DATA, RESIDUAL = "data", "residual"
CACHE_ENV = "TUNER_LAYOUT_CACHE"  # the read-cost cache file
DEFAULT_TOP_K = 3
# A read cost: both kernels timed for at least this long per round, this many rounds.
READ_REPEAT_MS, READ_ROUNDS = 20.0, 7


def data_block(choice: Choice, channels: int) -> int:
    """The channel block a blocked layer reads its data in fastest: its config's ic_bn
    (AutoTVM's ``tile_ic`` split, inner factor), else the widest of 16, 8, 4, 2 that
    divides ``channels``."""
    values = get_template(choice.workload.template).decode(choice.workload, choice.config)
    tile = values.get("tile_ic")
    if isinstance(tile, (tuple, list)) and tile:
        return int(tile[-1])
    return next((b for b in (16, 8, 4, 2) if channels % b == 0), 0)


def timed_block(choice: Choice) -> int:
    """The data block the layer's record was timed reading (``Template.measure_io``; 0:
    plain): its cost is for that block, so a read penalty is measured against it."""
    template = get_template(choice.workload.template)
    io = template.measure_io(choice.workload, choice.config)
    return io.data_block if io is not None else 0


@dataclass(frozen=True)
class Option:
    """One state of a layer: a record's choice, its measured seconds and its layout."""

    choice: Choice
    cost: float
    in_block: int  # the data block its record was timed reading (``timed_block``)
    out_block: int  # the block it writes (and reads a residual in fastest)


@dataclass(frozen=True)
class Edge:
    """Layer ``consumer`` reads layer ``producer``'s blocked output as its ``slot``."""

    producer: int
    consumer: int
    slot: str  # DATA or RESIDUAL


# (layer, option index, slot, block read) -> extra seconds against its own block
Penalty = Callable[[int, int, str, int], float]


@dataclass
class Problem:
    """Layers (in topological order) with their options, the blocked edges between
    them, and the fixed block of each input read from outside the tuned layers
    (``fixed[(layer, slot)]``: 0 is plain NCHW)."""

    options: list[list[Option]]
    edges: list[Edge]
    fixed: dict[tuple[int, str], int] = field(default_factory=dict)

    def total(self, states: Sequence[int], penalty: Penalty) -> float:
        """Seconds the model predicts for one state per layer."""
        cost = sum(self.options[v][s].cost for v, s in enumerate(states))
        for e in self.edges:
            block = self.options[e.producer][states[e.producer]].out_block
            cost += penalty(e.consumer, states[e.consumer], e.slot, block)
        for (v, slot), block in self.fixed.items():
            cost += penalty(v, states[v], slot, block)
        return cost


def solve(problem: Problem, penalty: Penalty, max_sweeps: int = 20) -> list[int]:
    """One option index per layer: exact DP over the data-edge forest (with the fixed
    inputs' penalties), then greedy sweeps that also count the residual edges."""
    n = len(problem.options)
    unary = [[opt.cost for opt in opts] for opts in problem.options]
    for (v, slot), block in problem.fixed.items():
        for s in range(len(unary[v])):
            unary[v][s] += penalty(v, s, slot, block)
    children: list[list[int]] = [[] for _ in range(n)]
    has_parent = [False] * n
    for e in problem.edges:
        if e.slot == DATA:
            if has_parent[e.consumer] or e.producer >= e.consumer:
                raise ValueError(f"layer {e.consumer}: a second data producer, or layers "
                                 "not in topological order")
            children[e.producer].append(e.consumer)
            has_parent[e.consumer] = True
    # bottom-up: best[v][s] = unary + sum over data children of min_t (read + best[c][t])
    best = [list(u) for u in unary]
    pick: dict[tuple[int, int, int], int] = {}  # (parent, parent state, child) -> child state
    for v in reversed(range(n)):
        for s, opt in enumerate(problem.options[v]):
            for c in children[v]:
                costs = [penalty(c, t, DATA, opt.out_block) + best[c][t]
                         for t in range(len(best[c]))]
                t = min(range(len(costs)), key=costs.__getitem__)
                pick[(v, s, c)] = t
                best[v][s] += costs[t]
    states = [-1] * n
    for v in range(n):  # top-down: roots take their best state, children what it picked
        if not has_parent[v]:
            states[v] = min(range(len(best[v])), key=best[v].__getitem__)
        for c in children[v]:
            states[c] = pick[(v, states[v], c)]
    return _sweep(problem, penalty, states, max_sweeps)


def _sweep(problem: Problem, penalty: Penalty, states: list[int], max_sweeps: int) -> list[int]:
    """Iterated conditional modes: each layer in turn takes the state that minimises the
    total given every other layer's, until a sweep changes nothing. Never raises the
    total, so the DP's answer is kept where the residual edges change nothing."""
    touching: list[list[Edge]] = [[] for _ in problem.options]
    for e in problem.edges:
        touching[e.producer].append(e)
        touching[e.consumer].append(e)
    for _ in range(max_sweeps):
        changed = False
        for v, opts in enumerate(problem.options):
            def local(s: int, v: int = v) -> float:
                trial = list(states)
                trial[v] = s
                cost = opts[s].cost + sum(penalty(v, s, slot, block)
                                          for (w, slot), block in problem.fixed.items()
                                          if w == v)
                for e in touching[v]:
                    block = problem.options[e.producer][trial[e.producer]].out_block
                    cost += penalty(e.consumer, trial[e.consumer], e.slot, block)
                return cost

            costs = [local(s) for s in range(len(opts))]
            s = min(range(len(costs)), key=costs.__getitem__)
            if costs[s] < costs[states[v]] - 1e-15:
                states[v], changed = s, True
        if not changed:
            break
    return states


def layer_options(nodes: Sequence[Node], source: RecordSource | None, target: Target,
                  limits: DeviceLimits, top_k: int = DEFAULT_TOP_K) -> list[list[Option]]:
    """Per node, the best record (ApplyHistoryBest's order, configs that decode and fit)
    of each distinct layout among this device's records of its blocked-io candidates,
    the ``top_k`` cheapest layouts, cheapest first (of the records timed with cold weights
    only, where a layer has any); empty where it has none."""
    per_node = [[w for w in candidates(node, target) if get_template(w.template).blocked_io]
                for node in nodes]
    found = source.candidates([w for ws in per_node for w in ws], target) if source else []
    by_key: dict[str, list[Candidate]] = {}
    for cand in found:
        by_key.setdefault(cand.record.workload.key, []).append(cand)
    out: list[list[Option]] = []
    for node, workloads in zip(nodes, per_node):
        layouts: dict[tuple[str, int, int], Option] = {}
        for wl in workloads:
            template = get_template(wl.template)
            for ranked in rank(by_key.get(wl.key, []), target):
                record = ranked.item.record
                if ranked.source != THIS_DEVICE or problem(wl, record.config, limits):
                    continue
                choice = Choice(wl, template.name, record.config, THIS_DEVICE, record,
                                ranked.item.origin, None)
                key = (template.name, timed_block(choice),
                       template.out_block(wl, record.config))
                if key not in layouts:
                    layouts[key] = Option(choice, record.result.mean_cost, key[1], key[2])
        # costs timed with cold weights and warm ones do not compare (``history``): where
        # a layer has cold options, its warm ones are left out
        options = list(layouts.values())
        cold = [o for o in options
                if o.choice.record is not None and timed_cold(o.choice.record.info)]
        out.append(sorted(cold or options, key=lambda o: o.cost)[:top_k])
    return out


def default_cache() -> Path:
    """Where read costs are kept between builds: ``$TUNER_LAYOUT_CACHE``, else
    ``layout_costs.json`` in the project's cache folder (beside the kernel cache)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return cache_home() / "layout_costs.json"


def _load(cache: Path) -> dict[str, float]:
    """The read costs stored in ``cache``; none (with a warning) when it is missing,
    partly written or not ours: a cache is never a reason for a build to fail."""
    try:
        data = json.loads(cache.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("%s: unreadable layout read costs, measured again (%s: %s)",
                    cache, type(err).__name__, err)
        return {}
    if not isinstance(data, dict):
        log.warning("%s: not a layout read-cost cache, measured again", cache)
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}


class ReadCosts:
    """The measured extra seconds of a layer reading a blocked input in a block other
    than its config's own: its kernel (with the layer's epilogue, output in oc_bn)
    reading that block and reading its own, each checked against numpy, then timed in
    ``READ_ROUNDS`` interleaved rounds (alternating which goes first); the penalty is the
    median of the rounds' differences, never negative (the kernels are otherwise the
    same: a faster mismatched read is noise). Paired rounds, not two separate minima:
    on a loaded machine two minima differ by more than most reads cost. Kept per
    (device, workload, config, epilogue, both layouts, and a hash of both kernels'
    generated source and launch, so a codegen change measures again) in ``cache`` (a
    JSON file; None: memory only), so a rebuild measures nothing again. Each save merges
    with what the file holds then (other builds write it too) and replaces it whole."""

    def __init__(self, device: Device, cache: Path | None = None,
                 options: MeasureOptions = MeasureOptions()) -> None:
        self.device, self.cache, self.options = device, cache, options
        self.measured = 0  # pairs timed (not found in the cache) by this object
        self._seconds: dict[str, float] = _load(cache) if cache is not None else {}
        # generated kernels by (workload, config, epilogue, layout): an option's own one
        # serves every block it is asked about (codegen takes milliseconds)
        self._kernels: dict[str, Kernel] = {}

    def penalty(self, option: Option, epilogue: Epilogue, slot: str, block: int) -> float:
        """Extra seconds of reading ``slot`` in ``block`` (0: plain) instead of the
        option's own block."""
        own = IOLayout(option.in_block, option.out_block,
                       option.out_block if "add" in epilogue.ops else 0)
        if slot == DATA:
            other = IOLayout(block, own.out_block, own.residual_block)
        else:
            other = IOLayout(own.data_block, own.out_block, block)
        if other == own:
            return 0.0
        choice = option.choice
        kernels = (self._kernel(choice, epilogue, own), self._kernel(choice, epilogue, other))
        key = json.dumps([str(self.device.target), self.device.info.name,
                          choice.workload.key, choice.config.model_dump_json(),
                          list(epilogue.ops), _io(own), _io(other), _source_hash(kernels)])
        if key not in self._seconds:
            self._seconds[key] = self._paired(choice, epilogue, (own, other), kernels)
            self.measured += 1
            self._save()
        return self._seconds[key]

    def _kernel(self, choice: Choice, epilogue: Epilogue, io: IOLayout) -> Kernel:
        """The option's kernel generated with ``io``: what a cached cost was timed on."""
        wl, config = choice.workload, choice.config
        key = json.dumps([wl.key, config.model_dump_json(), repr(epilogue), _io(io)])
        if key not in self._kernels:
            self._kernels[key] = get_template(wl.template).codegen(
                wl, config, self.device.dialect, epilogue, io)
        return self._kernels[key]

    def _paired(self, choice: Choice, epilogue: Epilogue, ios: tuple[IOLayout, IOLayout],
                kernels: tuple[Kernel, Kernel]) -> float:
        runs = [self._prepare(choice, epilogue, io, kernel) for io, kernel in zip(ios, kernels)]
        once = self.device.time(*runs[0], 1)
        number = max(1, math.ceil(READ_REPEAT_MS / 1e3 / max(once, 1e-9)))
        diffs = []
        for r in range(READ_ROUNDS):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            t = {i: self.device.time(*runs[i], number) for i in order}
            diffs.append(t[1] - t[0])
        return max(0.0, float(np.median(diffs)))

    def _prepare(self, choice: Choice, epilogue: Epilogue, io: IOLayout,
                 kernel: Kernel) -> tuple[Any, Kernel, list[Any]]:
        """(program, kernel, buffers) of the option's ``kernel`` (generated with ``io``),
        run once and its output checked against numpy."""
        device, wl, config = self.device, choice.workload, choice.config
        template = get_template(wl.template)
        arrays = template.make_inputs(wl, epilogue, np.random.default_rng(0))
        inputs = template.kernel_inputs(wl, config, arrays)
        inputs[0] = to_blocked(inputs[0], io.data_block)
        if "add" in epilogue.ops:
            inputs[-1] = to_blocked(inputs[-1], io.residual_block)
        program = device.build(kernel)
        out_spec = kernel.buffers[-1]
        buffers = [device.upload(np.ascontiguousarray(a)) for a in inputs]
        out = device.alloc(out_spec.shape, out_spec.dtype)
        buffers.append(out)
        device.run(program, kernel, buffers)
        got = from_blocked(device.download(out, out_spec.shape, out_spec.dtype), io.out_block)
        ok, why = max_abs_error_ok(got, template.reference(wl, arrays, epilogue), self.options)
        if not ok:
            raise RuntimeError(f"{wl.template} {io}: the kernel is wrong: {why}")
        return program, kernel, buffers

    def _save(self) -> None:
        """Write the costs known here merged with those in the file now, through a temp
        file of this process's own in the same folder and one rename: a concurrent
        build's entries are kept, and a reader never sees a partial file. (Two saves at
        the same moment may still drop each other's newest entry: measured again later.)"""
        if self.cache is None:
            return
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        self._seconds = {**_load(self.cache), **self._seconds}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.cache.name}.", suffix=".tmp",
                                   dir=self.cache.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self._seconds, f, indent=0)
            os.replace(tmp, self.cache)
        except BaseException:
            os.unlink(tmp)
            raise


def _io(io: IOLayout) -> list[int]:
    return [io.data_block, io.out_block, io.residual_block]


def _source_hash(kernels: Sequence[Kernel]) -> str:
    """What the kernels run (source, entry, launch): a read cost is valid while it holds."""
    text = json.dumps([[k.source, k.entry, k.grid, k.block,
                        [[s.entry, s.grid, s.block, s.args] for s in k.stages]] for k in kernels])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tuned:
    """What the layout tuning chose, and the totals it predicted (seconds)."""

    plan: dict[Node, Choice]
    greedy_total: float
    tuned_total: float
    layers: int  # layers the DP chose for (blocked layers with records of this device)
    changed: int  # of them, those whose choice differs from the greedy one
    measured: int  # read costs timed (not cached)


def tune_layouts(graph: Graph, plan: Mapping[Node, Choice], layouts: Mapping[Node, int],
                 source: RecordSource | None, device: Device, top_k: int = DEFAULT_TOP_K,
                 cache: Path | None = None, residual_index: Callable[[Node], int | None]
                 = lambda node: None, reads: ReadCosts | None = None,
                 held: Collection[Node] = ()) -> Tuned:
    """``plan`` (each layer's fastest record, from ``select_layers``) re-chosen by the DP.

    ``layouts`` is the layout plan of ``plan`` (``plan_layouts``): a tuned layer whose
    output is in it writes blocked for every option (all options are blocked-io, whose
    readers decide that), so its readers' edges are known before choosing. Layers with
    no records of this device keep their choice, and so do the ``held`` ones (what
    ``select_layers`` chose against the records' order); ``residual_index`` names a
    layer's fused residual input; ``reads`` measures read costs (default: ``ReadCosts``
    on ``device`` with ``cache``)."""
    nodes = [n for n in graph.nodes if n in plan]
    options = layer_options(nodes, source, device.target, device.limits, top_k)
    keep = [i for i, opts in enumerate(options) if opts and nodes[i] not in held
            and get_template(plan[nodes[i]].workload.template).blocked_io]
    nodes = [nodes[i] for i in keep]
    options = [options[i] for i in keep]
    # the greedy state is select_layers' choice: an option, added where top_k left it out
    greedy: list[int] = []
    for i, node in enumerate(nodes):
        chosen = plan[node]
        at = next((s for s, o in enumerate(options[i]) if o.choice.workload == chosen.workload
                   and o.choice.config == chosen.config), None)
        if at is None:
            options[i].append(Option(chosen, chosen.cost if chosen.cost is not None
                                     else math.inf, timed_block(chosen),
                                     get_template(chosen.template).out_block(
                                         chosen.workload, chosen.config)))
            at = len(options[i]) - 1
        greedy.append(at)
    index = {node: i for i, node in enumerate(nodes)}
    edges: list[Edge] = []
    fixed: dict[tuple[int, str], int] = {}
    for v, node in enumerate(nodes):
        slots = [(DATA, node.inputs[0])]
        r = residual_index(node)
        if r is not None:
            slots.append((RESIDUAL, node.inputs[r]))
        for slot, value in slots:
            while value in layouts and value not in plan and value.op in BLOCKED_POOLS:
                value = value.inputs[0]  # a blocked pool passes its producer's block on
            if value in index and value in layouts:
                edges.append(Edge(index[value], v, slot))
            elif value not in layouts:
                fixed[(v, slot)] = 0  # read plain: a graph input, a plain op's output, ...
            elif value in plan:  # a blocked layer with no records here: its block is fixed
                fixed[(v, slot)] = layouts[value]
            # else: a blocked element-wise kernel writes the block its (first) reader
            # takes: not modelled
    problem_ = Problem(options, edges, fixed)
    reads = reads if reads is not None else ReadCosts(device, cache)
    epilogues = [node_epilogue(node) for node in nodes]
    memo: dict[tuple[int, int, str, int], float] = {}

    def penalty(v: int, s: int, slot: str, block: int) -> float:
        key = (v, s, slot, block)
        if key not in memo:
            memo[key] = reads.penalty(options[v][s], epilogues[v], slot, block)
        return memo[key]

    states = solve(problem_, penalty)
    greedy_total, tuned_total = problem_.total(greedy, penalty), problem_.total(states, penalty)
    if tuned_total >= greedy_total:  # nothing gained: keep select_layers' choice
        states = greedy
    new_plan = dict(plan)
    for v, node in enumerate(nodes):
        new_plan[node] = options[v][states[v]].choice
    changed = sum(s != g for s, g in zip(states, greedy))
    return Tuned(new_plan, greedy_total, min(tuned_total, greedy_total), len(nodes), changed,
                 reads.measured)

"""model + target + records -> a module that runs on the device.

The pipeline: import (ONNX) -> optimize (fold constants and batch-norm, fuse epilogues)
-> extract tasks -> pick each task's config (records fallback chain) -> plan the
physical layout of every value (blocked NCHW[x]c between CPU-template convolutions),
the concatenations written in place and the element-wise chains run in the load of the
conv that reads them (prologues) -> lower every op to a kernel (templates for
conv2d/dense, plain kernels for the rest) -> plan buffers and build the kernels in a
graph executor.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from compiler.ir import CONST, INPUT, Graph, Node, TensorType
from compiler.ir.ops import ALIAS_OPS, node_epilogue
from compiler.kernels import BLOCKED_KERNELS, BLOCKED_POOLS, PROLOGUE_KERNELS
from compiler.kernels import lower as lower_plain
from compiler.layout_tune import DEFAULT_TOP_K, Tuned, data_block, default_cache, tune_layouts
from compiler.passes import optimize
from compiler.passes.fold_batch_norm import per_channel
from compiler.records import (
    DEFAULT,
    OTHER_DEVICE,
    Choice,
    RecordSource,
    build_report,
    choose_configs,
)
from compiler.runtime import Device, open_device
from compiler.runtime.executor import (
    BenchmarkResult,
    GraphExecutor,
    Program,
    Step,
    StepTime,
)
from compiler.runtime.host import random_value
from compiler.tasks import CONV1X1_CPU, Task, candidates, extract_tasks
from compiler.templates import IOLayout, Prologue, get_template
from compiler.templates.base import AVX512_LANES, simd_lanes
from schemas import DeviceLimits, Target

log = logging.getLogger(__name__)

# The smallest prologue scale moved into a conv's weight (``_scale_into_weight``)
MIN_MOVED_SCALE = 1e-12

Model = Graph | str | os.PathLike[str] | Any  # a Graph, an .onnx path or an onnx.ModelProto


@dataclass
class Module:
    """A built model: its optimized graph, the decisions made, and the executor."""

    graph: Graph
    tasks: list[Task]
    choices: list[Choice]
    program: Program
    executor: GraphExecutor
    device: Device
    owns_device: bool = False  # opened by the build for this module: close() releases it
    layout_tuning: Tuned | None = None  # what build(graph_tune=True) chose and predicted

    def close(self) -> None:
        """Release the device if the build opened it (one passed in stays open)."""
        if self.owns_device:
            self.device.close()
            self.owns_device = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.executor.run(inputs)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded data of each input's shape and type: enough to run or time the model."""
        rng = np.random.default_rng(seed)
        return [random_value(node, rng) for node in self.graph.inputs]

    def benchmark(self, number: int = 10, repeat: int = 3,
                  min_repeat_ms: float = 0.0) -> BenchmarkResult:
        return self.executor.benchmark(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)

    def profile(self, number: int = 3) -> list[StepTime]:
        return self.executor.profile(number=number)

    def report(self) -> str:
        return build_report(self.choices, [t.total_flops for t in self.tasks],
                            self.device.target)


def load_graph(model: Model) -> Graph:
    if isinstance(model, Graph):
        return model
    from compiler.frontend import import_onnx

    return import_onnx(model)


def build(model: Model, target: str | Target | None = None,
          records: RecordSource | None = None, device: Device | None = None,
          optimized: bool = False, blocked_layout: bool = True,
          slice_concat: bool = True, graph_tune: bool = False,
          graph_tune_top_k: int = DEFAULT_TOP_K, fold_prologues: bool = True) -> Module:
    """Compile ``model`` for the local device matching ``target`` (or ``device``).

    ``records`` supplies tuned configs; without it every task runs its template's default.
    ``optimized``: ``model`` is a graph the passes already ran on. ``blocked_layout``:
    keep activations in NCHW[x]c between CPU-template convolutions (``plan_layouts``);
    False stores every value in plain NCHW (to compare, or to read intermediates).
    ``slice_concat``: the producers of a concatenation write their slices of it in place
    (``plan_slices``); False runs a concatenate kernel for each (to compare).
    ``fold_prologues``: a per-channel scale/shift/relu chain read only by a conv whose
    template applies a prologue runs in that conv's data load (``plan_prologues``);
    False runs it as its own kernel (to compare).
    ``graph_tune``: choose each blocked layer's record among the ``graph_tune_top_k``
    cheapest layouts of this device's records by dynamic programming over the whole
    graph, counting the measured cost of reading a producer's block
    (``compiler.layout_tune``), instead of each layer's fastest record alone.
    """
    owns_device = device is None
    if device is None:
        device = open_device(target=str(target) if target is not None else None)
    graph = load_graph(model)
    if not optimized:
        graph = optimize(graph)
    plan, tasks, choices = select_layers(graph, device.target, records, device.limits,
                                         fold_prologues)
    tuned = None
    if graph_tune and blocked_layout:
        held = held_for_prologues(graph, device.target, simd_lanes(device.limits)) \
            if fold_prologues else set()
        tuned = tune_layouts(graph, plan, plan_layouts(graph, plan), records, device,
                             graph_tune_top_k, default_cache(), _residual_index, held=held)
        log.info("graph tuning: %d layers changed, predicted %.3f ms against %.3f ms "
                 "(%d read costs measured)", tuned.changed, tuned.tuned_total * 1e3,
                 tuned.greedy_total * 1e3, tuned.measured)
        if tuned.changed:
            plan = tuned.plan
            tasks, choices = _tasks_of(graph, plan)
    program = lower(graph, plan, device.dialect, blocked_layout=blocked_layout,
                    view_align=device.view_align if slice_concat else 0,
                    fold_prologues=fold_prologues)
    module = Module(graph, tasks, choices, program, GraphExecutor(program, device), device,
                    owns_device, tuned)
    served = Counter(c.source for c in choices)
    if served[DEFAULT] or served[OTHER_DEVICE]:
        # TVM said "Cannot find config for target=..." once per task; say it once, and
        # where to look: the report names each task and what it runs instead.
        log.warning("%d of %d tasks run the template's default config and %d a config tuned "
                    "on another device; Module.report() lists them", served[DEFAULT],
                    len(choices), served[OTHER_DEVICE])
    if log.isEnabledFor(logging.INFO):
        log.info("build report\n%s", module.report())
    return module


def select_layers(graph: Graph, target: Target, records: RecordSource | None,
                  limits: DeviceLimits, prologues: bool = True
                  ) -> tuple[dict[Node, Choice], list[Task], list[Choice]]:
    """Each conv2d/dense layer's template and config (TVM's select_implementation): of
    its candidates, the one with the fastest record measured on this device; else the
    first (in the device class's order) with another device's record; else the
    preferred candidate's default. On a CPU only the preferred candidate's record from
    another device counts: its candidates are ordered by how fast their defaults run
    here, and the preferred default beat TopHub's records of the other templates (other
    CPUs' direct ones on Winograd layers, GPUs' 5-100x slower;
    bench/default_choice.py). With ``prologues`` (a build that folds chains), the
    ``held_for_prologues`` layers take only the 1x1 template's options. Also the chosen
    tasks and their choices, for the report."""
    lanes = simd_lanes(limits)
    held = held_for_prologues(graph, target, lanes) if prologues else set()
    every = extract_tasks(graph, target, every_candidate=True, lanes=lanes)
    found = choose_configs([t.workload for t in every], records, target, limits)
    by_key = {t.workload.key: c for t, c in zip(every, found)}
    plan: dict[Node, Choice] = {}
    tasks: dict[str, Task] = {}
    live = graph.live()
    cpu = target.device_class == "cpu"
    for node in graph.nodes:
        options = ([by_key[w.key] for w in candidates(node, target, lanes)]
                   if id(node) in live else [])
        if not options:
            continue
        if node in held:
            options = [c for c in options if c.workload.template == CONV1X1_CPU] or options
        measured = [c for c in options if c.cost is not None]
        others = [c for c in (options[:1] if cpu else options) if c.source == OTHER_DEVICE]
        choice = (min(measured, key=lambda c: c.cost or 0.0) if measured
                  else others[0] if others else options[0])
        plan[node] = choice
        task = tasks.setdefault(choice.workload.key, Task(choice.workload))
        task.layers.append(node.name or node.op)
    chosen = list(tasks.values())
    return plan, chosen, [by_key[t.workload.key] for t in chosen]


def held_for_prologues(graph: Graph, target: Target, lanes: int) -> set[Node]:
    """The 1x1 layers that take the 1x1 template (its records as ``select_layers`` ranks
    them, else its default) whatever the other templates' records say: on a 16-lane CPU,
    those that will apply the chain they read in their load (``plan_prologues``). Trials
    time the templates on blocked data without a prologue, the model runs them on plain
    data with one, and there the direct template's records ran 1.2-1.35x slower than the
    1x1 template's default (DenseNet-121's 29 such layers, bench/build_ab.py --switch
    prologue-1x1)."""
    if target.device_class != "cpu" or lanes < AVX512_LANES:
        return set()
    users = graph.users()
    return {node for node in graph.nodes if node.op in ("nn.conv2d", "fused.conv2d")
            and _foldable_chain(node, users) is not None
            and any(w.template == CONV1X1_CPU for w in candidates(node, target, lanes))}


def _tasks_of(graph: Graph, plan: Mapping[Node, Choice]) -> tuple[list[Task], list[Choice]]:
    """The tasks and choices of a plan in first-use order, one per (workload, config):
    after graph tuning, layers of one workload may run different configs."""
    tasks: dict[tuple[str, int], tuple[Task, Choice]] = {}
    for node in graph.nodes:
        if node in plan:
            choice = plan[node]
            key = (choice.workload.key, choice.config.index)
            task, _ = tasks.setdefault(key, (Task(choice.workload), choice))
            task.layers.append(node.name or node.op)
    return [t for t, _ in tasks.values()], [c for _, c in tasks.values()]


def _residual_index(node: Node) -> int | None:
    """Position of a fused conv's residual among its inputs (the last one), if any."""
    return len(node.inputs) - 1 if "add" in tuple(node.attr("epilogue", ())) else None


def plan_layouts(graph: Graph, plan: Mapping[Node, Choice]) -> dict[Node, int]:
    """The channel block each value is stored in (NCHW[b]c; values not listed are plain
    NCHW), as AutoTVM's alter_op_layout keeps NCHW[x]c between x86 convolutions.

    A layer whose chosen template has ``blocked_io`` (a CPU conv) writes its output in
    the block its config prefers (``Template.out_block``: oc_bn) when every live reader
    of that output is such a layer reading it as its data or as its fused residual; if
    any other op reads it, or it is a graph output, it writes plain NCHW. So a
    non-blocked op only ever sees plain NCHW, and no layout_transform op is needed at
    all: the producer itself writes what its readers take, and each blocked layer reads
    its data and residual in whatever block their producers wrote. A plain op with a
    blocked kernel (``BLOCKED_KERNELS``: an element-wise chain) read only by such layers
    likewise writes the block its first reader takes its data in (``data_block``). A pool
    that reads and writes one block (``BLOCKED_POOLS``: ResNet's max-pool after the stem)
    read only by such layers counts as one of them for its producer, and keeps the
    producer's block: so the stem stores vectors into its own block, not lanes into NCHW."""
    users = graph.users()
    blocked: dict[Node, int] = {}  # layers that can read and write blocked values
    for node, choice in plan.items():
        template = get_template(choice.workload.template)
        if template.blocked_io:
            blocked[node] = template.out_block(choice.workload, choice.config)

    def takes_blocked(reader: Node | None, value: Node) -> bool:
        if reader is None or reader not in blocked:
            return False
        slots = {i for i, arg in enumerate(reader.inputs) if arg is value}
        return slots <= {0, _residual_index(reader)}

    def passes_block(reader: Node | None, block: int) -> bool:
        """A pool that can read ``block`` and write it for readers that all take it."""
        return (reader is not None and reader.op in BLOCKED_POOLS
                and BLOCKED_POOLS[reader.op][0](reader, block) and bool(users[reader])
                and all(takes_blocked(u, reader) for u in users[reader]))

    layouts = {node: block for node, block in blocked.items()
               if block and users[node]
               and all(takes_blocked(u, node) or passes_block(u, block) for u in users[node])}
    for node, block in list(layouts.items()):
        # its pools (a graph output, None, never reaches here: it takes no block)
        layouts.update({u: block for u in users[node] if u is not None and u not in blocked})
    # DenseNet's pre-activation scale/shift/relu before each 1x1 conv, where it does not
    # run in the conv's load (``plan_prologues``): the layout transform then costs no
    # pass of its own
    live = graph.live()
    for node in graph.nodes:
        readers = users.get(node, [])
        if id(node) not in live or node.op not in BLOCKED_KERNELS or not readers \
                or not all(takes_blocked(u, node) for u in readers):
            continue
        block = data_block(plan[readers[0]], node.ty.shape[1])
        if BLOCKED_KERNELS[node.op][0](node, block):
            layouts[node] = block
    return layouts


@dataclass(frozen=True)
class Fold:
    """An element-wise chain run in the data load of the conv or pool that reads it."""

    chain: Node  # the fused.elementwise that runs no kernel
    prologue: Prologue
    vectors: dict[str, np.ndarray]  # per ``prologue.vector_ops`` op, one per channel
    weight_scale: np.ndarray | None = None  # per input channel, into the conv's weight

    @property
    def data(self) -> Node:
        """What the reader reads instead: the chain's input."""
        return self.chain.inputs[0]


def _as_prologue(node: Node) -> Fold | None:
    """``node`` as a prologue: a float ``fused.elementwise`` over NCHW of at most one
    per-channel constant multiply (scale), one per-channel constant add or bias_add
    (shift) and relus, in any order; else None."""
    if node.op != "fused.elementwise" or node.ty.dtype != "float32" or node.ty.ndim != 4:
        return None
    ops: list[str] = []
    vectors: dict[str, np.ndarray] = {}
    for op, index, items in node.attr("chain"):
        if op == "nn.relu":
            ops.append("relu")
            continue
        other = node.inputs[index] if index >= 0 else None
        name = {"multiply": "scale", "add": "shift", "nn.bias_add": "shift"}.get(op)
        if other is None or name is None or name in vectors or other.value is None:
            return None
        if op == "nn.bias_add":
            ok = dict(items).get("axis", 1) % 4 == 1 and other.ty.shape == node.ty.shape[1:2]
            value = np.asarray(other.value, np.float32) if ok else None
        else:
            value = per_channel(other, node)
        if value is None:
            return None
        ops.append(name)
        vectors[name] = value
    return Fold(node, Prologue(tuple(ops)), vectors)


def _scale_into_weight(fold: Fold) -> Fold:
    """A positive scale moved into the conv's weight: relu(s * x + h) is
    s * relu(x + h / s) for s > 0, and W (s * y) is (W s) y; the shifts after it divided
    by s (not where some s is below ``MIN_MOVED_SCALE``: h / s could overflow, W s
    underflow). Why: the scale is a multiply on the FMA pipes the GEMM keeps busy, a
    shift and relu can run on the add pipes beside them (a Zen 5 VM, DenseNet-121's 1x1 shapes on
    the 1x1 template: shift + relu on the load 0.97-1.21x the time without a prologue,
    with the scale too 1.14-1.42x; bench/prologue.py)."""
    ops = fold.prologue.ops
    if "scale" not in ops or not np.all(fold.vectors["scale"] >= MIN_MOVED_SCALE):
        return fold
    vectors = dict(fold.vectors)
    scale = vectors.pop("scale")
    if "shift" in ops and ops.index("shift") > ops.index("scale"):
        vectors["shift"] = (vectors["shift"] / scale).astype(np.float32)
    return Fold(fold.chain, Prologue(tuple(op for op in ops if op != "scale")), vectors,
                scale)


def plan_prologues(graph: Graph, plan: Mapping[Node, Choice]) -> dict[Node, Fold]:
    """The convs and pools that apply the element-wise chain they read in their data
    load, as TVM fuses an injective producer into its reader: DenseNet's pre-activation
    batch-norm + ReLU before each 1x1 conv, which otherwise writes a copy of the
    concatenated feature map each layer (62 kernels of DenseNet-121), and before its
    transition pools. The chain must be read by nothing else (not a graph output) and
    only as the reader's data; a conv's chosen template must take a prologue
    (``Template.takes_prologue``), a pool's plain kernel apply one (``PROLOGUE_KERNELS``)."""
    users = graph.users()
    live = graph.live()
    folds: dict[Node, Fold] = {}
    for node in graph.nodes:
        choice = plan.get(node)
        if choice is not None:
            template = get_template(choice.workload.template)
            fold = _foldable_chain(node, users) if template.takes_prologue else None
            if fold is not None:  # the weight a template packs is the one it can scale
                folds[node] = _scale_into_weight(fold) if template.packs_weight else fold
        elif node.op in PROLOGUE_KERNELS and id(node) in live:
            fold = _foldable_chain(node, users)
            if fold is not None:
                folds[node] = fold
    return folds


def _foldable_chain(node: Node, users: Mapping[Node, list[Node]]) -> Fold | None:
    """The chain ``node`` reads as its data, as a prologue, where nothing else reads it
    (``node`` reads it once: not also as a residual)."""
    chain = node.inputs[0] if node.inputs else None
    if chain is None or users.get(chain) != [node]:
        return None
    return _as_prologue(chain)


def _slice_starts(node: Node) -> list[int]:
    """The element offset of each input's slice in a concatenation whose axes before
    the concatenated one have extent 1 (so each slice is one run of elements)."""
    axis = node.attrs["axis"] % node.ty.ndim
    inner = math.prod(node.ty.shape[axis + 1:])
    starts, start = [], 0
    for part in node.inputs:
        starts.append(start * inner)
        start += part.ty.shape[axis]
    return starts


def _viewable(part: Node, outputs: set[int], layouts: Mapping[Node, int]) -> bool:
    """Whether ``part``'s producer can write it straight into a slice of another
    value's storage: a value some step computes (not a graph input, constant or
    alias), plain NCHW, not a graph output."""
    return (part.op not in (INPUT, CONST) and part.op not in ALIAS_OPS
            and id(part) not in outputs and part not in layouts and part.ty.size > 0)


def plan_slices(graph: Graph, layouts: Mapping[Node, int], view_align: int
                ) -> tuple[set[Node], dict[Node, tuple[Node, int]]]:
    """Concatenations that run no kernel, and which values are written in place.

    A concatenation qualifies when each input's slice of it is one contiguous run of
    elements (every axis before the concatenated one has extent 1: NCHW with N = 1
    along channels), it is stored plain, and every slice starts at a byte offset the
    device can view (``view_align``; 0: none qualifies). Returns those concatenations
    and, per input written in place, (its concatenation, element offset): the input's
    producer writes its slice directly, so the copy is never made. An input that cannot
    be a view (``_viewable``; repeated; or already a slice of an earlier concatenation)
    is copied into its slice instead. DenseNet's dense blocks nest these (each layer's
    concatenation is the first input of the next), so a block's growing feature map is
    one buffer that every layer appends its channels to."""
    sliced: set[Node] = set()
    views: dict[Node, tuple[Node, int]] = {}
    if not view_align:
        return sliced, views
    live, outputs = graph.live(), {id(n) for n in graph.outputs}
    for node in graph.nodes:
        if node.op != "concatenate" or id(node) not in live or node in layouts \
                or not node.ty.size:
            continue
        axis = node.attrs["axis"] % node.ty.ndim
        if math.prod(node.ty.shape[:axis]) != 1:
            continue
        itemsize = np.dtype(node.ty.dtype).itemsize
        starts = _slice_starts(node)
        if any(o * itemsize % view_align for o, p in zip(starts, node.inputs) if p.ty.size):
            continue
        sliced.add(node)
        for part, offset in zip(node.inputs, starts):
            if part not in views and _viewable(part, outputs, layouts):
                views[part] = (node, offset)
    return sliced, views


def _slice_in(program: Program, node: Node, vid: int, views: Mapping[Node, tuple[Node, int]],
              dialect: str, value_id: Callable[[Node], int]) -> None:
    """A concatenation with no kernel: each input written in place becomes a view of
    it; each other non-empty input is copied into a new value that is one."""
    for part, offset in zip(node.inputs, _slice_starts(node)):
        if not part.ty.size:
            continue
        if views.get(part) == (node, offset):
            program.views[value_id(part)] = (vid, offset)
            continue
        copy = Node("copy", (part,), {}, part.ty, node.name)
        slot = len(program.values)
        program.values.append(part.ty)
        program.views[slot] = (vid, offset)
        program.steps.append(Step(f"copy {node.name}".strip(), lower_plain(copy, dialect),
                                  (value_id(part), slot)))


def lower(graph: Graph, plan: Mapping[Node, Choice], dialect: str,
          blocked_layout: bool = True, view_align: int = 0,
          fold_prologues: bool = True) -> Program:
    """One step per op: conv2d/dense layers in ``plan`` run their template with the
    chosen config; reshapes alias their input; everything else gets a plain kernel. No
    device needed: the same program lowers to CUDA C for a GPU machine as to OpenCL C
    here.

    With ``blocked_layout`` the values ``plan_layouts`` picks are stored in NCHW[x]c
    (their type stays NCHW: the executor only checks element counts); each blocked-io
    layer is generated for the layouts of its data, residual and output
    (``Program.blocks`` lists the blocked values). Only layers that write and read them
    touch blocked values, so there are no layout_transform steps.

    With ``view_align`` (the device's, bytes) the concatenations ``plan_slices`` picks
    run no kernel: their inputs are views of them (``Program.views``), written in
    place by their producers or, where one cannot, copied into their slice.

    With ``fold_prologues`` the element-wise chains ``plan_prologues`` picks run no
    kernel: the conv or pool reading each applies it on its data load."""
    ids: dict[Node, int] = {}
    program = Program(values=[], inputs=[], outputs=[], constants={}, steps=[], aliases={})

    def value_id(node: Node) -> int:
        if node not in ids:
            ids[node] = len(program.values)
            program.values.append(node.ty)
        return ids[node]

    def constant(array: np.ndarray) -> int:
        """A new value holding ``array``: a step's own constant (a packed weight, a
        prologue's vector)."""
        program.values.append(TensorType(array.shape, str(array.dtype)))
        program.constants[len(program.values) - 1] = np.ascontiguousarray(array)
        return len(program.values) - 1

    layouts = plan_layouts(graph, plan) if blocked_layout else {}
    sliced, views = plan_slices(graph, layouts, view_align)
    folds = plan_prologues(graph, plan) if fold_prologues else {}
    folded = {fold.chain for fold in folds.values()}
    live = graph.live()
    for node in graph.inputs:
        program.inputs.append((node.name, value_id(node)))
    for node in graph.nodes:
        if id(node) not in live or node.op == INPUT or node in folded:
            continue
        vid = value_id(node)
        if node.op == CONST:
            assert node.value is not None
            program.constants[vid] = np.ascontiguousarray(node.value, dtype=node.ty.dtype)
            continue
        fold = folds.get(node)
        inputs = (fold.data, *node.inputs[1:]) if fold else node.inputs
        args = tuple(value_id(a) for a in inputs)
        if node.op in ALIAS_OPS:
            program.aliases[vid] = args[0]
            continue
        if node in sliced:
            _slice_in(program, node, vid, views, dialect, value_id)
            continue
        choice = plan.get(node)
        if choice is not None:
            workload = choice.workload
            template = get_template(workload.template)
            epilogue = node_epilogue(node)
            io = None
            if template.blocked_io and layouts:
                residual = _residual_index(node)
                io = IOLayout(
                    data_block=layouts.get(inputs[0], 0),
                    out_block=layouts.get(node, 0),
                    residual_block=(0 if residual is None
                                    else layouts.get(node.inputs[residual], 0)))
                if io.out_block:
                    program.blocks[vid] = io.out_block
                if io.plain:
                    io = None
            kernel = template.codegen(workload, choice.config, dialect, epilogue, io,
                                      fold.prologue if fold else Prologue())
            if template.packs_weight:  # the packed copy is this step's own constant
                weight = node.inputs[1].value
                assert weight is not None, "templates that pack weights need constant ones"
                if fold and fold.weight_scale is not None:
                    weight = weight * fold.weight_scale.reshape(1, -1, 1, 1)
                packed = template.pack_weight(workload, choice.config, weight)
                args = (args[0], constant(packed.astype(kernel.buffers[1].dtype)), *args[2:])
        elif fold:  # a pool reading the chain's input through its prologue
            kernel = lower_plain(Node(node.op, inputs, node.attrs, node.ty, node.name),
                                 dialect, prologue=fold.prologue)
        else:
            kernel = lower_plain(node, dialect, out_block=layouts.get(node, 0))
            if node in layouts:
                program.blocks[vid] = layouts[node]
        if fold:  # the prologue's vectors after the reader's own inputs
            args += tuple(constant(fold.vectors[op]) for op in fold.prologue.vector_ops)
        program.steps.append(Step(f"{node.op} {node.name}".strip(), kernel, (*args, vid)))
    program.outputs = [value_id(n) for n in graph.outputs]
    # a weight a template packed is read in its packed copy only: do not upload both
    read = {v for step in program.steps for v in step.args} | set(program.outputs)
    read |= {program.aliases[v] for v in read if v in program.aliases}
    program.constants = {v: a for v, a in program.constants.items() if v in read}
    return program

"""Heterogeneous execution: one model, several devices (TVM v0.5's heterogeneous
runtime), with the placement given by rules or found automatically.

A placed graph (``compiler.passes.annotate_device``: every op has a device, and a
``device_copy`` node sits on every edge between two devices) is cut into *segments*:
maximal runs of consecutive nodes on one device, in a topological order that keeps a
device's ops together where the dependencies allow it. A kernel-device segment is its
own sub-graph (inputs: the values it reads from other segments and graph inputs;
outputs: the values other segments or the graph outputs read), lowered like a whole
model (``select_layers`` + ``lower``) and run by a ``GraphExecutor`` on its device; a
host segment runs in numpy. A device_copy is realized by the hand-over between
segments: the source segment downloads the value, the destination uploads it. Every
graph output comes back to the host.

``auto_place`` measures each op on each device and the cost of moving data, picks the
placement with the lowest estimated latency, then measures it end to end against
every single-device placement, interleaved in one run, and keeps the fastest: an
automatic placement is never slower than the best single device, as measured.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.build_module import Model, load_graph, lower, select_layers
from compiler.ir import CONST, INPUT, Graph, GraphBuilder, Node
from compiler.ir.interpreter import Inputs, bind_inputs
from compiler.ir.ops import ALIAS_OPS
from compiler.kernels import NoKernelError
from compiler.passes import optimize
from compiler.passes.annotate_device import (
    DEVICE_COPY,
    HOST,
    annotate_devices,
    insert_device_copy,
    parse_device_spec,
    placed_nodes,
)
from compiler.records import Choice, RecordSource, build_report
from compiler.runtime import Device, open_device
from compiler.runtime.device import BuildError, DeviceRuntimeError
from compiler.runtime.executor import BenchmarkResult, GraphExecutor, Program
from compiler.runtime.host import HostDevice, random_value
from compiler.tasks import Task

log = logging.getLogger(__name__)

AnyDevice = Device | HostDevice
# what a kernel device may fail with when an op does not build or run there
_BUILD_ERRORS = (BuildError, DeviceRuntimeError, NoKernelError, ValueError)


# ---------------------------------------------------------------- segments


@dataclass
class Segment:
    """Consecutive nodes on one device, run as one unit: a ``GraphExecutor`` on a kernel
    device (``executor`` set), numpy on the host (``executor`` None)."""

    index: int
    device: str
    nodes: list[Node]
    inputs: list[Node]  # values read from outside: graph inputs, device_copy nodes, ...
    outputs: list[Node]  # values read by other segments or returned
    program: Program | None = None
    executor: GraphExecutor | None = None
    tasks: list[Task] = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        return len(self.program.steps) if self.program is not None else 0


def split_segments(graph: Graph, placement: Mapping[Node, str]) -> list[Segment]:
    """The segments of a placed graph, in run order (not yet built).

    List scheduling over the live ops: device_copy nodes go as soon as their value is
    ready (they are hand-overs, not work), then the earliest ready op on the current
    device, else the earliest ready op at all (which starts a new segment). So two
    independent branches on two devices make two segments, not an alternation."""
    ops = placed_nodes(graph)
    missing = [n.name or n.op for n in ops if n not in placement]
    if missing:
        raise ValueError(f"no device for op(s) {', '.join(missing[:5])}")
    order = {n: i for i, n in enumerate(ops)}
    readers: dict[Node, list[Node]] = {n: [] for n in ops}
    pending: dict[Node, int] = {}
    for node in ops:
        deps = [a for a in dict.fromkeys(node.inputs) if a in order]
        pending[node] = len(deps)
        for dep in deps:
            readers[dep].append(node)
    ready = [n for n in ops if not pending[n]]
    groups: list[tuple[str, list[Node]]] = []
    while ready:
        copies = [n for n in ready if n.op == DEVICE_COPY]
        if copies:
            pick = copies[0]
        else:
            current = groups[-1][0] if groups else None
            same = [n for n in ready if placement[n] == current]
            pick = min(same or ready, key=order.__getitem__)
        ready.remove(pick)
        if pick.op != DEVICE_COPY:
            if not groups or groups[-1][0] != placement[pick]:
                groups.append((placement[pick], []))
            groups[-1][1].append(pick)
        for reader in readers[pick]:
            pending[reader] -= 1
            if not pending[reader]:
                ready.append(reader)
    users = graph.users()
    segments = []
    for index, (device, nodes) in enumerate(groups):
        members = set(nodes)
        inputs = list(dict.fromkeys(a for n in nodes for a in n.inputs
                                    if a not in members and a.op != CONST))
        outputs = [n for n in nodes if any(u is None or u not in members for u in users[n])]
        segments.append(Segment(index, device, nodes, inputs, outputs))
    return segments


def segment_graph(segment: Segment) -> Graph:
    """The segment as a graph of its own: its inputs become graph inputs ``in0``,
    ``in1``...; constants come along (they live where their reader is)."""
    b = GraphBuilder()
    new: dict[Node, Node] = {}
    for k, value in enumerate(segment.inputs):
        new[value] = b.input(f"in{k}", value.ty.shape, value.ty.dtype)
    for node in segment.nodes:
        args = [new.get(a, a) for a in node.inputs]
        new[node] = b.call(node.op, args, node.name, **node.attrs)
    return b.finish(new[n] for n in segment.outputs)


def build_segment(segment: Segment, device: Device, records: RecordSource | None) -> None:
    """Lower the segment for ``device`` (templates with the records' best configs, plain
    NCHW at its boundaries) and make its executor ready."""
    sub = segment_graph(segment)
    plan, segment.tasks, segment.choices = select_layers(sub, device.target, records,
                                                         device.limits)
    segment.program = lower(sub, plan, device.dialect, blocked_layout=False)
    segment.executor = GraphExecutor(segment.program, device)


# ---------------------------------------------------------------- the module


def _label(node: Node) -> str:
    return node.name or node.op


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"  # pragma: no cover


@dataclass
class HeteroModule:
    """A model built across devices. ``graph`` has the device_copy nodes and
    ``placement`` the device of each of its ops (copies on their destination)."""

    graph: Graph
    placement: dict[Node, str]
    segments: list[Segment]
    devices: dict[str, AnyDevice]
    auto_report: PlacementReport | None = None

    @property
    def copies(self) -> list[Node]:
        return [n for n in self.placement if n.op == DEVICE_COPY]

    def _value(self, node: Node, values: dict[Node, np.ndarray]) -> np.ndarray:
        """A value any segment reads: computed, a graph input, a constant, or the value
        a device_copy hands over (downloaded by its source segment, uploaded by the
        reader's executor)."""
        if node in values:
            return values[node]
        if node.op == CONST and node.value is not None:
            return node.value
        if node.op == DEVICE_COPY:
            values[node] = self._value(node.inputs[0], values)
            return values[node]
        raise RuntimeError(f"value {_label(node)} is read before any segment computes it")

    def run(self, inputs: Inputs) -> list[np.ndarray]:
        """The graph outputs (host arrays) for ``inputs`` (by name or in order)."""
        values: dict[Node, np.ndarray] = dict(bind_inputs(self.graph, inputs))
        for seg in self.segments:
            if seg.executor is None:
                for node in seg.inputs:
                    self._value(node, values)
                host = self.devices[seg.device]
                assert isinstance(host, HostDevice)
                host.run(seg.nodes, values)
            else:
                outs = seg.executor.run([self._value(v, values) for v in seg.inputs])
                values.update(zip(seg.outputs, outs))
        return [self._value(n, values) for n in self.graph.outputs]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [random_value(n, rng) for n in self.graph.inputs]

    def time_runs(self, inputs: Inputs, number: int) -> float:
        """Wall-clock seconds per run over ``number`` back-to-back synchronous runs:
        kernels, hand-overs and numpy ops alike."""
        start = time.perf_counter()
        for _ in range(number):
            self.run(inputs)
        return (time.perf_counter() - start) / number

    def benchmark(self, number: int = 10, repeat: int = 3) -> BenchmarkResult:
        """Seconds per whole run, copies included (one cost per repeat of ``number``
        runs), after a warm-up run, on seeded uniform [0, 1) inputs."""
        if number < 1 or repeat < 1:
            raise ValueError(f"benchmark: number ({number}) and repeat ({repeat}) must be >= 1")
        inputs = self.random_inputs()
        self.run(inputs)
        return BenchmarkResult(tuple(self.time_runs(inputs, number) for _ in range(repeat)))

    def report(self) -> str:
        """Devices, segments in run order, the copies between them, then each kernel
        device's task report (and the automatic placement's measurements, if any)."""
        ops = [n for n in self.placement if n.op != DEVICE_COPY]
        used = list(dict.fromkeys(s.device for s in self.segments))
        copied = sum(c.ty.nbytes for c in self.copies)
        lines = [f"heterogeneous build: {len(ops)} ops on {len(used)} device(s), "
                 f"{len(self.segments)} segment(s), {len(self.copies)} device_copy "
                 f"({_size(copied)} per run)", "devices:"]
        for spec in used:
            dev = self.devices[spec]
            what = (dev.name if isinstance(dev, HostDevice)
                    else f"{dev.info.name} ({dev.target})")
            count = sum(1 for n in ops if self.placement[n] == spec)
            lines.append(f"  {spec:<10} {count:3d} ops  {what}")
        lines.append("segments (run order):")
        for seg in self.segments:
            kernels = f", {seg.kernels} kernels" if seg.executor is not None else ""
            reads = ", ".join(_label(v) for v in seg.inputs) or "-"
            lines.append(f"  #{seg.index} {seg.device:<10} {len(seg.nodes)} ops{kernels}; "
                         f"reads {reads}")
        lines.append(f"copies: {len(self.copies)}")
        for copy in self.copies:
            lines.append(f"  {_label(copy.inputs[0])}: {copy.attr('src_device')} -> "
                         f"{copy.attr('dst_device')}  {list(copy.ty.shape)} {copy.ty.dtype} "
                         f"{_size(copy.ty.nbytes)}")
        # a value two segments of one kernel device share goes through the host too
        again = {v for s in self.segments if s.executor is not None for v in s.inputs
                 if v.op not in (INPUT, DEVICE_COPY)}
        if again:
            lines.append(f"  + {len(again)} value(s) handed between segments of one device "
                         f"via the host: {', '.join(_label(v) for v in again)}")
        for spec in used:
            dev = self.devices[spec]
            choices = [c for s in self.segments if s.device == spec for c in s.choices]
            tasks = [t for s in self.segments if s.device == spec for t in s.tasks]
            if isinstance(dev, HostDevice) or not choices:
                continue
            lines.append(f"tasks on {spec}:")
            lines.append(build_report(choices, [t.total_flops for t in tasks],
                                      dev.target).rstrip())
        if self.auto_report is not None:
            lines.append(self.auto_report.format().rstrip())
        return "\n".join(lines) + "\n"


def assemble(graph: Graph, placement: Mapping[Node, str], devices: Mapping[str, AnyDevice],
             records: RecordSource | None = None) -> HeteroModule:
    """Insert the device copies, cut the segments and build every kernel segment."""
    placed, where = insert_device_copy(graph, placement)
    segments = split_segments(placed, where)
    for seg in segments:
        dev = devices.get(seg.device)
        if dev is None:
            raise ValueError(f"segment #{seg.index}: device {seg.device} is not open "
                             f"(have {', '.join(devices)})")
        if not isinstance(dev, HostDevice):
            build_segment(seg, dev, records)
    return HeteroModule(placed, where, segments, dict(devices))


# ---------------------------------------------------------------- automatic placement


@dataclass(frozen=True)
class CopyCost:
    """Moving data between the host and one device: fixed latency (s) plus bytes over
    bandwidth (bytes/s), each way, fitted to a few measured sizes."""

    upload_latency: float
    upload_bandwidth: float
    download_latency: float
    download_bandwidth: float

    def upload(self, nbytes: int) -> float:
        return self.upload_latency + nbytes / self.upload_bandwidth

    def download(self, nbytes: int) -> float:
        return self.download_latency + nbytes / self.download_bandwidth


HOST_COPY = CopyCost(0.0, math.inf, 0.0, math.inf)


def _fit(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
    return max(float(intercept), 0.0), 1.0 / max(float(slope), 1e-15)


def measure_copy_cost(device: Device, sizes: Sequence[int] = (4096, 1 << 16, 1 << 20),
                      repeat: int = 5) -> CopyCost:
    """Median upload and download seconds of a few sizes, fitted to latency +
    size / bandwidth."""
    up, down = [], []
    for nbytes in sizes:
        array = np.zeros(nbytes // 4, np.float32)
        buffer = device.alloc_bytes(nbytes)
        device.write(buffer, array)
        device.download(buffer, array.shape)
        ups, downs = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            device.write(buffer, array)
            middle = time.perf_counter()
            device.download(buffer, array.shape)
            ups.append(middle - start)
            downs.append(time.perf_counter() - middle)
        up.append(statistics.median(ups))
        down.append(statistics.median(downs))
    return CopyCost(*_fit(sizes, up), *_fit(sizes, down))


def transfer_cost(src: str, dst: str, nbytes: int, copy_costs: Mapping[str, CopyCost]) -> float:
    """Seconds to move ``nbytes`` from ``src`` to ``dst``: through the host."""
    if src == dst:
        return 0.0
    out = copy_costs.get(src, HOST_COPY).download(nbytes) if src != HOST else 0.0
    return out + (copy_costs.get(dst, HOST_COPY).upload(nbytes) if dst != HOST else 0.0)


def estimate_latency(graph: Graph, placement: Mapping[Node, str],
                     op_costs: Mapping[Node, Mapping[str, float]],
                     copy_costs: Mapping[str, CopyCost]) -> float:
    """Sum of the ops' times on their devices, plus one transfer per (value, other
    device that reads it): graph inputs start on the host, outputs end there. (Values
    handed between two segments of one device also pass the host; not counted.)"""
    total = 0.0
    moved: set[tuple[Node, str]] = set()
    for node in placed_nodes(graph):
        dst = placement[node]
        total += op_costs[node][dst]
        for arg in node.inputs:
            if arg.op == CONST or (arg, dst) in moved:
                continue
            moved.add((arg, dst))
            total += transfer_cost(placement.get(arg, HOST), dst, arg.ty.nbytes, copy_costs)
    for out in graph.outputs:
        if (out, HOST) not in moved:
            moved.add((out, HOST))
            total += transfer_cost(placement.get(out, HOST), HOST, out.ty.nbytes, copy_costs)
    return total


def choose_placement(graph: Graph, devices: Sequence[str],
                     op_costs: Mapping[Node, Mapping[str, float]],
                     copy_costs: Mapping[str, CopyCost], passes: int = 8) -> dict[Node, str]:
    """The placement of least estimated latency found by local search: from a greedy
    pass in topological order (each op where its own time plus bringing its inputs is
    least) and from every single-device placement, move one op at a time to another
    device while that lowers the estimate; the best of these local optima."""
    ops = placed_nodes(graph)

    def cost(p: Mapping[Node, str]) -> float:
        return estimate_latency(graph, p, op_costs, copy_costs)

    greedy: dict[Node, str] = {}
    for node in ops:
        def local(dev: str) -> float:
            return op_costs[node][dev] + sum(
                transfer_cost(greedy.get(a, HOST), dev, a.ty.nbytes, copy_costs)
                for a in dict.fromkeys(node.inputs) if a.op != CONST)
        greedy[node] = min(devices, key=local)
    starts = [greedy] + [{n: d for n in ops} for d in devices
                         if all(math.isfinite(op_costs[n][d]) for n in ops)]
    best, best_cost = dict(greedy), math.inf
    for start in starts:
        current, current_cost = dict(start), cost(start)
        for _ in range(passes):
            improved = False
            for node in ops:
                here = current[node]
                for dev in devices:
                    if dev == here or not math.isfinite(op_costs[node][dev]):
                        continue
                    current[node] = dev
                    trial = cost(current)
                    if trial < current_cost * (1 - 1e-9):
                        current_cost, here, improved = trial, dev, True
                    current[node] = here
            if not improved:
                break
        if current_cost < best_cost:
            best, best_cost = current, current_cost
    return best


def kernel_op_costs(graph: Graph, device: Device, records: RecordSource | None = None,
                    number: int = 3, copy: CopyCost | None = None) -> dict[Node, float]:
    """Seconds of each live op on ``device``: its device time (``GraphExecutor.profile``
    of the whole graph built for it) plus an equal share of what a run costs beyond the
    device time and the input and output copies (launches, synchronisation: what makes
    a tiny op cheaper in numpy). Reshapes cost nothing. When the whole graph does not
    build there, each op alone (device time only); an op that does not build or run
    costs infinity."""
    ops = placed_nodes(graph)
    costs = {n: 0.0 for n in ops if n.op in ALIAS_OPS}
    stepped = [n for n in ops if n.op not in ALIAS_OPS]
    if not stepped:
        return costs
    try:
        plan, _, _ = select_layers(graph, device.target, records, device.limits)
        program = lower(graph, plan, device.dialect, blocked_layout=False)
        executor = GraphExecutor(program, device)
        times = executor.profile(number=number)
        if len(times) != len(stepped):
            raise RuntimeError(f"{len(times)} steps for {len(stepped)} ops")
        rng = np.random.default_rng(0)
        inputs = [random_value(n, rng) for n in graph.inputs]
        executor.run(inputs)
        walls = []
        for _ in range(max(3, number)):
            start = time.perf_counter()
            executor.run(inputs)
            walls.append(time.perf_counter() - start)
        moved = 0.0
        if copy is not None:
            moved = (sum(copy.upload(n.ty.nbytes) for n in graph.inputs)
                     + sum(copy.download(n.ty.nbytes) for n in graph.outputs))
        spare = statistics.median(walls) - moved - sum(t.seconds for t in times)
        overhead = max(spare, 0.0) / len(stepped)
        costs.update({n: t.seconds + overhead for n, t in zip(stepped, times)})
        return costs
    except _BUILD_ERRORS as err:
        log.info("%s: the whole graph does not build (%s); profiling op by op",
                 device.info.spec, err)
    for node in stepped:
        inputs = [a for a in dict.fromkeys(node.inputs) if a.op != CONST]
        seg = Segment(0, device.info.spec, [node], inputs, [node])
        try:
            build_segment(seg, device, records)
            assert seg.executor is not None
            costs[node] = seg.executor.profile(number=number)[0].seconds
        except _BUILD_ERRORS as err:
            log.info("%s: %s does not run there (%s)", device.info.spec, _label(node), err)
            costs[node] = math.inf
    return costs


@dataclass
class Candidate:
    """One placement measured end to end (``measured``: median seconds per run)."""

    name: str
    placement: dict[Node, str]
    estimated: float
    costs: tuple[float, ...] = ()
    error: str | None = None

    @property
    def measured(self) -> float | None:
        return statistics.median(self.costs) if self.costs else None

    def describe(self) -> str:
        """Which ops go where: ``opencl:0: conv, pool; host: softmax``."""
        by_device: dict[str, list[str]] = {}
        for node, spec in self.placement.items():
            by_device.setdefault(spec, []).append(_label(node))
        return "; ".join(f"{spec}: {', '.join(names)}" for spec, names in by_device.items())


@dataclass
class PlacementReport:
    """What automatic placement measured and why it chose what it chose."""

    devices: list[str]
    op_costs: dict[Node, dict[str, float]]
    copy_costs: dict[str, CopyCost]
    candidates: list[Candidate]
    chosen: str

    @property
    def measured(self) -> dict[str, float]:
        """Candidate name -> measured median seconds per run (those that ran)."""
        return {c.name: c.measured for c in self.candidates if c.measured is not None}

    @property
    def placement(self) -> dict[Node, str]:
        return next(c.placement for c in self.candidates if c.name == self.chosen)

    def format(self) -> str:
        """Op costs per device, copy costs, and each candidate's estimate and measured
        latency, the chosen one marked."""
        lines = [f"automatic placement over {', '.join(self.devices)}:", "  op costs (ms):"]
        for node, costs in self.op_costs.items():
            row = "  ".join(f"{d}={c * 1e3:.3f}" if math.isfinite(c) else f"{d}=n/a"
                            for d, c in costs.items())
            lines.append(f"    {_label(node):<24} {row}")
        for spec, cc in self.copy_costs.items():
            lines.append(f"  copies {spec}: upload {cc.upload_latency * 1e6:.1f} us + "
                         f"{cc.upload_bandwidth / 1e9:.2f} GB/s, download "
                         f"{cc.download_latency * 1e6:.1f} us + "
                         f"{cc.download_bandwidth / 1e9:.2f} GB/s")
        lines.append("  candidates (measured end to end, interleaved):")
        for c in self.candidates:
            got = (f"measured {c.measured * 1e3:.3f} ms" if c.measured is not None
                   else f"failed: {c.error}")
            mark = "  <- chosen" if c.name == self.chosen else ""
            lines.append(f"    {c.name:<16} estimated {c.estimated * 1e3:.3f} ms, {got}{mark}")
            if not c.name.startswith("all:"):
                lines.append(f"      {c.describe()}")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.format()


def _auto(graph: Graph, devices: Mapping[str, AnyDevice], records: RecordSource | None,
          number: int, repeat: int, seed: int) -> tuple[PlacementReport, HeteroModule]:
    """``auto_place``, also returning the winner's built module (``build_hetero`` keeps
    it rather than building it again)."""
    specs = list(devices)
    ops = placed_nodes(graph)
    rng = np.random.default_rng(seed)
    op_costs: dict[Node, dict[str, float]] = {n: {} for n in ops}
    copy_costs: dict[str, CopyCost] = {}
    for spec, dev in devices.items():
        if isinstance(dev, HostDevice):
            for node in ops:
                op_costs[node][spec] = 0.0 if node.op in ALIAS_OPS else dev.time_op(
                    node, repeat=repeat, rng=rng)
        else:
            copy_costs[spec] = measure_copy_cost(dev)
            for node, seconds in kernel_op_costs(graph, dev, records,
                                                 copy=copy_costs[spec]).items():
                op_costs[node][spec] = seconds
    stuck = [_label(n) for n in ops if not any(map(math.isfinite, op_costs[n].values()))]
    if stuck:
        raise ValueError(f"no device runs op(s) {', '.join(stuck)}")

    def cand(name: str, placement: dict[Node, str]) -> Candidate:
        if not all(math.isfinite(op_costs[n][d]) for n, d in placement.items()):
            return Candidate(name, placement, math.inf, error="an op does not run there")
        return Candidate(name, placement,
                         estimate_latency(graph, placement, op_costs, copy_costs))

    candidates = [cand("auto", choose_placement(graph, specs, op_costs, copy_costs))]
    candidates += [cand(f"all:{spec}", {n: spec for n in ops}) for spec in specs]
    # build each distinct placement once; identical ones share their measurement
    modules: dict[frozenset[tuple[int, str]], HeteroModule] = {}
    keyed: list[tuple[Candidate, frozenset[tuple[int, str]]]] = []
    for c in candidates:
        if c.error:
            continue
        key = frozenset((id(n), d) for n, d in c.placement.items())
        if key not in modules:
            try:
                modules[key] = assemble(graph, c.placement, devices, records)
            except _BUILD_ERRORS as err:
                c.error = str(err)
                continue
        keyed.append((c, key))
    if not modules:
        raise RuntimeError("no candidate placement builds")
    inputs = [random_value(n, rng) for n in graph.inputs]
    costs: dict[frozenset[tuple[int, str]], list[float]] = {k: [] for k in modules}
    for module in modules.values():
        module.run(inputs)  # warm-up
    for _ in range(repeat):  # interleaved: drift in the machine's load hits every one alike
        for key, module in modules.items():
            costs[key].append(module.time_runs(inputs, number))
    for c, key in keyed:
        c.costs = tuple(costs[key])
    measured = [c for c in candidates if c.measured is not None]
    best = min(measured, key=lambda c: c.measured or 0.0)
    report = PlacementReport(specs, op_costs, copy_costs, candidates, best.name)
    module = modules[frozenset((id(n), d) for n, d in best.placement.items())]
    module.auto_report = report
    return report, module


def auto_place(graph: Graph, devices: Mapping[str, AnyDevice],
               records: RecordSource | None = None, *, number: int = 3, repeat: int = 5,
               seed: int = 0) -> tuple[dict[Node, str], PlacementReport]:
    """The placement of ``graph`` (optimized) over ``devices`` (spec -> device; "host"
    for numpy) that ran fastest end to end: the estimated-best placement and every
    single-device one, each timed ``repeat`` x ``number`` runs, interleaved, after a
    warm-up. The report lists every candidate's estimate and measured median."""
    report, _ = _auto(graph, devices, records, number, repeat, seed)
    return report.placement, report


# ---------------------------------------------------------------- building


def _open(spec: str) -> Device:
    try:
        return open_device(spec)
    except (RuntimeError, ImportError, OSError) as err:
        raise ValueError(f"device {spec}: {err}") from None


def build_hetero(model: Model, placement: Mapping[str, str] | str | None = None,
                 default_device: str | None = None, records: RecordSource | None = None,
                 target: str | None = None, devices: Mapping[str, AnyDevice] | None = None,
                 *, auto: bool = False, optimized: bool = False, number: int = 3,
                 repeat: int = 5) -> HeteroModule:
    """Build ``model`` across devices.

    ``placement``: rules op-or-node-name -> device spec (``annotate_devices``), every
    other op on ``default_device``; or "auto" (as ``auto=True``): ``auto_place`` over the
    host and the kernel devices (``default_device`` and ``devices``). ``default_device``
    None: the first kernel device in ``devices``, else the local device for ``target``.
    ``records`` supplies tuned configs as for ``build_module.build``; ``devices`` lends
    already open devices (spec -> Device); the others are opened here."""
    graph = load_graph(model)
    if not optimized:
        graph = optimize(graph)
    opened: dict[str, AnyDevice] = {}
    for spec, dev in (devices or {}).items():
        opened[parse_device_spec(spec)] = dev
    opened.setdefault(HOST, HostDevice())
    if default_device is None:
        kernels = [s for s, d in opened.items() if not isinstance(d, HostDevice)]
        if kernels:
            default_device = kernels[0]
        else:
            dev = open_device(target=str(target) if target is not None else None)
            opened[dev.info.spec] = dev
            default_device = dev.info.spec
    default_device = parse_device_spec(default_device)
    if isinstance(placement, str):
        if placement.strip().lower() != "auto":
            raise ValueError(f"placement {placement!r}: rules (a mapping) or 'auto'")
        auto, placement = True, None
    rules = dict(placement or {})
    if auto and rules:
        raise ValueError("automatic placement takes no placement rules")
    wanted = [default_device]
    for key, spec in rules.items():
        try:
            wanted.append(parse_device_spec(spec))
        except ValueError as err:
            raise ValueError(f"placement rule {key}={spec}: {err}") from None
    for spec in wanted:
        if spec not in opened:
            opened[spec] = _open(spec)
    if auto:
        _, module = _auto(graph, opened, records, number, repeat, seed=0)
        return module
    where = annotate_devices(graph, rules, default_device, known=opened)
    return assemble(graph, where, opened, records)


__all__ = ["Candidate", "CopyCost", "HeteroModule", "PlacementReport", "Segment", "assemble",
           "auto_place", "build_hetero", "build_segment", "choose_placement",
           "estimate_latency", "kernel_op_costs", "measure_copy_cost", "segment_graph",
           "split_segments", "transfer_cost"]

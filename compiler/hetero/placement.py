"""Automatic placement: each op timed on each device, copy costs fitted, the placement
with the lowest estimated latency found, then measured end to end against every
single-device placement in one run; the fastest measured wins."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.build_module import lower, select_layers
from compiler.hetero.module import HeteroModule, assemble, label
from compiler.hetero.segments import BUILD_ERRORS, AnyDevice, Segment, build_segment
from compiler.ir import CONST, Graph, Node
from compiler.ir.ops import ALIAS_OPS
from compiler.passes.annotate_device import HOST, placed_nodes
from compiler.records import RecordSource
from compiler.runtime import Device
from compiler.runtime.executor import GraphExecutor
from compiler.runtime.host import HostDevice, random_value

log = logging.getLogger(__name__)


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
        # the templates a segment build runs, one step per op (no chain run in its
        # reader's load): each op gets its own time
        plan, _, _ = select_layers(graph, device.target, records, device.limits)
        program = lower(graph, plan, device.dialect, blocked_layout=False, fold_prologues=False)
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
    except BUILD_ERRORS as err:
        log.info("%s: the whole graph does not build (%s); profiling op by op",
                 device.info.spec, err)
    for node in stepped:
        inputs = [a for a in dict.fromkeys(node.inputs) if a.op != CONST]
        seg = Segment(0, device.info.spec, [node], inputs, [node])
        try:
            build_segment(seg, device, records)
            assert seg.executor is not None
            costs[node] = seg.executor.profile(number=number)[0].seconds
        except BUILD_ERRORS as err:
            log.info("%s: %s does not run there (%s)", device.info.spec, label(node), err)
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
            by_device.setdefault(spec, []).append(label(node))
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
            lines.append(f"    {label(node):<24} {row}")
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


def auto_build(graph: Graph, devices: Mapping[str, AnyDevice], records: RecordSource | None,
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
    stuck = [label(n) for n in ops if not any(map(math.isfinite, op_costs[n].values()))]
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
            except BUILD_ERRORS as err:
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
    report, _ = auto_build(graph, devices, records, number, repeat, seed)
    return report.placement, report

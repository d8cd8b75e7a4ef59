"""Segments of a placed graph: maximal runs of consecutive nodes on one device, each
lowered and built for its device (kernel devices) or run in numpy (the host)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from compiler.build_module import lower, select_layers
from compiler.ir import CONST, Graph, GraphBuilder, Node
from compiler.kernels import NoKernelError
from compiler.passes.annotate_device import DEVICE_COPY, placed_nodes
from compiler.records import Choice, RecordSource
from compiler.runtime import Device
from compiler.runtime.device import BuildError, DeviceRuntimeError
from compiler.runtime.executor import GraphExecutor, Program
from compiler.runtime.host import HostDevice
from compiler.tasks import Task

log = logging.getLogger(__name__)

AnyDevice = Device | HostDevice
# what a kernel device may fail with when an op does not build or run there
BUILD_ERRORS = (BuildError, DeviceRuntimeError, NoKernelError, ValueError)


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

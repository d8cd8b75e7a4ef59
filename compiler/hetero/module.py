"""``HeteroModule``: a placed graph's segments run in order, values handed over between
devices (the device_copy nodes), outputs back on the host."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from compiler.hetero.segments import (
    AnyDevice,
    Segment,
    build_segment,
    split_segments,
)
from compiler.ir import CONST, INPUT, Graph, Node
from compiler.ir.interpreter import Inputs, bind_inputs
from compiler.passes.annotate_device import DEVICE_COPY, insert_device_copy
from compiler.records import RecordSource, build_report
from compiler.runtime.executor import BenchmarkResult
from compiler.runtime.host import HostDevice, random_value

if TYPE_CHECKING:
    from compiler.hetero.placement import PlacementReport

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the module


def label(node: Node) -> str:
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
        raise RuntimeError(f"value {label(node)} is read before any segment computes it")

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
            reads = ", ".join(label(v) for v in seg.inputs) or "-"
            lines.append(f"  #{seg.index} {seg.device:<10} {len(seg.nodes)} ops{kernels}; "
                         f"reads {reads}")
        lines.append(f"copies: {len(self.copies)}")
        for copy in self.copies:
            lines.append(f"  {label(copy.inputs[0])}: {copy.attr('src_device')} -> "
                         f"{copy.attr('dst_device')}  {list(copy.ty.shape)} {copy.ty.dtype} "
                         f"{_size(copy.ty.nbytes)}")
        # a value two segments of one kernel device share goes through the host too
        again = {v for s in self.segments if s.executor is not None for v in s.inputs
                 if v.op not in (INPUT, DEVICE_COPY)}
        if again:
            lines.append(f"  + {len(again)} value(s) handed between segments of one device "
                         f"via the host: {', '.join(label(v) for v in again)}")
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

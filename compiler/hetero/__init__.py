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

from collections.abc import Mapping

from compiler.build_module import Model, load_graph
from compiler.hetero.module import HeteroModule, assemble
from compiler.hetero.placement import (
    Candidate,
    CopyCost,
    PlacementReport,
    auto_build,
    auto_place,
    choose_placement,
    estimate_latency,
    kernel_op_costs,
    measure_copy_cost,
    transfer_cost,
)
from compiler.hetero.segments import (
    AnyDevice,
    Segment,
    build_segment,
    segment_graph,
    split_segments,
)
from compiler.passes import optimize
from compiler.passes.annotate_device import HOST, annotate_devices, parse_device_spec
from compiler.records import RecordSource
from compiler.runtime import Device, open_device
from compiler.runtime.host import HostDevice

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
        _, module = auto_build(graph, opened, records, number, repeat, seed=0)
        return module
    where = annotate_devices(graph, rules, default_device, known=opened)
    return assemble(graph, where, opened, records)


__all__ = ["Candidate", "CopyCost", "HeteroModule", "PlacementReport", "Segment", "assemble",
           "auto_place", "build_hetero", "build_segment", "choose_placement",
           "estimate_latency", "kernel_op_costs", "measure_copy_cost", "segment_graph",
           "split_segments", "transfer_cost"]

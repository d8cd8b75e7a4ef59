"""Device annotation and device_copy insertion (TVM v0.5's heterogeneous runtime).

``annotate_devices`` says which device computes every op from simple rules ("conv2d
runs on opencl:0, nn.relu on the host"); ``insert_device_copy`` then makes every
hand-over between two devices an explicit ``device_copy`` node, so a printed graph
shows where data moves and ``compiler.hetero`` knows where to cut it into segments.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from compiler.ir import CONST, INPUT, Graph, GraphBuilder, Node, rewrite

log = logging.getLogger(__name__)

HOST = "host"  # numpy on the host CPU (compiler.runtime.host.HostDevice)
KERNEL_KINDS = ("opencl", "cuda")  # devices that run generated kernels
DEVICE_COPY = "device_copy"


def parse_device_spec(spec: str) -> str:
    """``spec`` in its canonical form ("host", "opencl:0", "cuda:1"; a bare "opencl" is
    index 0), or ValueError: a typo in a placement rule must not silently mean the
    default device."""
    text = spec.strip().lower()
    if text == HOST:
        return HOST
    kind, sep, index = text.partition(":")
    if kind in KERNEL_KINDS:
        if not sep:
            return f"{kind}:0"
        if index.isdigit():
            return f"{kind}:{int(index)}"
    raise ValueError(f"device {spec!r}: expected host, opencl:N or cuda:N")


def rule_matches(key: str, node: Node) -> bool:
    """``key`` names the op ("nn.relu"), its last dotted part ("conv2d" matches
    "nn.conv2d" and "fused.conv2d", "elementwise" matches "fused.elementwise") or the
    node ("conv1"): the names a user sees in a printed graph or an ONNX file."""
    return key in (node.op, node.op.rsplit(".", 1)[-1]) or (bool(node.name) and key == node.name)


def placed_nodes(graph: Graph) -> list[Node]:
    """The live op nodes, in graph order: the ones that get a device."""
    live = graph.live()
    return [n for n in graph.nodes if id(n) in live and n.op not in (INPUT, CONST)]


def _check_rules(rules: Mapping[str, str], default: str,
                 known: Collection[str] | None) -> tuple[list[tuple[str, str]], str]:
    checked = []
    for key, spec in rules.items():
        if not key.strip():
            raise ValueError(f"placement rule ={spec}: the op or node name is empty")
        try:
            checked.append((key.strip(), parse_device_spec(spec)))
        except ValueError as err:
            raise ValueError(f"placement rule {key}={spec}: {err}") from None
    default = parse_device_spec(default)
    if known is not None:
        have = {parse_device_spec(k) for k in known} | {HOST}
        for key, spec in [*checked, ("default", default)]:
            if spec not in have:
                raise ValueError(f"placement {key}={spec}: no such device here (devices: "
                                 f"{', '.join(sorted(have))})")
    return checked, default


def unmatched_rules(graph: Graph, rules: Mapping[str, str]) -> list[str]:
    """Rule keys that match no live op: worth a warning (an op fusion may have absorbed
    it, e.g. a relu in a conv's epilogue is ``fused.conv2d``, not ``nn.relu``)."""
    nodes = placed_nodes(graph)
    return [key for key in rules if not any(rule_matches(key.strip(), n) for n in nodes)]


def annotate_devices(graph: Graph, rules: Mapping[str, str], default: str,
                     known: Collection[str] | None = None) -> dict[Node, str]:
    """The device spec of every live op node: the first rule (in ``rules``' order) whose
    key matches it (``rule_matches``), else ``default``.

    Graph inputs and constants get no placement: a constant lives with its reader, a
    graph input is uploaded by each segment that reads it. ``known``: the device specs
    that exist here (``host`` always does); a rule naming another one is a ValueError,
    as is a spec that is not host/opencl:N/cuda:N."""
    checked, default = _check_rules(rules, default, known)
    for key in unmatched_rules(graph, dict(checked)):
        log.warning("placement rule %s matches no op of the graph", key)
    placement: dict[Node, str] = {}
    for node in placed_nodes(graph):
        if node.op == DEVICE_COPY and node.attr("dst_device"):
            placement[node] = parse_device_spec(node.attr("dst_device"))
            continue
        placement[node] = next((spec for key, spec in checked if rule_matches(key, node)),
                               default)
    return placement


def insert_device_copy(graph: Graph, placement: Mapping[Node, str]
                       ) -> tuple[Graph, dict[Node, str]]:
    """A copy of ``graph`` where every edge from an op on device A to a reader on device
    B goes through ``device_copy(x, src_device=A, dst_device=B)``: one copy per (value,
    destination), shared by all readers on that destination. Also the placement of the
    new graph, each copy placed on its destination.

    Graph inputs and constants are never copied (they have no device); graph outputs
    computed on a kernel device get no copy node either: the executor returns every
    output to the host."""
    copies: dict[tuple[Node, str], Node] = {}
    new_placement: dict[Node, str] = {}

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        dst = placement.get(node)
        if dst is None:
            return None
        moved = []
        for old, new in zip(node.inputs, args):
            src = placement.get(old)
            if src is None or src == dst:
                moved.append(new)
                continue
            key = (old, dst)
            if key not in copies:
                copy = b.call(DEVICE_COPY, [new], f"{old.name or old.op}->{dst}",
                              src_device=src, dst_device=dst)
                copies[key] = copy
                new_placement[copy] = dst
            moved.append(copies[key])
        if all(a is b_ for a, b_ in zip(moved, node.inputs)):
            out = b.add(node)
        else:
            out = b.call(node.op, moved, node.name, **node.attrs)
        new_placement[out] = dst
        return out

    return rewrite(graph, visit), new_placement


__all__ = ["DEVICE_COPY", "HOST", "KERNEL_KINDS", "annotate_devices", "insert_device_copy",
           "parse_device_spec", "placed_nodes", "rule_matches", "unmatched_rules"]

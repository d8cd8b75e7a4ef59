"""Task extraction: which templates can compute each conv2d / dense of an optimized
graph, with the AutoTVM workload its records are keyed by.

A layer has one candidate per template that computes it, in the order the device class
prefers (TVM's op strategy): ``conv2d_NCHWc.x86`` then ``conv2d_nchw.cuda`` on a CPU,
the reverse on a GPU. Tuning takes the preferred one; a build takes, per layer, the
candidate with the fastest record measured on this device (TVM's select_implementation),
else the first with any usable record, else the preferred one's default config.
Layers with equal workloads (ResNet repeats its blocks) are one task: tuned once, used
everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir import Graph, Node
from compiler.templates import get_template
from schemas import Target, Workload
from schemas.workload import tensor_arg

CONV_GPU, CONV_CPU = "conv2d_nchw.cuda", "conv2d_NCHWc.x86"
DENSE_SMALL, DENSE_LARGE, DENSE_CPU = ("dense_small_batch.gpu", "dense_large_batch.gpu",
                                       "dense_pack.x86")
# AutoTVM's CUDA strategy switches dense to the tiled schedule from this batch size on.
LARGE_BATCH = 32


@dataclass
class Task:
    """One workload to tune, and the layers (node names) that will run its kernel."""

    workload: Workload
    layers: list[str] = field(default_factory=list)

    @property
    def template(self) -> str:
        return self.workload.template

    @property
    def flops(self) -> int:
        return get_template(self.template).flops(self.workload)

    @property
    def total_flops(self) -> int:
        return self.flops * len(self.layers)


def _conv_args(node: Node) -> list:
    return [tensor_arg(node.inputs[0].ty.shape), tensor_arg(node.inputs[1].ty.shape),
            list(node.attr("strides")), list(node.attr("padding")), list(node.attr("dilation"))]


def candidates(node: Node, target: Target | None = None) -> list[Workload]:
    """The template workloads that can compute ``node``, preferred first; empty for ops
    no template covers (grouped and depthwise convolutions run a plain kernel)."""
    cpu = target is not None and target.device_class == "cpu"
    # CPU templates pack the weight at build time: only a constant weight can be packed
    packable = node.inputs[1].is_const if len(node.inputs) > 1 else False
    found: list[Workload] = []
    if node.op in ("nn.conv2d", "fused.conv2d"):
        if node.attr("groups") != 1:
            return []
        gpu = Workload(template=CONV_GPU, args=[*_conv_args(node), "float32"])
        host = Workload(template=CONV_CPU, args=[*_conv_args(node), "NCHW", "NCHW", "float32"])
        found = [host, gpu] if cpu else [gpu, host]
    elif node.op in ("nn.dense", "fused.dense"):
        data, weight = node.inputs[0].ty.shape, node.inputs[1].ty.shape
        args = [tensor_arg(data), tensor_arg(weight), None, "float32"]
        gpu = Workload(template=DENSE_LARGE if data[0] >= LARGE_BATCH else DENSE_SMALL, args=args)
        host = Workload(template=DENSE_CPU, args=args)
        found = [host, gpu] if cpu else [gpu, host]
    return [w for w in found if packable or not get_template(w.template).packs_weight]


def node_workload(node: Node, target: Target | None = None) -> Workload | None:
    """The preferred template workload of ``node``, or None when no template fits it."""
    found = candidates(node, target)
    return found[0] if found else None


def extract_tasks(graph: Graph, target: Target | None = None,
                  every_candidate: bool = False) -> list[Task]:
    """Tasks in first-use order: each conv2d/dense layer's preferred workload (with
    ``every_candidate``, each of its candidates: what a build chooses among)."""
    tasks: dict[str, Task] = {}
    live = graph.live()
    for node in graph.nodes:
        if id(node) not in live:
            continue
        found = candidates(node, target)
        for workload in found if every_candidate else found[:1]:
            task = tasks.setdefault(workload.key, Task(workload))
            task.layers.append(node.name or node.op)
    return list(tasks.values())

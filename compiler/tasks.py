"""Task extraction: which template computes each conv2d / dense of an optimized graph,
with the AutoTVM workload its records are keyed by.

Layers with equal workloads (ResNet repeats its blocks) are one task: tuned once,
used everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir import Graph, Node
from compiler.templates import get_template
from schemas import Target, Workload
from schemas.workload import tensor_arg

CONV_TEMPLATE = "conv2d_nchw.cuda"
DENSE_SMALL, DENSE_LARGE = "dense_small_batch.gpu", "dense_large_batch.gpu"
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


def node_workload(node: Node, target: Target | None = None) -> Workload | None:
    """The template workload of a conv2d/dense node, or None when no template fits it
    (grouped and depthwise convolutions run a plain kernel)."""
    del target  # CPU-class templates will choose by target; the GPU ones run anywhere
    if node.op in ("nn.conv2d", "fused.conv2d"):
        if node.attr("groups") != 1:
            return None
        data, weight = node.inputs[0].ty.shape, node.inputs[1].ty.shape
        return Workload(template=CONV_TEMPLATE, args=[
            tensor_arg(data), tensor_arg(weight), list(node.attr("strides")),
            list(node.attr("padding")), list(node.attr("dilation")), "float32"])
    if node.op in ("nn.dense", "fused.dense"):
        data, weight = node.inputs[0].ty.shape, node.inputs[1].ty.shape
        template = DENSE_LARGE if data[0] >= LARGE_BATCH else DENSE_SMALL
        return Workload(template=template,
                        args=[tensor_arg(data), tensor_arg(weight), None, "float32"])
    return None


def extract_tasks(graph: Graph, target: Target | None = None) -> list[Task]:
    """Tasks in first-use order; every conv2d/dense layer a template computes is in one."""
    tasks: dict[str, Task] = {}
    live = graph.live()
    for node in graph.nodes:
        if id(node) not in live:
            continue
        workload = node_workload(node, target)
        if workload is None:
            continue
        task = tasks.setdefault(workload.key, Task(workload))
        task.layers.append(node.name or node.op)
    return list(tasks.values())

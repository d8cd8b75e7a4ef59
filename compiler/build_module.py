"""model + target + records -> a module that runs on the device.

The pipeline: import (ONNX) -> optimize (fold constants and batch-norm, fuse epilogues)
-> extract tasks -> pick each task's config (records fallback chain) -> lower every op
to a kernel (templates for conv2d/dense, plain kernels for the rest) -> plan buffers and
build the kernels in a graph executor.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir import CONST, INPUT, Graph, IRError, Node, TensorType
from compiler.ir.ops import ALIAS_OPS
from compiler.kernels import lower as lower_plain
from compiler.passes import optimize
from compiler.records import (
    DEFAULT,
    OTHER_DEVICE,
    Choice,
    RecordSource,
    build_report,
    choose_configs,
)
from compiler.runtime import Device, open_device
from compiler.runtime.executor import BenchmarkResult, GraphExecutor, Program, Step, StepTime
from compiler.tasks import Task, candidates, extract_tasks
from compiler.templates import Epilogue, get_template
from schemas import DeviceLimits, Target

log = logging.getLogger(__name__)

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

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.executor.run(inputs)

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
          optimized: bool = False) -> Module:
    """Compile ``model`` for the local device matching ``target`` (or ``device``).

    ``records`` supplies tuned configs; without it every task runs its template's default.
    ``optimized``: ``model`` is a graph the passes already ran on.
    """
    if device is None:
        device = open_device(target=str(target) if target is not None else None)
    graph = load_graph(model)
    if not optimized:
        graph = optimize(graph)
    plan, tasks, choices = select_layers(graph, device.target, records, device.limits)
    program = lower(graph, plan, device.dialect)
    module = Module(graph, tasks, choices, program, GraphExecutor(program, device), device)
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
                  limits: DeviceLimits) -> tuple[dict[Node, Choice], list[Task], list[Choice]]:
    """Each conv2d/dense layer's template and config (TVM's select_implementation): of
    its candidates, the one with the fastest record measured on this device; else the
    first (in the device class's order) with another device's record; else the
    preferred candidate's default. Also the chosen tasks and their choices, for the
    report."""
    every = extract_tasks(graph, target, every_candidate=True)
    found = choose_configs([t.workload for t in every], records, target, limits)
    by_key = {t.workload.key: c for t, c in zip(every, found)}
    plan: dict[Node, Choice] = {}
    tasks: dict[str, Task] = {}
    live = graph.live()
    for node in graph.nodes:
        options = [by_key[w.key] for w in candidates(node, target)] if id(node) in live else []
        if not options:
            continue
        measured = [c for c in options if c.cost is not None]
        others = [c for c in options if c.source == OTHER_DEVICE]
        choice = (min(measured, key=lambda c: c.cost or 0.0) if measured
                  else others[0] if others else options[0])
        plan[node] = choice
        task = tasks.setdefault(choice.workload.key, Task(choice.workload))
        task.layers.append(node.name or node.op)
    chosen = list(tasks.values())
    return plan, chosen, [by_key[t.workload.key] for t in chosen]


def lower(graph: Graph, plan: Mapping[Node, Choice], dialect: str) -> Program:
    """One step per op: conv2d/dense layers in ``plan`` run their template with the
    chosen config; reshapes alias their input; everything else gets a plain kernel. No
    device needed: the same program lowers to CUDA C for a GPU machine as to OpenCL C
    here."""
    ids: dict[Node, int] = {}
    program = Program(values=[], inputs=[], outputs=[], constants={}, steps=[], aliases={})

    def value_id(node: Node) -> int:
        if node not in ids:
            ids[node] = len(program.values)
            program.values.append(node.ty)
        return ids[node]

    live = graph.live()
    for node in graph.inputs:
        program.inputs.append((node.name, value_id(node)))
    for node in graph.nodes:
        if id(node) not in live or node.op == INPUT:
            continue
        vid = value_id(node)
        if node.op == CONST:
            assert node.value is not None
            program.constants[vid] = np.ascontiguousarray(node.value, dtype=np.float32)
            continue
        args = tuple(value_id(a) for a in node.inputs)
        if node.op in ALIAS_OPS:
            program.aliases[vid] = args[0]
            continue
        choice = plan.get(node)
        if choice is not None:
            workload = choice.workload
            template = get_template(workload.template)
            kernel = template.codegen(workload, choice.config, dialect,
                                      Epilogue(tuple(node.attr("epilogue", ()))))
            if template.packs_weight:  # the packed copy is this step's own constant
                weight = node.inputs[1].value
                assert weight is not None, "templates that pack weights need constant ones"
                packed = len(program.values)
                program.values.append(TensorType(kernel.buffers[1].shape))
                program.constants[packed] = np.ascontiguousarray(
                    template.pack_weight(workload, choice.config, weight), dtype=np.float32)
                args = (args[0], packed, *args[2:])
        else:
            kernel = lower_plain(node, dialect)
        program.steps.append(Step(f"{node.op} {node.name}".strip(), kernel, (*args, vid)))
    for node in graph.outputs:
        if node.ty.dtype != "float32":
            raise IRError(f"output {node.name or node.op} is {node.ty.dtype}: device programs "
                          "compute float32 outputs only")
    program.outputs = [value_id(n) for n in graph.outputs]
    # a weight a template packed is read in its packed copy only: do not upload both
    read = {v for step in program.steps for v in step.args} | set(program.outputs)
    read |= {program.aliases[v] for v in read if v in program.aliases}
    program.constants = {v: a for v, a in program.constants.items() if v in read}
    return program

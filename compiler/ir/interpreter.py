"""Run a graph in numpy: the semantics every pass and every device build is checked against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from compiler.ir.graph import CONST, INPUT, Graph, IRError, Node
from compiler.ir.ops import evaluate_op

Inputs = Mapping[str, np.ndarray] | Sequence[np.ndarray]


def bind_inputs(graph: Graph, inputs: Inputs) -> dict[Node, np.ndarray]:
    """Match arrays to graph inputs (by name or position) and check their shapes."""
    if isinstance(inputs, Mapping):
        missing = [n.name for n in graph.inputs if n.name not in inputs]
        if missing:
            raise IRError(f"missing input(s): {', '.join(missing)}")
        arrays = [inputs[n.name] for n in graph.inputs]
    else:
        if len(inputs) != len(graph.inputs):
            raise IRError(f"the graph takes {len(graph.inputs)} input(s), got {len(inputs)}")
        arrays = list(inputs)
    bound = {}
    for node, array in zip(graph.inputs, arrays):
        array = np.asarray(array)
        if tuple(array.shape) != node.ty.shape:
            raise IRError(f"input {node.name}: shape {list(array.shape)}, "
                          f"expected {list(node.ty.shape)}")
        bound[node] = np.ascontiguousarray(array, dtype=node.ty.dtype)
    return bound


def evaluate(graph: Graph, inputs: Inputs) -> list[np.ndarray]:
    values = bind_inputs(graph, inputs)
    needed = graph.live()
    for node in graph.nodes:
        if id(node) not in needed or node in values:
            continue
        if node.op == CONST:
            values[node] = node.value  # type: ignore[assignment]
        elif node.op == INPUT:
            raise IRError(f"input {node.name} is not a graph input")
        else:
            values[node] = evaluate_op(node.op, [values[a] for a in node.inputs], node.attrs)
    return [values[n] for n in graph.outputs]


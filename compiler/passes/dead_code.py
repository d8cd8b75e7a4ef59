"""Dead-code elimination: keep only what the outputs need (graph inputs always stay)."""

from __future__ import annotations

from compiler.ir import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    live = graph.live()
    keep = [n for n in graph.nodes if id(n) in live or n in graph.inputs]
    return Graph(list(graph.inputs), list(graph.outputs), keep)

"""Relay-like text: ``%3 = nn.conv2d(%2, %w, strides=[1, 1], ...)  # ty=Tensor[...]``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from compiler.ir.graph import CONST, INPUT, Graph, Node


def _ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def _attr(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_attr(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return f"{value:g}f"
    return str(value)


def print_graph(graph: Graph, placement: Mapping[Node, str] | None = None) -> str:
    """The graph as text; with ``placement`` (``compiler.passes.annotate_device``) each
    op's comment also names its device (`` device=opencl:0``)."""
    names: dict[Node, str] = {}
    taken: set[str] = set()

    def unique(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    for node in graph.inputs:
        names[node] = "%" + unique(_ident(node.name) or "input")
    live = graph.live()
    lines, counter = [], 0
    for node in graph.nodes:
        if id(node) not in live or node in names:
            continue
        if node.op == CONST:
            if node.ty.size == 1:
                value = node.value.reshape(()).item()  # type: ignore[union-attr]
                names[node] = f"{value:g}f" if isinstance(value, float) else str(value)
            else:
                names[node] = "%" + unique(_ident(node.name) or "const")
            continue
        if node.op == INPUT:
            names[node] = "%" + unique(_ident(node.name) or "input")
            continue
        args = [names[a] for a in node.inputs]
        args += [f"{k}={_attr(v)}" for k, v in node.attrs.items()]
        names[node] = f"%{counter}"
        counter += 1
        where = f" device={placement[node]}" if placement and node in placement else ""
        lines.append(f"  {names[node]} = {node.op}({', '.join(args)})  # ty={node.ty}{where}")
    params = ", ".join(f"{names[n]}: {n.ty}" for n in graph.inputs)
    consts = [n for n in graph.nodes if n.op == CONST and id(n) in live and n.ty.size > 1]
    header = [f"fn ({params}) {{"]
    if consts:
        header.append(f"  // {len(consts)} constants, "
                      f"{sum(c.ty.nbytes for c in consts) / 2**20:.1f} MiB")
    outs = [names[n] for n in graph.outputs]
    tail = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    return "\n".join(header + lines + [f"  {tail}", "}"]) + "\n"


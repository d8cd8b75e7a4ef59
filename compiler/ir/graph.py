"""The dataflow graph: single-output nodes in topological order, built and rewritten
through a builder so every node's type is inferred (and checked) when it is made."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.types import TensorType

INPUT, CONST = "input", "const"


class IRError(ValueError):
    """A graph that cannot be typed: the message names the op and the node."""


@dataclass(frozen=True, eq=False)
class Node:
    """One value: a graph input, a constant, or an op applied to earlier nodes.

    Compared by identity: two convolutions with equal attributes are different layers.
    """

    op: str
    inputs: tuple[Node, ...]
    attrs: dict[str, Any]
    ty: TensorType
    name: str = ""
    value: np.ndarray | None = field(default=None, repr=False)

    @property
    def is_const(self) -> bool:
        return self.op == CONST

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


@dataclass
class Graph:
    """``nodes`` holds every node made for this graph (dead ones too, until DCE)."""

    inputs: list[Node]
    outputs: list[Node]
    nodes: list[Node]

    def live(self) -> set[int]:
        """ids of the nodes the outputs depend on."""
        seen: set[int] = set()
        stack = list(self.outputs)
        while stack:
            node = stack.pop()
            if id(node) not in seen:
                seen.add(id(node))
                stack.extend(node.inputs)
        return seen

    def users(self) -> dict[Node, list[Node]]:
        """Who among the live nodes reads each node (a graph output counts as ``None``)."""
        out: dict[Node, list[Any]] = {n: [] for n in self.nodes}
        live = self.live()
        for node in self.nodes:
            if id(node) not in live:
                continue
            for arg in node.inputs:
                out[arg].append(node)
        for node in self.outputs:
            out[node].append(None)
        return out

    def ops(self) -> list[Node]:
        return [n for n in self.nodes if n.op not in (INPUT, CONST)]

    def constants(self) -> list[Node]:
        return [n for n in self.nodes if n.op == CONST]


class GraphBuilder:
    """Makes typed nodes and remembers their order."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.inputs: list[Node] = []
        self._seen: set[int] = set()
        # during ``rewrite``: each visited old node -> its replacement
        self.mapping: dict[Node, Node] = {}

    def add(self, node: Node) -> Node:
        if id(node) not in self._seen:
            self._seen.add(id(node))
            self.nodes.append(node)
        return node

    def input(self, name: str, shape: Iterable[int], dtype: str = "float32") -> Node:
        node = self.add(Node(INPUT, (), {}, TensorType(tuple(int(d) for d in shape), dtype),
                             name))
        self.inputs.append(node)
        return node

    def const(self, value: Any, name: str = "", dtype: str | None = None) -> Node:
        array = np.asarray(value, dtype=dtype)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        array.setflags(write=False)
        return self.add(Node(CONST, (), {}, TensorType.of(array), name, array))

    def call(self, op: str, inputs: Iterable[Node], name: str = "", **attrs: Any) -> Node:
        from compiler.ir.ops import get_op

        args = tuple(inputs)
        for arg in args:
            self.add(arg)
        opdef = get_op(op, name)
        try:
            attrs = opdef.normalize(attrs)
            ty = opdef.infer([a.ty for a in args], attrs)
        except IRError as err:
            raise IRError(f"{op} {name or '(unnamed)'}: {err}") from None
        except (ValueError, IndexError, TypeError) as err:
            raise IRError(f"{op} {name or '(unnamed)'}: {err}") from None
        return self.add(Node(op, args, attrs, ty, name))

    def finish(self, outputs: Iterable[Node]) -> Graph:
        outs = list(outputs)
        for node in outs:
            self.add(node)
        return Graph(list(self.inputs), outs, list(self.nodes))


Rewriter = Callable[[GraphBuilder, Node, tuple[Node, ...]], Node | None]


def rewrite(graph: Graph, fn: Rewriter) -> Graph:
    """Visit nodes in order; ``fn`` returns a replacement (made with the builder) or None
    to keep the node over its (possibly replaced) inputs. ``builder.mapping`` gives the
    replacement of any node visited before."""
    builder = GraphBuilder()
    mapping = builder.mapping
    for node in graph.nodes:
        args = tuple(mapping[a] for a in node.inputs)
        new = fn(builder, node, args)
        if new is None:
            if node.op == INPUT:
                new = builder.add(node)
                builder.inputs.append(node)
            elif all(a is b for a, b in zip(args, node.inputs)):
                new = builder.add(node)
            else:
                new = builder.call(node.op, args, node.name, **node.attrs)
        mapping[node] = builder.add(new)
    missing = [n for n in graph.inputs if n not in builder.inputs]
    builder.inputs.extend(missing)  # a rewrite never drops a graph input
    return builder.finish(mapping[n] for n in graph.outputs)

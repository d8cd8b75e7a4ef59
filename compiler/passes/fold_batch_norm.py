"""Batch-norm folding: inference batch-norm is a per-channel scale and shift; where it
follows a conv2d or dense, the scale goes into the weights and the shift into a bias.

Three rewrites, in order:
1. ``nn.batch_norm`` becomes ``multiply`` + ``add`` by per-channel constants;
2. a per-channel ``multiply`` right after conv2d/dense (through its bias_add) scales the
   weights (and that bias) instead: ``conv(x, w) * s == conv(x, w * s)``;
3. a per-channel ``add`` of a constant becomes ``nn.bias_add`` (merged into an earlier
   bias), which op fusion then puts into the kernel's epilogue.
A batch-norm that cannot fold (DenseNet's pre-activation BN) stays a scale and shift.
"""

from __future__ import annotations

import numpy as np

from compiler.ir import Graph, GraphBuilder, Node, rewrite
from compiler.ir.ops import batch_norm_scale_shift

PRODUCERS = frozenset({"nn.conv2d", "nn.dense"})


def per_channel(const: Node, out: Node) -> np.ndarray | None:
    """The constant as one value per channel (axis 1) of ``out``, or None if it varies
    along any other axis or would change the output's shape by broadcasting."""
    if not const.is_const or const.value is None or out.ty.ndim < 2:
        return None
    value = const.value
    if value.ndim > out.ty.ndim:
        return None
    shape = (1,) * (out.ty.ndim - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    channels = out.ty.shape[1]
    if shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1) if value.size else value,
                           (channels,)).astype(np.float32)


def decompose_batch_norm(graph: Graph) -> Graph:
    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        if node.op != "nn.batch_norm" or not all(a.is_const for a in args[1:]):
            return None
        scale, shift = batch_norm_scale_shift(*(a.value for a in args[1:]),  # type: ignore[misc]
                                              node.attr("epsilon"))
        axis = node.attr("axis") % node.ty.ndim
        shape = [1] * (node.ty.ndim - axis)
        shape[0] = -1
        scaled = b.call("multiply", [args[0], b.const(scale.reshape(shape), f"{node.name}.scale")],
                        f"{node.name}.scale")
        return b.call("add", [scaled, b.const(shift.reshape(shape), f"{node.name}.shift")],
                      node.name)

    return rewrite(graph, visit)


def _scale_operand(node: Node) -> int | None:
    """Which input of a conv/dense/per-channel multiply a later scale can be folded into."""
    if node.op in PRODUCERS:
        return 1 if node.inputs[1].is_const else None
    if node.op == "multiply":
        for k in (1, 0):
            if per_channel(node.inputs[k], node) is not None and \
                    node.inputs[1 - k].ty.shape == node.ty.shape:
                return k
    return None


def _producer_chain(node: Node, users: dict[Node, list]) -> bool:
    """Whether ``node`` is a conv/dense/per-channel multiply, optionally followed by a
    constant bias_add, each read only once: a per-channel scale after it can fold in."""
    if node.op == "nn.bias_add" and node.inputs[1].is_const:
        if len(users[node]) != 1 or node.attr("axis") % node.ty.ndim != 1:
            return False
        node = node.inputs[0]
    return _scale_operand(node) is not None and len(users[node]) == 1


def fold_scale(graph: Graph) -> Graph:
    users = graph.users()

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        if node.op != "multiply" or node.ty.dtype != "float32":
            return None
        for src, const in ((0, 1), (1, 0)):
            scale = per_channel(node.inputs[const], node)
            if scale is None or args[src].ty.shape != node.ty.shape:
                continue
            if not _producer_chain(node.inputs[src], users):
                continue
            tail = args[src]  # the chain as rewritten so far; only this multiply reads it
            bias = tail if tail.op == "nn.bias_add" else None
            producer = tail.inputs[0] if bias is not None else tail
            k = _scale_operand(producer)
            if k is None:
                continue
            folded = _scaled(b, producer, k, scale)
            if bias is None:
                return folded
            old = bias.inputs[1].value
            assert old is not None
            return b.call("nn.bias_add", [folded, b.const(old * scale, bias.inputs[1].name)],
                          bias.name, **bias.attrs)
        return None

    return rewrite(graph, visit)


def _scaled(b: GraphBuilder, producer: Node, k: int, scale: np.ndarray) -> Node:
    """``producer`` with its operand ``k`` (weights, or a per-channel factor) times scale."""
    operand = producer.inputs[k]
    if producer.op == "multiply":
        factor = per_channel(operand, producer)
        assert factor is not None
        value = (factor * scale).reshape((-1,) + (1,) * (producer.ty.ndim - 2))
    else:
        assert operand.value is not None
        value = operand.value * scale.reshape((-1,) + (1,) * (operand.value.ndim - 1))
    inputs = list(producer.inputs)
    inputs[k] = b.const(value, operand.name)
    return b.call(producer.op, inputs, producer.name, **producer.attrs)


def add_to_bias(graph: Graph) -> Graph:
    users = graph.users()

    def visit(b: GraphBuilder, node: Node, args: tuple[Node, ...]) -> Node | None:
        if node.ty.dtype != "float32":
            return None  # quantized arithmetic: its constants are exact, leave them be
        if node.op == "nn.bias_add" and node.attr("axis") % node.ty.ndim == 1:
            src, shift = 0, args[1].value  # a bias is per channel by definition
        elif node.op == "add":
            src = 1 if args[0].is_const else 0
            shift = per_channel(args[1 - src], node)
        else:
            return None
        base = args[src]
        if shift is None or base.ty.shape != node.ty.shape:
            return None
        if (base.op == "nn.bias_add" and base.inputs[1].is_const
                and base.attr("axis") % base.ty.ndim == 1 and len(users[node.inputs[src]]) == 1):
            merged = base.inputs[1].value + shift  # type: ignore[operator]
            return b.call("nn.bias_add", [base.inputs[0], b.const(merged, f"{node.name}.bias")],
                          node.name, axis=1)
        if node.op == "add":
            return b.call("nn.bias_add", [base, b.const(shift, f"{node.name}.bias")], node.name,
                          axis=1)
        return None

    return rewrite(graph, visit)


def fold_batch_norm(graph: Graph) -> Graph:
    # Repeat to a fixed point: DenseNet scales and shifts twice after each conv
    # (batch-norm, then an explicit Mul and Add), and each fold enables the next.
    graph = decompose_batch_norm(graph)
    while True:
        folded = add_to_bias(fold_scale(graph))
        if folded.live() == graph.live():
            return folded
        graph = folded

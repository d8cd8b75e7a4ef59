"""int8 quantization with TVM v0.5's qconfig: annotate, calibrate and realize in one walk.

What TVM v0.5 did (``relay.quantize`` with the same qconfig names, meanings and
defaults), and where we differ:

- every ``nn.conv2d`` after the first ``skip_k_conv`` ones takes int8 data and int8
  weights and accumulates in int32 (``out_dtype="int32"``);
- scales are powers of two (no calibration data): an input's scale is ``global_scale /
  2**(nbit_input - 1)``, a weight's ``2**ceil(log2(max|w|)) / 2**(nbit_weight - 1)``,
  values clipped to ``±(2**(nbit - 1) - 1)``;
- a conv's int32 output has scale ``s_input * s_weight``; bias and constants added to it
  are quantized to that scale, in int32 (v0.5 quantized them as 8-bit weights: this
  keeps more of the bias); an ``add`` of two int32 values brings both to the finer
  scale (a left shift, exact), of an int8 and an int32 value to the int8's; going from
  int32 back to int8 is a right shift (scales are powers of two apart), rounding with
  ``round_for_shift``, flooring without, as TVM;
- ``store_lowbit_output``: an int32 result is requantized to int8 as soon as a reader
  other than bias_add / relu / add needs it, so tensors between layers are stored in
  int8 (off: they stay int32 and each reader converts);
- ops without an integer form (pooling, dense, softmax...) get a float32 value back:
  ``multiply(cast(x, "float32"), scale)``;
- convs the int8 template cannot take stay float: grouped ones, input channels not a
  multiple of 4 (dp4a packs four), and weights so small that requantizing would shift
  by more than ``MAX_SHIFT`` bits.

The result is plain IR: multiply / round / clip / cast / right_shift around int8 convs,
as ``--print-ir`` shows; ``fuse_ops`` later folds each conv's bias, shift, residual,
relu and int8 store into the int8 template's epilogue.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir import CONST, INPUT, Graph, GraphBuilder, Node
from compiler.ir.ops import round_half_away
from compiler.passes.dead_code import eliminate_dead_code
from compiler.passes.fold_batch_norm import fold_batch_norm
from compiler.passes.fold_constant import fold_constant

# readers that keep a value in the int32 domain without requantizing it first
_INT32_READERS = frozenset({"nn.bias_add", "nn.relu", "add"})
# int8 packs four input channels per dp4a word: convs with other channel counts stay float
CHANNEL_PACK = 4
# largest requantize shift (bits): convs whose weights would need more stay float
MAX_SHIFT = 24


class QuantizeError(ValueError):
    """A qconfig this compiler cannot realize; names the key."""


@dataclass(frozen=True)
class QConfig:
    """TVM v0.5's ``relay.quantize.qconfig``: same names, meanings and defaults."""

    nbit_input: int = 8
    nbit_weight: int = 8
    nbit_activation: int = 32
    dtype_input: str = "int8"
    dtype_weight: str = "int8"
    dtype_activation: str = "int32"
    global_scale: float = 8.0
    skip_k_conv: int = 1
    round_for_shift: bool = True
    store_lowbit_output: bool = True

    def __post_init__(self) -> None:
        for key in ("nbit_input", "nbit_weight"):
            if not 2 <= getattr(self, key) <= 8:
                raise QuantizeError(f"{key}={getattr(self, key)}: 2 to 8 bits (stored in "
                                    "int8) are supported")
        for key in ("dtype_input", "dtype_weight"):
            if getattr(self, key) != "int8":
                raise QuantizeError(f"{key}={getattr(self, key)!r}: the int8 conv template "
                                    "takes int8 only")
        if self.nbit_activation != 32 or self.dtype_activation != "int32":
            raise QuantizeError("nbit_activation=32 / dtype_activation='int32' only: the "
                                "int8 conv accumulates in int32")
        if not (self.global_scale > 0 and math.isfinite(self.global_scale)):
            raise QuantizeError(f"global_scale={self.global_scale}: must be > 0")
        if self.skip_k_conv < 0:
            raise QuantizeError(f"skip_k_conv={self.skip_k_conv}: must be >= 0")

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> QConfig:
        """``["global_scale=4", "skip_k_conv=0"]`` (the CLI's ``--qconfig`` values)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for pair in pairs:
            key, sep, text = pair.partition("=")
            key, text = key.strip(), text.strip()
            if not sep or key not in fields:
                raise QuantizeError(f"qconfig {pair!r}: expected KEY=VALUE with KEY one of "
                                    f"{', '.join(fields)}")
            values[key] = _parse_value(key, fields[key].type, text)
        return cls(**values)

    @property
    def input_scale(self) -> float:
        return self.global_scale / 2 ** (self.nbit_input - 1)

    @property
    def input_max(self) -> int:
        return 2 ** (self.nbit_input - 1) - 1

    def weight_scale(self, weight: np.ndarray) -> float:
        top = float(np.max(np.abs(weight))) if weight.size else 0.0
        power = 2.0 ** math.ceil(math.log2(top)) if top > 0 else 1.0
        return power / 2 ** (self.nbit_weight - 1)


def _parse_value(key: str, kind: Any, text: str) -> Any:
    kind = kind if isinstance(kind, str) else kind.__name__
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text.strip("'\"")
    except ValueError:
        raise QuantizeError(f"qconfig {key}={text!r}: expected a {kind}") from None


@dataclass(frozen=True)
class _Q:
    """A value of the quantized graph: its node, kind (float / int8 / int32), scale."""

    node: Node
    kind: str
    scale: float = 1.0


class _Realizer:
    def __init__(self, graph: Graph, config: QConfig) -> None:
        self.graph = graph
        self.config = config
        self.b = GraphBuilder()
        self.users = graph.users()
        self.values: dict[Node, _Q] = {}
        self.int8_cache: dict[Node, Node] = {}
        self.convs_seen = 0

    # ---- conversions between kinds

    def const(self, value: Any, dtype: str, name: str = "") -> Node:
        return self.b.const(np.asarray(value, dtype=dtype), name)

    def as_float(self, q: _Q) -> Node:
        if q.kind == "float":
            return q.node
        real = self.b.call("cast", [q.node], dtype="float32")
        return self.b.call("multiply", [real, self.const(q.scale, "float32")])

    def as_int8(self, q: _Q) -> Node:
        """int8 at the input scale, made once per value."""
        if q.kind == "int8":
            return q.node
        if q.node in self.int8_cache:
            return self.int8_cache[q.node]
        cfg = self.config
        if q.kind == "float":
            scaled = self.b.call("multiply", [q.node, self.const(1 / cfg.input_scale,
                                                                  "float32")])
            value = self.b.call("round", [scaled])
        else:
            value = self.rescale(q.node, q.scale, cfg.input_scale)
        top = cfg.input_max
        clipped = self.b.call("clip", [value], a_min=-top, a_max=top)
        out = self.b.call("cast", [clipped], dtype="int8")
        self.int8_cache[q.node] = out
        return out

    def as_int32(self, q: _Q, scale: float) -> Node:
        node = q.node if q.kind == "int32" else self.b.call("cast", [q.node], dtype="int32")
        return self.rescale(node, q.scale, scale)

    def rescale(self, node: Node, scale: float, target: float) -> Node:
        """An int32 value at ``scale`` re-expressed at ``target``. Scales here are powers
        of two apart: to a coarser scale a right shift, rounding (``round_for_shift``:
        add half first) or flooring (off, as TVM); to a finer one an exact multiply.
        Other ratios (not produced by this pass) go through float multiply and round."""
        ratio = target / scale
        shift = round(math.log2(ratio)) if ratio > 0 else 0
        if abs(ratio - 2.0 ** shift) > 1e-9 * ratio:
            real = self.b.call("cast", [node], dtype="float32")
            scaled = self.b.call("multiply", [real, self.const(1 / ratio, "float32")])
            return self.b.call("cast", [self.b.call("round", [scaled])], dtype="int32")
        if shift == 0:
            return node
        if shift < 0:
            return self.b.call("multiply", [node, self.const(2 ** -shift, "int32")])
        if self.config.round_for_shift:
            node = self.b.call("add", [node, self.const(1 << (shift - 1), "int32")])
        return self.b.call("right_shift", [node, self.const(shift, "int32")])

    # ---- the walk

    def quantizable_conv(self, node: Node) -> bool:
        if node.op != "nn.conv2d":
            return False
        self.convs_seen += 1
        if self.convs_seen <= self.config.skip_k_conv:
            return False
        data, weight = node.inputs
        if not (node.attr("groups") == 1 and weight.is_const
                and data.ty.shape[1] % CHANNEL_PACK == 0):
            return False
        # requantizing shifts by log2(1 / weight scale) bits: keep them in an int32 shift
        assert weight.value is not None
        return self.config.weight_scale(weight.value) >= 2.0 ** -MAX_SHIFT

    def visit(self, node: Node) -> _Q:
        if node.op in (INPUT, CONST):
            return _Q(self.b.add(node), "float")
        ins = [self.values[a] for a in node.inputs]
        if self.quantizable_conv(node):
            return self.conv(node, ins[0])
        if node.op == "nn.bias_add" and ins[0].kind != "float" and node.inputs[1].is_const:
            return self.int32_op(node, ins[0], node.inputs[1], per_channel=True)
        if node.op == "nn.relu" and ins[0].kind != "float":
            return _Q(self.b.call("nn.relu", [ins[0].node], node.name), ins[0].kind,
                      ins[0].scale)
        if node.op == "add" and any(q.kind != "float" for q in ins):
            return self.add(node, ins)
        return _Q(self.b.call(node.op, [self.as_float(q) for q in ins], node.name,
                              **node.attrs), "float")

    def conv(self, node: Node, data: _Q) -> _Q:
        cfg = self.config
        weight = node.inputs[1].value
        assert weight is not None
        w_scale = cfg.weight_scale(weight)
        top = 2 ** (cfg.nbit_weight - 1) - 1
        w_q = np.clip(_round(weight.astype(np.float64) / w_scale), -top, top).astype(np.int8)
        wnode = self.b.const(w_q, f"{node.inputs[1].name}.int8".lstrip("."))
        out = self.b.call("nn.conv2d", [self.as_int8(data), wnode], node.name,
                          **{**node.attrs, "out_dtype": "int32"})
        return _Q(out, "int32", cfg.input_scale * w_scale)

    def int32_op(self, node: Node, data: _Q, constant: Node, per_channel: bool) -> _Q:
        """bias_add / add of a float constant to a quantized value: the constant is
        quantized to the value's int32 scale."""
        scale = data.scale
        value = self.as_int32(data, scale)
        assert constant.value is not None
        q = _to_int32(constant.value.astype(np.float64) / scale)
        args = [value, self.b.const(q, f"{constant.name}.int32".lstrip("."))]
        op = node.op if per_channel else "add"
        return _Q(self.b.call(op, args, node.name, **node.attrs), "int32", scale)

    def add(self, node: Node, ins: list[_Q]) -> _Q:
        a, b = ins
        if a.kind == "float" and node.inputs[0].is_const:
            return self.int32_op(node, b, node.inputs[0], per_channel=False)
        if b.kind == "float" and node.inputs[1].is_const:
            return self.int32_op(node, a, node.inputs[1], per_channel=False)
        # a float operand joins as an int8 input (TVM: simulated_quantize to INPUT)
        a = _Q(self.as_int8(a), "int8", self.config.input_scale) if a.kind == "float" else a
        b = _Q(self.as_int8(b), "int8", self.config.input_scale) if b.kind == "float" else b
        # two int32 accumulators meet at the finer scale (the coarser one shifted left,
        # exactly: one rounding when the sum is requantized, as TVM's ChooseDomScale);
        # an int8 operand already sits at the input scale the sum is requantized to, so
        # the int32 one comes to it, rounding once
        both_wide = a.kind == b.kind == "int32"
        scale = min(a.scale, b.scale) if both_wide else max(a.scale, b.scale)
        out = self.b.call("add", [self.as_int32(a, scale), self.as_int32(b, scale)],
                          node.name)
        return _Q(out, "int32", scale)

    def run(self) -> Graph:
        live = self.graph.live()
        for node in self.graph.nodes:
            if id(node) not in live and node.op != INPUT:
                continue
            q = self.visit(node)
            if node.op == INPUT:
                self.b.inputs.append(q.node)
            elif (self.config.store_lowbit_output and q.kind == "int32"
                  and any(u is None or u.op not in _INT32_READERS for u in self.users[node])):
                q = _Q(self.as_int8(q), "int8", self.config.input_scale)
            self.values[node] = q
        return self.b.finish(self.as_float(self.values[n]) for n in self.graph.outputs)


def _round(x: np.ndarray) -> np.ndarray:
    """Half away from zero, as the IR's round (C's round()) does."""
    return round_half_away(np.asarray(x, dtype=np.float64))


def _to_int32(x: np.ndarray) -> np.ndarray:
    """Rounded and saturated to int32 (a bias far beyond the accumulator's range would
    otherwise wrap)."""
    info = np.iinfo(np.int32)
    return np.clip(_round(x), info.min, info.max).astype(np.int32)


def quantize(graph: Graph, qconfig: QConfig | None = None) -> Graph:
    """The graph with its conv2d layers in int8 (TVM v0.5's ``relay.quantize``). Runs
    constant and batch-norm folding first, as TVM's quantize expects a simplified graph,
    so the weights are constants and batch-norm sits in them."""
    graph = eliminate_dead_code(fold_batch_norm(fold_constant(graph)))
    return eliminate_dead_code(_Realizer(graph, qconfig or QConfig()).run())


__all__ = ["QConfig", "QuantizeError", "quantize"]

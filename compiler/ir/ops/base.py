"""The IR's operator registry and the helpers every op family shares.

An op is an ``OpDef``: attribute defaults, type inference and numpy semantics. Names and
attributes follow Relay (``nn.conv2d``, ``nn.max_pool2d``, ``add``...), so a printed
graph reads like TVM's. The numpy semantics are what constant folding computes, what the
host device runs and what every pass is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.graph import IRError
from compiler.ir.types import TensorType

Infer = Callable[[list[TensorType], dict[str, Any]], TensorType]
Compute = Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: Infer
    compute: Compute
    defaults: tuple[tuple[str, Any], ...] = ()
    arity: tuple[int, int] = (1, 1)  # min, max inputs
    # element-wise in every input (broadcasting): fusable into a kernel's epilogue
    elementwise: bool = False

    def normalize(self, attrs: dict[str, Any]) -> dict[str, Any]:
        known = dict(self.defaults)
        unknown = set(attrs) - set(known)
        if unknown:
            raise IRError(f"unknown attribute(s) {', '.join(sorted(unknown))}")
        known.update(attrs)
        return {k: _freeze(v) for k, v in known.items()}


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    OPS[opdef.name] = opdef
    return opdef


def get_op(name: str, node: str = "") -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise IRError(f"op {name!r} ({node or 'unnamed'}) is not an IR operator") from None


def check_arity(types: list[TensorType], lo: int, hi: int) -> None:
    if not lo <= len(types) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise IRError(f"takes {want} inputs, got {len(types)}")


def float_only(types: list[TensorType]) -> None:
    for t in types:
        if t.dtype != "float32":
            raise IRError(f"expects float32 inputs, got {t.dtype}")


def define(name: str, infer: Infer, compute: Compute, arity: tuple[int, int] = (1, 1),
        elementwise: bool = False, **defaults: Any) -> OpDef:
    def checked(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        check_arity(types, *arity)
        return infer(types, attrs)

    return register(OpDef(name, checked, compute, tuple(defaults.items()), arity, elementwise))


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise IRError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not "
                      "broadcast") from None


def binary_infer(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    if types[0].dtype != types[1].dtype:
        raise IRError(f"dtypes differ: {types[0].dtype} and {types[1].dtype}")
    return TensorType(broadcast_shape(types[0].shape, types[1].shape), types[0].dtype)


def same_float(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    float_only(types)
    return types[0]


NUMERIC = ("float32", "int32", "int8")


def numeric(types: list[TensorType], _attrs: dict[str, Any]) -> TensorType:
    for t in types:
        if t.dtype not in NUMERIC:
            raise IRError(f"expects {', '.join(NUMERIC)} inputs, got {t.dtype}")
    return types[0]


def keep_dtype(fn: Callable[..., np.ndarray]) -> Compute:
    def compute(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        return np.asarray(fn(xs, attrs)).astype(xs[0].dtype, copy=False)
    return compute


def check_axis(axis: int, ndim: int) -> int:
    """``axis`` as a non-negative index, or IRError: numpy raises on it, so must we."""
    if not -ndim <= axis < ndim:
        raise IRError(f"axis {axis} out of range for {ndim} dimensions")
    return axis % ndim


def expand_to_axis(vec: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return vec.reshape(shape)


def evaluate_op(op: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return get_op(op).compute(inputs, attrs)


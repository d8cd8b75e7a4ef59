"""What every template provides, and the pieces their generated kernels share."""

from __future__ import annotations

import math

import dataclasses
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from compiler.templates.activations import ACTIVATIONS, activation_c, activation_np
from compiler.templates.prelude import with_prelude
from compiler.templates.space import ConfigError, ConfigSpace, OtherKnob, SplitKnob
from schemas import Config, DeviceLimits, Workload

DIALECTS = ("cuda", "opencl")
# an epilogue's activations (``ACTIVATIONS``) are written "name:p1:p2" in
# ``Epilogue.ops``: "clip:0.0:6.0", "leaky_relu:0.1"
EPILOGUE_OPS = ("bias", "add", "shift", *ACTIVATIONS)
# int8 activations are clipped to the symmetric range TVM's qconfig gives nbit 8
INT8_MIN, INT8_MAX = -127, 127


def activation(name: str, *params: float) -> str:
    """An epilogue op naming an activation and its parameters, each as the float32 value
    the kernels use (written without "+", which ``Epilogue.parse`` splits on)."""
    return ":".join([name, *(repr(float(np.float32(p))).replace("+", "") for p in params)])


def _split_op(op: str) -> tuple[str, tuple[float, ...]]:
    """An epilogue op's name and parameters; ValueError when it is not one."""
    name, *params = op.split(":")
    if name not in EPILOGUE_OPS:
        raise ValueError(f"epilogue op {op!r} is not one of {', '.join(EPILOGUE_OPS)}")
    want = ACTIVATIONS.get(name, 0)
    try:
        values = tuple(float(p) for p in params)
    except ValueError:
        raise ValueError(f"epilogue op {op!r}: parameters must be numbers") from None
    if len(values) != want:
        raise ValueError(f"epilogue op {op!r}: {name} takes {want} parameter(s)")
    return name, values


class WorkloadError(ValueError):
    """Arguments that do not describe an operator this template can compute."""


@dataclass(frozen=True)
class Epilogue:
    """Element-wise ops fused after the main computation, applied in order.

    ``bias`` adds a per-output-channel vector, ``add`` a tensor of the output's shape
    (a residual): conv + bias + activation (+ add) in one kernel. The activations
    (``ACTIVATIONS``) are ``relu``, ``clip:lo:hi``, ``leaky_relu:alpha``,
    ``hard_sigmoid:alpha:beta`` (clamp(alpha * x + beta, 0, 1)), ``hard_swish``
    (x * hard_sigmoid(x) with 1/6, 1/2) and ``silu`` (x * sigmoid(x)); ``activation``
    writes them. Integer (quantized) kernels take ``relu`` of those, and ``shift``, the
    requantize step: a rounding arithmetic right shift by ``shift`` bits,
    ``(v + 2**(shift-1)) >> shift``; and ``out_dtype`` "int8" stores the result clipped
    to [-127, 127] instead of the template's own output dtype (int32 accumulators).
    Their bias is int32 and their residual is ``residual_dtype`` (int8 or int32; unset:
    the stored dtype).
    """

    ops: tuple[str, ...] = ()
    shift: int = 0
    out_dtype: str = ""
    residual_dtype: str = ""

    def __post_init__(self) -> None:
        for op in self.ops:
            _split_op(op)
        if any(self.ops.count(op) > 1 for op in ("bias", "add", "shift")):
            raise ValueError("epilogue: bias, add and shift may each appear once")
        if ("shift" in self.ops) != (self.shift > 0):
            raise ValueError(f"epilogue: the shift op needs shift >= 1 bits and shift "
                             f"{self.shift} needs the op, got ops {self.ops}")
        for name in ("out_dtype", "residual_dtype"):
            if getattr(self, name) not in ("", "int8", "int32", "float32"):
                raise ValueError(f"epilogue: {name} {getattr(self, name)!r} is not int8, "
                                 "int32 or float32")

    @classmethod
    def parse(cls, text: str) -> Epilogue:
        return cls(tuple(op.strip() for op in text.replace("+", ",").split(",") if op.strip()))

    @property
    def vectorizable(self) -> bool:
        """Only bias, add and relu: what vector-typed stores apply without unpacking lanes."""
        return all(op in ("bias", "add", "relu") for op in self.ops)

    def c_expr(self, value: str, bias: str, residual: str) -> str:
        """The epilogue as a C expression over ``value`` (float kernels)."""
        for op in self.ops:
            name, params = _split_op(op)
            if name == "bias":
                value = f"({value} + {bias})"
            elif name == "add":
                value = f"({value} + {residual})"
            elif name == "shift":
                raise ValueError("the shift op is for integer kernels")
            else:
                value = activation_c(name, params, value)
        return value

    def int_c_expr(self, value: str, bias: str, residual: str) -> str:
        """The epilogue as a C int expression over ``value`` (quantized kernels), without
        the final clip of an int8 store (``int_store``)."""
        for op in self.ops:
            if op == "bias":
                value = f"({value} + {bias})"
            elif op == "add":
                value = f"({value} + (int)({residual}))"
            elif op == "relu":
                value = f"max({value}, 0)"
            elif op == "shift":
                value = f"(({value} + {1 << (self.shift - 1)}) >> {self.shift})"
            else:
                raise ValueError(f"epilogue op {op!r} is for float kernels")
        return value

    def int_store(self, value: str, out_dtype: str) -> str:
        """``value`` as the stored element: clipped to int8's range for an int8 output."""
        if out_dtype == "int8":
            return f"(INT8_T)min(max({value}, {INT8_MIN}), {INT8_MAX})"
        return value

    def apply(self, out: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None,
              channel_axis: int) -> np.ndarray:
        if np.issubdtype(out.dtype, np.integer):
            return self._apply_int(out.astype(np.int64), bias, residual, channel_axis)
        for op in self.ops:
            name, params = _split_op(op)
            if name == "bias":
                assert bias is not None
                shape = [1] * out.ndim
                shape[channel_axis] = -1
                out = out + bias.reshape(shape)
            elif name == "add":
                out = out + residual
            elif name == "shift":
                raise ValueError("the shift op is for integer kernels")
            else:
                out = activation_np(name, params, out)
        return out.astype(np.float32)

    def _apply_int(self, out: np.ndarray, bias: np.ndarray | None,
                   residual: np.ndarray | None, channel_axis: int) -> np.ndarray:
        """int32 arithmetic as the kernels do it (values stay far from overflow)."""
        for op in self.ops:
            if op == "bias":
                assert bias is not None
                shape = [1] * out.ndim
                shape[channel_axis] = -1
                out = out + bias.astype(np.int64).reshape(shape)
            elif op == "add":
                assert residual is not None
                out = out + residual.astype(np.int64)
            elif op == "relu":
                out = np.maximum(out, 0)
            elif op == "shift":
                out = (out + (1 << (self.shift - 1))) >> self.shift
            else:
                raise ValueError(f"epilogue op {op!r} is for float kernels")
        if self.out_dtype == "int8":
            return np.clip(out, INT8_MIN, INT8_MAX).astype(np.int8)
        return out.astype(np.int32)


PROLOGUE_OPS = ("scale", "shift", "relu")


@dataclass(frozen=True)
class Prologue:
    """Per-input-channel ops applied to the data as a conv loads it, in order: ``scale``
    multiplies by a vector of the input's channels (buffer ``pro_scale``), ``shift``
    adds one (``pro_shift``), ``relu`` clamps at 0. DenseNet's pre-activation
    batch-norm + ReLU on the concatenated feature map before each 1x1 conv: folded into
    the conv's load, the map is read as it lies and no element-wise pass writes a copy.
    A padded tap is 0 after the prologue, not before: templates that take one
    (``Template.takes_prologue``) leave such taps out or zero them after it."""

    ops: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for op in self.ops:
            if op not in PROLOGUE_OPS:
                raise ValueError(f"prologue op {op!r} is not one of {', '.join(PROLOGUE_OPS)}")
        if any(self.ops.count(op) > 1 for op in ("scale", "shift")):
            raise ValueError("prologue: scale and shift may each appear once")

    @property
    def vector_ops(self) -> tuple[str, ...]:
        """Its ops that read a vector, in the order a kernel takes their buffers."""
        return tuple(op for op in ("scale", "shift") if op in self.ops)

    def buffers(self, channels: int) -> list[Buffer]:
        """The vectors it reads, in the order a kernel takes them (after the epilogue's)."""
        return [Buffer(f"pro_{op}", (channels,)) for op in self.vector_ops]

    def load(self, value: str, channel: str, lanes: int, factor: str = "") -> str:
        """A loaded float ``value`` of input ``channel`` through the prologue, as a
        kernel's ``VEC_T(lanes)`` operand (a float for 1 lane): ``c_vector`` on its
        broadcast; ``factor`` (a C float, 0 or 1: a row outside the image) multiplies
        the float after the prologue instead."""
        if factor:
            value = f"{self.c_expr(value, channel)} * {factor}"
            return value if lanes == 1 else f"VBCAST({lanes}, {value})"
        if lanes == 1:
            return self.c_expr(value, channel)
        return self.c_vector(f"VBCAST({lanes}, {value})", channel, lanes)

    def c_expr(self, value: str, channel: str) -> str:
        """The prologue as a C float expression over ``value``, input ``channel``'s."""
        for op in self.ops:
            if op == "relu":
                value = activation_c("relu", (), value)
            else:
                value = f"({value} {'*' if op == 'scale' else '+'} pro_{op}[{channel}])"
        return value

    def c_vector(self, value: str, channel: str, lanes: int) -> str:
        """The prologue over ``value``, a ``VEC_T(lanes)`` of input ``channel``'s (the
        prelude's macros): a scale and the shift after it one VFMA. Why vectors: with
        scale, shift and relu on each float before its broadcast PoCL ran the 1x1 GEMM on
        DenseNet-121's shapes in 2.3-4.3x the time without a prologue, on the broadcast
        vectors in 1.14-1.42x (a Zen 5 VM, bench/prologue.py)."""
        def bcast(x: str) -> str:
            return f"VBCAST({lanes}, {x})"

        ops = list(self.ops)
        while ops:
            op = ops.pop(0)
            if op == "relu":
                value = f"VMAX({value}, {bcast('0.0f')})"
            elif op == "shift":
                value = f"VADD({value}, {bcast('pro_shift[' + channel + ']')})"
            else:
                shift = bcast("0.0f")
                if ops[:1] == ["shift"]:
                    shift = bcast(f"pro_shift[{channel}]")
                    ops.pop(0)
                value = f"VFMA({value}, {bcast('pro_scale[' + channel + ']')}, {shift})"
        return value

    def apply(self, data: np.ndarray, vectors: dict[str, np.ndarray]) -> np.ndarray:
        """numpy's prologue on NCHW ``data``; ``vectors`` by op (``vector_ops``)."""
        for op in self.ops:
            if op == "relu":
                data = np.maximum(data, 0)
            else:
                v = vectors[op].astype(np.float32).reshape(1, -1, 1, 1)
                data = data * v if op == "scale" else data + v
        return data.astype(np.float32)


# The channel block a trial feeds a ``blocked_io`` template's data in: what the layer
# before writes in a model build (its oc_bn; the 16-lane defaults write 16, 32 or 64)
MEASURE_DATA_BLOCK = 16


@dataclass(frozen=True)
class IOLayout:
    """Physical layout of a kernel's activations (data input, output, fused residual):
    0 is plain NCHW; ``b`` > 0 is NCHW[b]c, the blocked layout of AutoTVM's x86
    schedules: shape [N, C/b, H, W, b], element (n, c, h, w) at
    ((((n * (C/b) + c // b) * H + h) * W + w) * b + c % b. The graph's types stay NCHW
    (the element count is the same); only templates with ``blocked_io`` accept b > 0."""

    data_block: int = 0
    out_block: int = 0
    residual_block: int = 0

    def __post_init__(self) -> None:
        for name in ("data_block", "out_block", "residual_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"IOLayout.{name} must be an integer >= 0, got {value!r}")

    @property
    def plain(self) -> bool:
        return not (self.data_block or self.out_block or self.residual_block)

    def residual_vectors(self, vec: int) -> bool:
        """Whether a vector epilogue of ``vec``-lane vectors (vec > 1) reads the
        residual's channels k0 .. k0 + vec - 1 (k0 a multiple of vec) as one vector
        whatever the output's block: they lie side by side where the residual is
        blocked by a multiple of vec. Plain floats (vec 1) keep their lane-wise path."""
        return vec > 1 and self.residual_block > 0 and self.residual_block % vec == 0


def blocked_shape(shape: tuple[int, ...], block: int, what: str = "tensor") -> tuple[int, ...]:
    """The physical shape of an NCHW ``shape`` stored in NCHW[block]c (itself when 0)."""
    if not block:
        return tuple(shape)
    n, c, *rest = shape
    if c % block:
        raise ValueError(f"{what}: channel block {block} does not divide its {c} channels")
    return (n, c // block, *rest, block)


def to_blocked(array: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW[block]c (a copy; ``array`` itself when ``block`` is 0)."""
    if not block:
        return array
    n, c, *rest = array.shape
    blocked = array.reshape(n, c // block, block, *rest)
    return np.ascontiguousarray(np.moveaxis(blocked, 2, -1))


def from_blocked(array: np.ndarray, block: int) -> np.ndarray:
    """NCHW[block]c (5-D, or flat with ``block``'s shape implied) -> NCHW."""
    if not block:
        return array
    n, cb, *rest, b = array.shape
    return np.ascontiguousarray(np.moveaxis(array, -1, 2)).reshape(n, cb * b, *rest)


@dataclass(frozen=True)
class Buffer:
    """One kernel argument: an array of ``shape`` read (``in``) or written (``out``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    role: str = "in"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Stage:
    """One launch of a kernel that takes several (Winograd: input transform, batched
    GEMM, inverse transform): ``args`` index ``Kernel.buffers`` then ``Kernel.scratch``."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[int, ...]


@dataclass(frozen=True)
class Kernel:
    """Generated source plus how to launch it: CUDA grid/block = OpenCL groups/local size.

    ``entry``/``grid``/``block`` describe the tuned launch. A multi-stage kernel lists
    every launch in ``stages`` (in order, the tuned one among them) and the device-only
    intermediates they pass each other in ``scratch``; callers still see one kernel
    over ``buffers``, so measuring and graph execution treat it as one step."""

    source: str
    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    buffers: tuple[Buffer, ...]
    dialect: str
    meta: dict[str, Any] = field(default_factory=dict)
    stages: tuple[Stage, ...] = ()
    scratch: tuple[Buffer, ...] = ()

    @property
    def global_size(self) -> tuple[int, int, int]:
        return tuple(g * b for g, b in zip(self.grid, self.block))  # type: ignore[return-value]


class Template(ABC):
    """A tunable kernel family: config space, codegen, FLOPs, reference and features."""

    name: str
    # index of the output's channel axis, where a fused bias broadcasts
    channel_axis: int = 1
    # Templates whose kernel can read its data and residual and write its output in
    # NCHW[b]c (``IOLayout``) set this; their ``_codegen`` takes an ``io`` argument.
    blocked_io: bool = False
    # Templates that apply a ``Prologue`` on their data load set this; their
    # ``_codegen`` takes a ``prologue`` argument (and an ``io`` one).
    takes_prologue: bool = False

    def space(self, workload: Workload) -> ConfigSpace:
        return _space_of(self, workload)

    @abstractmethod
    def parse(self, workload: Workload) -> Any:
        """Typed operator parameters (an op of ``templates.ops``: shapes, FLOPs, numpy
        reference); raises WorkloadError naming the bad argument."""

    @abstractmethod
    def _space(self, op: Any) -> ConfigSpace: ...

    def flops(self, workload: Workload) -> int:
        return int(self.parse(workload).flops)

    def output_shape(self, workload: Workload) -> tuple[int, ...]:
        return tuple(self.parse(workload).output_shape)

    def input_shapes(self, workload: Workload) -> list[tuple[int, ...]]:
        return list(self.parse(workload).input_shapes)

    def compute_reference(self, workload: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        """The operator in numpy, float64 accumulation: what every kernel is checked against."""
        return self.parse(workload).reference(*inputs)

    # ---- device limits: one vectorised rule set, for bulk filters and single configs ----

    # What a limit message calls the kernel's parallel units: GPU templates speak of
    # threads per block, CPU-class ones (OpenCL on a CPU) of work-items per group.
    thread_word: str = "threads"
    thread_one: str = "thread"
    group_word: str = "block"

    @abstractmethod
    def _usage(self, op: Any, knobs: dict[str, np.ndarray]) -> Usage:
        """Device resources of the configs whose knob values are ``knobs`` (arrays, one
        row per config, as ``ConfigSpace.columns`` gives them)."""

    def valid_mask(self, workload: Workload, indices: np.ndarray,
                   limits: DeviceLimits | None, dialect: str | None = None) -> np.ndarray:
        """bool [n]: which configs (indices of ``space(workload)``) fit ``limits``; True
        exactly where ``check_limits`` finds no problem. Lets a search filter in bulk.
        ``None`` (no device known yet) checks the template's own rules alone."""
        op = self.parse(workload)
        indices = np.asarray(indices, dtype=np.int64)
        usage = self._usage(op, self._knobs(workload, indices))
        ok = np.ones(indices.shape[0], dtype=bool)
        for fits, _ in self._limit_checks(usage, limits, indices.shape[0], dialect):
            ok &= fits
        return ok

    def check_limits(self, workload: Workload, config: Config, limits: DeviceLimits,
                     dialect: str | None = None) -> list[str]:
        """Why this config cannot run on a device with ``limits`` (empty: it can); the
        same rules as ``valid_mask``, on one row. ``dialect`` picks the grid limits
        (``GRID_LIMITS``); None checks the strictest, CUDA's, as the dialect is unknown."""
        try:
            values = self.decode(workload, config)
        except ConfigError as err:
            return [str(err)]
        space = self.space(workload)
        row = np.array([space.index_of(values)], dtype=np.int64)
        usage = self._usage(self.parse(workload), self._knobs(workload, row))
        return [message(0) for fits, message in self._limit_checks(usage, limits, 1, dialect)
                if not fits[0]]

    def _limit_checks(self, usage: Usage, limits: DeviceLimits | None, n: int,
                      dialect: str | None = None
                      ) -> list[tuple[np.ndarray, Callable[[int], str]]]:
        """Every comparison of ``n`` configs' usage against the limits, written once for
        all templates: (fits, bool [n]; the message for row i), template rules first
        (alone when ``limits`` is None)."""
        checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
            (np.broadcast_to(rule.ok, (n,)), rule.message_at) for rule in usage.rules]
        if limits is None:
            return checks

        def over(value: np.ndarray | None, cap: int,
                 text: Callable[[int], str]) -> None:
            if value is not None:
                checks.append((np.broadcast_to(value <= cap, (n,)), text))

        words, one, group = self.thread_word, self.thread_one, self.group_word
        over(usage.threads, limits.max_threads_per_block,
             lambda i: f"{_at(usage.threads, i)} {words} per {group} > "
                       f"{limits.max_threads_per_block}")
        for axis, value, cap in (("x", usage.threads_x, limits.max_thread_x),
                                 ("y", usage.threads_y, limits.max_thread_y),
                                 ("z", usage.threads_z, limits.max_thread_z)):
            over(value, cap, lambda i, axis=axis, value=value, cap=cap:
                 f"{_at(value, i)} {words} in {axis} > {cap}")
        over(usage.shared_bytes, limits.max_shared_memory_per_block,
             lambda i: f"{_at(usage.shared_bytes, i)} bytes of local memory > "
                       f"{limits.max_shared_memory_per_block}")

        def accumulators(i: int) -> str:
            parts = " x ".join(f"{_at(v, i)} {label}".rstrip() for v, label in usage.local_detail)
            detail = f" ({parts})" if parts else ""
            return (f"{_at(usage.local_elements, i)} accumulators per {one}{detail} > "
                    f"{limits.max_local_elements}")

        over(usage.local_elements, limits.max_local_elements, accumulators)

        caps = GRID_LIMITS[dialect or "cuda"]
        if usage.grid is not None and caps is not None:
            for axis, value, cap in zip("xyz", usage.grid, caps):
                over(value, cap, lambda i, axis=axis, value=value, cap=cap:
                     f"{_at(value, i)} {group}s in grid {axis} > {cap} "
                     f"(CUDA's gridDim.{axis} limit)")
        return checks

    # ---- cost-model features: one vectorised definition per template ----

    @abstractmethod
    def _feature_columns(self, op: Any, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        """Config features by name, each an array [n] (or a scalar, broadcast) for the
        knob arrays ``knobs``; the same names for every workload of the template."""

    def feature_names(self, workload: Workload) -> list[str]:
        """Column names of ``feature_matrix``: the same for every workload of the
        template, so one cost model can be trained across workloads."""
        names, _ = self._feature_table(workload, np.zeros(1, dtype=np.int64))
        return names

    def feature_matrix(self, workload: Workload, indices: np.ndarray) -> np.ndarray:
        """float32 [len(indices), len(feature_names)]: the features of the configs at
        ``indices`` of ``space(workload)``, computed for all rows at once."""
        _, matrix = self._feature_table(workload, np.asarray(indices, dtype=np.int64))
        return matrix

    def features(self, workload: Workload, config: Config) -> dict[str, float]:
        """Cost-model features of one config (a row of ``feature_matrix``); the config's
        entity decides the point, not its ``index`` (legacy logs may disagree)."""
        space = self.space(workload)
        row = np.array([space.index_of(self.decode(workload, config))], dtype=np.int64)
        names, matrix = self._feature_table(workload, row)
        return {name: float(v) for name, v in zip(names, matrix[0])}

    def _feature_table(self, workload: Workload, indices: np.ndarray
                       ) -> tuple[list[str], np.ndarray]:
        """Names and float32 matrix: the template's config columns, then the workload's."""
        op = self.parse(workload)
        columns = self._feature_columns(op, self._knobs(workload, indices))
        wl = _workload_features(op)
        names = [*columns, *wl]
        # filled one contiguous row per feature, then transposed once: writing the
        # strided columns of an [n, m] array directly took 3x as long
        matrix = np.empty((len(names), indices.shape[0]), dtype=np.float32)
        for j, value in enumerate([*columns.values(), *wl.values()]):
            matrix[j] = value
        return names, np.ascontiguousarray(matrix.T)

    def _knobs(self, workload: Workload, indices: np.ndarray) -> dict[str, np.ndarray]:
        """``ConfigSpace.columns`` with split knobs' [n, k] arrays in column-major order,
        so each factor (``factors``) is a contiguous view, not a copy. Indices outside
        the space would decode to wrong points silently: refused."""
        space = self.space(workload)
        if indices.size and (indices.min() < 0 or indices.max() >= len(space)):
            raise ConfigError(f"indices outside the space of {len(space)} configs")
        return {name: np.asfortranarray(value) if value.ndim == 2 else value
                for name, value in space.columns(indices).items()}

    @abstractmethod
    def default_config(self, workload: Workload, limits: DeviceLimits | None = None) -> Config:
        """AutoTVM's fallback config: what runs when nothing was tuned. ``limits``: the
        device's, where known (a CPU template's register tile follows ``simd_lanes``)."""

    def default_variants(self, workload: Workload,
                         limits: DeviceLimits | None = None) -> list[Config]:
        """The default config with its algorithm switched (Winograd's tile size): knobs
        whose best value no default rule predicts on every device and layer, and whose
        other values a short search rarely draws beside the default's other knobs. A
        search measures these right after the default. None here."""
        return []

    @abstractmethod
    def _codegen(self, op: Any, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel: ...

    def codegen(self, workload: Workload, config: Config, dialect: str = "opencl",
                epilogue: Epilogue = Epilogue(), io: IOLayout | None = None,
                prologue: Prologue = Prologue()) -> Kernel:
        """The kernel of ``config``; ``io`` asks for blocked activations (templates with
        ``blocked_io`` only; plain NCHW when omitted), ``prologue`` for ops on the data
        load (templates with ``takes_prologue`` only)."""
        if dialect not in DIALECTS:
            raise ValueError(f"dialect {dialect!r} is not one of {', '.join(DIALECTS)}")
        if io is not None and not self.blocked_io and not io.plain:
            raise ValueError(f"{self.name} reads and writes plain NCHW only; it cannot "
                             f"generate a kernel for {io}")
        op = self.parse(workload)
        knobs = self.decode(workload, config)
        if prologue.ops:
            if not self.takes_prologue:
                raise ValueError(f"{self.name} applies no prologue on its data load")
            kernel = self._codegen(op, knobs, epilogue,  # type: ignore[call-arg]
                                   io=io or IOLayout(), prologue=prologue)
        elif io is not None and self.blocked_io:
            kernel = self._codegen(op, knobs, epilogue, io=io)  # type: ignore[call-arg]
        else:
            kernel = self._codegen(op, knobs, epilogue)
        return dataclasses.replace(kernel, source=with_prelude(_launch_bounds(kernel), dialect),
                                   dialect=dialect)

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        """Knob values of ``config``; raises ConfigError when it is not in the space."""
        return self.space(workload).decode(config)

    def random_config(self, workload: Workload, rng: random.Random,
                      limits: DeviceLimits | None = None, tries: int = 10000) -> Config:
        """A uniformly drawn config, redrawn until it fits ``limits``."""
        space = self.space(workload)
        for _ in range(tries):
            config = space.sample(rng)
            if limits is None or not self.check_limits(workload, config, limits):
                return config
        raise ConfigError(f"no config of {self.name} fits the device after {tries} draws")

    # Templates whose kernel reads the weight (input 1) in a layout of their own (CPU
    # templates pack it into channel blocks) set this and override ``pack_weight``.
    packs_weight: bool = False

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        """The weight as the kernel reads it: a constant transform the compiler does once
        at build time (as Winograd's filter transform), and the measurer before a trial."""
        return weight

    def out_block(self, workload: Workload, config: Config) -> int:
        """The channel block a ``blocked_io`` template writes its output in when its
        readers can take it (0: plain NCHW): the compiler's layout plan asks this."""
        return 0

    def measure_io(self, workload: Workload, config: Config) -> IOLayout | None:
        """The activations' layout a trial times ``config`` in (None: plain NCHW): a
        ``blocked_io`` template as a model build runs it between convs, its output in its
        own block and its data in ``MEASURE_DATA_BLOCK`` (plain where that does not
        divide the channels: a graph input, such as a stem's 3). Timed in plain NCHW,
        configs ranked otherwise than in the model (a ResNet-50 tuning's picks, 1.06x
        faster than the defaults plain, ran at 0.93x their speed as built;
        docs/BENCHMARKS.md), and a conv2d_NCHWc.x86 record is AutoTVM's NCHW[ic_bn]c ->
        NCHW[oc_bn]c kernel's cost."""
        if not self.blocked_io:
            return None
        channels = self.input_shapes(workload)[0][1]
        data = MEASURE_DATA_BLOCK if channels % MEASURE_DATA_BLOCK == 0 else 0
        return IOLayout(data_block=data, out_block=self.out_block(workload, config))

    def kernel_inputs(self, workload: Workload, config: Config, arrays: list[np.ndarray],
                      io: IOLayout | None = None) -> list[np.ndarray]:
        """The operator's inputs (as ``make_inputs`` and the reference see them) in the
        form the kernel's input buffers take: the weight packed, the data in ``io``'s
        block."""
        data = to_blocked(arrays[0], io.data_block) if io is not None else arrays[0]
        if not self.packs_weight:
            return [data, *arrays[1:]]
        return [data, self.pack_weight(workload, config, arrays[1]), *arrays[2:]]

    def make_inputs(self, workload: Workload, epilogue: Epilogue,
                    rng: np.random.Generator) -> list[np.ndarray]:
        """Random operands (plus bias / residual the epilogue needs), as float32."""
        arrays = [rng.uniform(-1, 1, size=s).astype(np.float32)
                  for s in self.input_shapes(workload)]
        out_shape = self.output_shape(workload)
        if "bias" in epilogue.ops:
            arrays.append(rng.uniform(-1, 1, size=out_shape[self.channel_axis]).astype(np.float32))
        if "add" in epilogue.ops:
            arrays.append(rng.uniform(-1, 1, size=out_shape).astype(np.float32))
        return arrays

    def reference(self, workload: Workload, arrays: list[np.ndarray],
                  epilogue: Epilogue = Epilogue()) -> np.ndarray:
        n_main = len(self.input_shapes(workload))
        out = self.compute_reference(workload, arrays[:n_main])
        extra = iter(arrays[n_main:])
        bias = next(extra) if "bias" in epilogue.ops else None
        residual = next(extra) if "add" in epilogue.ops else None
        return epilogue.apply(out, bias, residual, self.channel_axis)


@dataclass(frozen=True, eq=False)
class Rule:
    """A template's own condition on its configs (beyond the device limits), per row:
    ``ok`` bool [n] (or a scalar), and ``message`` (``str.format`` over ``values``) for
    a row that fails."""

    ok: Any
    message: str
    values: dict[str, Any] = field(default_factory=dict)

    def message_at(self, i: int) -> str:
        return self.message.format(**{k: _at(v, i) for k, v in self.values.items()})


@dataclass(frozen=True, eq=False)
class Usage:
    """What configs use of a device, one entry per row (arrays [n], or scalars that
    broadcast); a resource left None is not checked. ``local_detail`` explains the
    accumulator count in its message as (value, label) factors."""

    threads: Any
    threads_x: Any = None
    threads_y: Any = None
    threads_z: Any = None
    shared_bytes: Any = None
    local_elements: Any = None
    local_detail: tuple[tuple[Any, str], ...] = ()
    rules: tuple[Rule, ...] = ()
    # blocks of the launch in x, y, z (the tuned one; other stages of a multi-stage
    # kernel launch in x alone, within every limit)
    grid: tuple[Any, Any, Any] | None = None


# Blocks per grid axis (x, y, z) a launch may have, by dialect: CUDA's gridDim limits
# (compute capability 3.0 and later); OpenCL bounds only the global size by size_t, so
# nothing is checked there.
GRID_LIMITS: dict[str, tuple[int, int, int] | None] = {
    "cuda": (2**31 - 1, 65535, 65535),
    "opencl": None,
}


def _launch_bounds(kernel: Kernel) -> str:
    """``kernel``'s source with ``LAUNCH_BOUNDS(threads)`` on each entry. In CUDA it is
    ``__launch_bounds__``: ptxas then keeps registers within what a block of that many
    threads can have, so a config that fits the thread limits also launches instead of
    failing with "too many resources requested". OpenCL's prelude defines it empty, so
    both dialects keep one kernel body."""
    source = kernel.source
    launches = [(s.entry, s.block) for s in kernel.stages] or [(kernel.entry, kernel.block)]
    for entry, block in launches:
        head = f"KERNEL void {entry}("
        if source.count(head) != 1:
            raise ValueError(f"kernel {entry!r}: expected one declaration to bound")
        threads = int(np.prod(block))
        source = source.replace(head, f"KERNEL void LAUNCH_BOUNDS({threads}) {entry}(")
    return source


# float32 lanes of an AVX-512 vector: a device with this many gets the CPU templates'
# wider default tiles (``Template.default_config``); of an AVX2 one (16 registers), where
# an untuned build prefers the implicit GEMM on narrow outputs (``compiler.tasks``)
AVX512_LANES = 16
AVX2_LANES = 8


def simd_lanes(limits: DeviceLimits | None) -> int:
    """float32 lanes of the device's native vector; 0 where unknown (no limits given, or a
    device that does not say): a default config then keeps its AVX2-sized tile."""
    return limits.simd_lanes if limits is not None else 0


def _at(value: Any, i: int) -> int:
    """Row ``i`` of a per-config array, or the scalar itself, as a Python int."""
    return int(value[i]) if np.ndim(value) else int(value)


def factors(value: Any) -> tuple[Any, ...]:
    """The factors of a split knob's value, outermost first: ints for one config's
    tuple, [n] columns (views) for an [n, num_outputs] array of configs. Lets one tile
    helper serve codegen (scalars) and features / limits (arrays)."""
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return tuple(value.T)
    return tuple(value)


def log2(value: Any) -> Any:
    """log2 of a count, clamped at 1 so that no feature is -inf."""
    return np.log2(np.maximum(value, 1))


def ceil_div(a: Any, b: Any) -> Any:
    """Integer ceil(a / b) for ints or integer arrays."""
    return -(-a // b)


def split_features(knobs: dict[str, np.ndarray], *names: str) -> dict[str, np.ndarray]:
    """log2 of each factor of the split knobs ``names``, as ``name.i`` (position i)."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        for i, column in enumerate(factors(knobs[name])):
            out[f"{name}.{i}"] = np.log2(column)
    return out


def unroll_knobs(max_steps: tuple[int, ...]) -> list[OtherKnob]:
    """AutoTVM's unroll pragmas of a GPU schedule, last in its space: the
    ``auto_unroll_max_step`` candidates and ``unroll_explicit`` (0, 1)."""
    return [OtherKnob("auto_unroll_max_step", max_steps), OtherKnob("unroll_explicit", (0, 1))]


def split_knobs(space: ConfigSpace) -> dict[str, SplitKnob]:
    """The split knobs of ``space`` by name (a default config picks their nearest values)."""
    return {k.name: k for k in space.knobs if isinstance(k, SplitKnob)}


def block_features(knobs: dict[str, np.ndarray], threads: Any, blocks: Any, acc: Any,
                   shared_bytes: Any) -> dict[str, Any]:
    """The first features of a GPU schedule with unroll pragmas: the pragmas, then log2
    of threads per block, blocks, accumulators per thread and local-memory bytes."""
    return {
        "auto_unroll_max_step": knobs["auto_unroll_max_step"],
        "unroll_explicit": knobs["unroll_explicit"],
        "log_threads": log2(threads),
        "log_blocks": log2(blocks),
        "log_acc": log2(acc),
        "log_shared_bytes": log2(shared_bytes),
    }


def inner_unrolled(knobs: dict[str, np.ndarray], inner: Any) -> Any:
    """Whether a compute nest of ``inner`` statements is unrolled: it fits
    auto_unroll_max_step (emit.Unroll)."""
    max_step = knobs["auto_unroll_max_step"]
    return (max_step > 0) & (inner <= max_step)


def warp_efficiency(threads: Any) -> Any:
    """The share of a block's 32-wide warps its threads fill."""
    return threads / (32 * ceil_div(threads, 32))


def _workload_features(op: Any) -> dict[str, float]:
    """log2(1 + x) of every integer of the operator's parameters, then log2 FLOPs.

    Read from the parsed op, not the raw args: args of one template differ in shape
    (padding of 2 or 4, stride as an int or a pair, dense bias null or a tensor, 3 or 4
    dense args) while the op's fields are always the same, and so must the names be."""
    items = [(f.name, getattr(op, f.name)) for f in dataclasses.fields(op)]
    out: dict[str, float] = {}

    def walk(name: str, value: Any) -> None:
        if isinstance(value, (bool, int, np.integer)):
            out[f"wl.{name}"] = float(np.log2(1 + int(value)))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{name}.{i}", item)

    for name, value in items:
        walk(name, value)
    out["wl.log_flops"] = float(log2(int(op.flops)))
    return out


@lru_cache(maxsize=512)
def _space_of(template: Template, workload: Workload) -> ConfigSpace:
    # Spaces are asked for on every decode and limit check; building one enumerates splits.
    return template._space(template.parse(workload))


def epilogue_buffers(epilogue: Epilogue, out_shape: tuple[int, ...],
                     channel_axis: int, residual_shape: tuple[int, ...] | None = None,
                     bias_dtype: str = "float32", residual_dtype: str = "float32"
                     ) -> list[Buffer]:
    """Bias and residual buffers; ``residual_shape`` is the residual's physical shape
    when it differs from the output's (a blocked layout)."""
    bufs = []
    if "bias" in epilogue.ops:
        bufs.append(Buffer("bias", (out_shape[channel_axis],), bias_dtype))
    if "add" in epilogue.ops:
        bufs.append(Buffer("residual", residual_shape or out_shape, residual_dtype))
    return bufs


def io_buffers(data_shape: tuple[int, ...], weight_shape: tuple[int, ...],
               extra: list[Buffer], out_shape: tuple[int, ...], data_dtype: str = "float32",
               weight_dtype: str = "float32", out_dtype: str = "float32") -> tuple[Buffer, ...]:
    """A conv kernel's arguments: data, weight (as the kernel reads it), the epilogue's
    ``extra`` buffers, then the output."""
    return (
        Buffer("data", data_shape, data_dtype),
        Buffer("weight", weight_shape, weight_dtype),
        *extra,
        Buffer("out", out_shape, out_dtype, role="out"),
    )


# A tensor past 2^31 elements fits no device buffer our kernels index with 32-bit ints.
MAX_ELEMENTS = 2**31 - 1


def tensor_shape(arg: Any, what: str, ndim: int,
                 dtypes: tuple[str, ...] = ("float32",)) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of an AutoTVM ``["TENSOR", shape, dtype]`` argument."""
    if not (isinstance(arg, (list, tuple)) and len(arg) == 3 and arg[0] == "TENSOR"):
        raise WorkloadError(f"{what}: expected [\"TENSOR\", shape, dtype], got {arg!r}")
    shape, dtype = arg[1], arg[2]
    if not isinstance(shape, (list, tuple)) or len(shape) != ndim or not all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape
    ):
        raise WorkloadError(f"{what}: shape must be {ndim} positive integers, got {shape!r}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise WorkloadError(f"{what}: shape {list(shape)} has more than 2^31-1 elements, "
                            f"more than a kernel can index")
    if dtype not in dtypes:
        raise WorkloadError(f"{what}: dtype {dtype!r} is not supported "
                            f"({' or '.join(dtypes)} only)")
    return tuple(shape), dtype


def int_pair(arg: Any, what: str, length: int = 2, minimum: int = 1) -> tuple[int, ...]:
    if isinstance(arg, int) and not isinstance(arg, bool):
        arg = [arg] * length
    if not isinstance(arg, (list, tuple)) or len(arg) != length or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in arg
    ):
        raise WorkloadError(f"{what}: expected {length} integers >= {minimum}, got {arg!r}")
    return tuple(arg)


__all__ = ["Buffer", "ConfigError", "Epilogue", "IOLayout", "Kernel", "Rule", "Stage", "Template",
           "Usage", "WorkloadError", "blocked_shape", "ceil_div", "factors", "from_blocked",
           "log2", "split_features", "to_blocked"]

"""``conv2d_nchw_int8.cuda``: the direct conv2d schedule on int8 data and weights.

int8 NCHW data times int8 OIHW weights, accumulated in int32 (TVM's quantized conv2d,
``out_dtype`` "int32"). The schedule is ``conv2d_nchw.cuda``'s: each block computes a
(tile_f x tile_y x tile_x) output tile, the 4-way splits bound to block / virtual
thread / thread / inner. The reduction runs over chunks of 4 input channels: the weight
is packed once at build time into one int per chunk (``pack_weight``: [CO, C/4, KH, KW],
channel 4k+j in byte j), the block packs the input window the same way as it fetches it
into local (shared) memory, and each multiply-add is one ``DP4A`` (the dp4a instruction
on CUDA sm_61+, byte arithmetic in OpenCL). ``tile_rc`` splits the C/4 chunks.

The fused epilogue is the requantize step of an int8 network: bias (int32), rounding
right shift, relu, residual add (int8 or int32), and an int8 store clipped to
[-127, 127] (``Epilogue.int_c_expr`` / ``int_store``); without one the output is the
int32 accumulator. Outputs are checked against numpy exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.templates.base import (
    INT8_MAX,
    INT8_MIN,
    Epilogue,
    Kernel,
    Template,
    Usage,
    WorkloadError,
    block_features,
    ceil_div,
    epilogue_buffers,
    inner_unrolled,
    io_buffers,
    log2,
    split_features,
    tensor_shape,
    warp_efficiency,
)
from compiler.templates.conv2d_nchw import SPATIAL, _Tiles, direct_default, direct_space
from compiler.templates.emit import Unroll, indent, signature
from compiler.templates.ops import Conv2dOp, conv2d_nchw_reference
from compiler.templates.space import ConfigSpace
from schemas import Config, DeviceLimits, Workload

# input channels per packed word: the 4 lanes of a dp4a
LANES = 4


@dataclass(frozen=True)
class Conv2dInt8Op(Conv2dOp):
    """conv2d NCHW/OIHW on int8 data and weights with int32 outputs; the args are TVM's
    int8 conv2d workload: data, kernel (both int8), strides, padding, dilation, "int32"."""

    @classmethod
    def from_args(cls, args: tuple[Any, ...]) -> Conv2dInt8Op:
        if len(args) != 6:
            raise WorkloadError(
                "conv2d int8 args: expected [data, kernel, strides, padding, dilation, "
                f"out_dtype], got {len(args)} items")
        data_shape, _ = tensor_shape(args[0], "args[0] (data)", 4, dtypes=("int8",))
        kernel_shape, _ = tensor_shape(args[1], "args[1] (kernel)", 4, dtypes=("int8",))
        if args[5] != "int32":
            raise WorkloadError(f"args[5] (out_dtype): {args[5]!r} is not supported "
                                "(int32 only: int8 products accumulate in int32)")
        # the geometry (strides, padding, dilation, channel agreement, output size) is
        # the float conv's: parse it there with the tensors retyped
        as_float = [["TENSOR", list(data_shape), "float32"],
                    ["TENSOR", list(kernel_shape), "float32"], *args[2:5], "float32"]
        base = Conv2dOp.from_args(tuple(as_float))
        op = cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        if op.c % LANES:
            raise WorkloadError(f"args[0] (data): {op.c} input channels; the int8 template "
                                f"packs channels {LANES} to a dp4a word, so it needs a "
                                f"multiple of {LANES}")
        return op

    @property
    def chunks(self) -> int:
        """Packed input-channel words: the reduction axis tile_rc splits."""
        return self.c // LANES

    def reference(self, data: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        # float64 sums of int8 products are exact far beyond these layer sizes
        return conv2d_nchw_reference(data, kernel, self.stride, self.pad, self.dilation,
                                     out_dtype="int32")


def pack_int8_weight(weight: np.ndarray) -> np.ndarray:
    """int8 OIHW [CO, C, KH, KW] -> int32 [CO, C/4, KH, KW]: the int8 values of input
    channels 4k .. 4k+3 in bytes 0 .. 3 (little-endian) of word k."""
    weight = np.asarray(weight)
    if weight.dtype != np.int8:
        if not np.issubdtype(weight.dtype, np.integer) and not np.array_equal(
                weight, np.round(weight)):
            raise ValueError(f"int8 weight expected, got {weight.dtype} with fractions")
        if weight.size and (weight.min() < -128 or weight.max() > 127):
            raise ValueError("weight values outside int8's range")
        weight = weight.astype(np.int8)
    co, c, kh, kw = weight.shape
    if c % LANES:
        raise ValueError(f"weight: {c} input channels is not a multiple of {LANES}")
    lanes_last = weight.reshape(co, c // LANES, LANES, kh, kw).transpose(0, 1, 3, 4, 2)
    words = np.ascontiguousarray(lanes_last).view("<i4").reshape(co, c // LANES, kh, kw)
    return words.astype(np.int32)


class Conv2dNCHWInt8(Template):
    name = "conv2d_nchw_int8.cuda"
    packs_weight = True

    def parse(self, workload: Workload) -> Conv2dInt8Op:
        return Conv2dInt8Op.from_args(workload.args)

    def _space(self, op: Conv2dInt8Op) -> ConfigSpace:
        return direct_space(op, op.chunks)

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """The float schedule's fallback: a thread per output, 8x8 blocks, 8 input
        channels (2 packed words) per reduction step."""
        return direct_default(self.space(workload), self.parse(workload), 2)

    # ---- operands: int8 in, int32 (or requantized int8) out, checked exactly ----

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        return pack_int8_weight(weight)

    def make_inputs(self, workload: Workload, epilogue: Epilogue,
                    rng: np.random.Generator) -> list[np.ndarray]:
        """int8 data and weight over [-127, 127]; an int32 bias and a residual of the
        epilogue's residual dtype, scaled to what they are added to (the accumulator,
        ~2**shift larger when they come before the shift)."""
        op = self.parse(workload)
        data_shape, weight_shape = op.input_shapes
        arrays = [rng.integers(INT8_MIN, INT8_MAX + 1, size=data_shape, dtype=np.int8),
                  rng.integers(INT8_MIN, INT8_MAX + 1, size=weight_shape, dtype=np.int8)]

        def scale(what: str) -> int:
            pre_shift = ("shift" in epilogue.ops
                         and epilogue.ops.index(what) < epilogue.ops.index("shift"))
            return 1 << (7 + (epilogue.shift if pre_shift else 0))

        if "bias" in epilogue.ops:
            bound = scale("bias")
            arrays.append(rng.integers(-bound, bound + 1, size=op.co, dtype=np.int32))
        if "add" in epilogue.ops:
            dtype = _residual_dtype(epilogue)
            if dtype == "int8":
                arrays.append(rng.integers(INT8_MIN, INT8_MAX + 1, size=op.output_shape,
                                           dtype=np.int8))
            else:
                bound = scale("add")
                arrays.append(rng.integers(-bound, bound + 1, size=op.output_shape,
                                           dtype=np.int32))
        return arrays

    # ---- device limits and features ----

    def _usage(self, op: Conv2dInt8Op, knobs: dict[str, np.ndarray]) -> Usage:
        return _Tiles(op, knobs).usage(op)

    def _feature_columns(self, op: Conv2dInt8Op, knobs: dict[str, np.ndarray]
                         ) -> dict[str, Any]:
        t = _Tiles(op, knobs)
        feats: dict[str, Any] = split_features(knobs, *SPATIAL, "tile_rc", "tile_ry", "tile_rx")
        blocks = t.blocks(op)
        steps = t.rco * t.ryo * t.rxo
        # per (rc, ry, rx) outer step: words fetched into local memory by the block (a
        # data word is 4 byte loads from global memory, a weight word one int load),
        # and each thread's dp4a on them
        fetched = t.aa_size + t.ww_size
        global_loads = LANES * t.aa_size + t.ww_size
        inner = t.rci * t.ryi * t.rxi
        inner_dp4a = inner * t.acc_size
        feats.update(
            block_features(knobs, t.threads, blocks, t.acc_size, t.shared_bytes),
            log_reduction_steps=log2(steps),
            flops_per_global_load=op.flops / (blocks * global_loads * steps),
            **t.block_shape_features(),
            log_inner_reduction=log2(inner),
            log_inner_dp4a=log2(inner_dp4a),
            inner_unrolled=inner_unrolled(knobs, inner_dp4a),
            # dp4a per distinct local-memory word a thread reads in a step
            register_reuse=t.acc_size / (t.vf * t.fi + t.vy * t.yi * t.vx * t.xi),
            flops_per_shared_byte=2 * LANES * t.threads * inner_dp4a / t.shared_bytes,
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            log_data_loads_per_thread=log2(ceil_div(LANES * t.aa_size, t.threads)),
            warp_efficiency=warp_efficiency(t.threads),
        )
        return feats

    # ---- codegen ----

    def _codegen(self, op: Conv2dInt8Op, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        out_dtype = _out_dtype(epilogue)
        residual_dtype = _residual_dtype(epilogue)
        t = _Tiles(op, knobs)
        unroll = Unroll(knobs["auto_unroll_max_step"], bool(knobs["unroll_explicit"]))
        plane = op.h * op.w
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1, bias_dtype="int32",
                                 residual_dtype=residual_dtype)
        dtypes = {"data": "int8", "weight": "int32", "out": out_dtype,
                  **{b.name: b.dtype for b in extra}}
        entry = "conv2d_nchw_int8_kernel"
        body = t.prologue(signature(entry, ["data", "weight", *[b.name for b in extra]], "out",
                                    dtypes), "int")
        body += t.zero_acc("0", unroll)
        # A data word packs input channels 4c .. 4c+3 at one (ih, iw): 4 byte loads a
        # plane apart, bytes 0..3 little-endian as the weight words are packed.
        lanes = " | ".join(
            f"((unsigned int)(p[{j * plane}] & 0xff) << {8 * j})" if j else
            "(unsigned int)(p[0] & 0xff)" for j in range(LANES))
        fetch = [
            "BARRIER();",
            *t.window_fetch(op, *t.window_steps(op)),
            "  int word = 0;",
            f"  if (ih >= 0 && ih < {op.h} && iw >= 0 && iw < {op.w}) {{",
            f"    GLOBAL const INT8_T* p = data + ((n * {op.c} + (rco * {t.rci} + c) * {LANES})"
            f" * {op.h} + ih) * {op.w} + iw;",
            f"    word = (int)({lanes});",
            "  }",
            "  AA[i] = word;",
            "}",
            *t.weight_fetch(op, op.chunks),
            "BARRIER();",
        ]
        inner = [
            f"acc[{t.acc_index}] = DP4A(AA[{t.window_index(op, 'rci', 'ryi', 'rxi')}],"
            f" WW[{t.weight_index()}], acc[{t.acc_index}]);"
        ]
        body += indent(t.reduction(fetch, inner, unroll))
        value = epilogue.int_c_expr(f"acc[{t.acc_index}]", "bias[f]", "residual[o]")
        body += t.store(op, epilogue.int_store(value, out_dtype), unroll)
        buffers = io_buffers(op.input_shapes[0], (op.co, op.chunks, op.kh, op.kw), extra,
                             out_shape, "int8", "int32", out_dtype)
        return t.kernel(op, body, entry, buffers)


def _out_dtype(epilogue: Epilogue) -> str:
    dtype = epilogue.out_dtype or "int32"
    if dtype not in ("int8", "int32"):
        raise WorkloadError(f"epilogue out_dtype {dtype!r}: conv2d_nchw_int8 stores int32 "
                            "accumulators or requantized int8, not float")
    return dtype


def _residual_dtype(epilogue: Epilogue) -> str:
    dtype = epilogue.residual_dtype or _out_dtype(epilogue)
    if dtype not in ("int8", "int32"):
        raise WorkloadError(f"epilogue residual_dtype {dtype!r}: conv2d_nchw_int8 adds an "
                            "int8 or int32 residual")
    return dtype


TEMPLATE = Conv2dNCHWInt8()

"""``depthwise_conv2d_nchw.cuda``: AutoTVM's depthwise conv2d schedule for GPUs.

Output channel ``o`` of a depthwise conv reads only input channel ``o // M`` (``M`` the
channel multiplier) with the ``kh x kw`` filter ``weight[o // M][o % M]``. Each block
computes a (tile_f x tile_y x tile_x) output tile; the 4-way splits bind to block /
virtual thread / thread / inner as in ``conv2d_nchw.cuda``. There is no reduction over
channels, so the block fetches its whole padded input window (the input channels its
output channels read) and its filters into local (shared) memory once, then every thread
accumulates its register tile over the kernel taps. A TopHub config means the same here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.templates.base import (
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
    split_knobs,
    unroll_knobs,
    warp_efficiency,
)
from compiler.templates.conv2d_nchw import SPATIAL, SpatialTiles, spatial_knobs
from compiler.templates.emit import AUTO, Unroll, indent, loop_nest, signature
from compiler.templates.ops import ConvWindow, conv2d_nchw_reference, conv_args
from compiler.templates.space import ConfigError, ConfigSpace, divisors
from schemas import Config, DeviceLimits, Workload

ENTRY = "depthwise_conv2d_nchw_kernel"


@dataclass(frozen=True)
class DepthwiseConv2dOp(ConvWindow):
    """depthwise conv2d, NCHW data and [C, M, kh, kw] weight (AutoTVM's args: data, kernel,
    strides, padding, dilation, out_dtype); output [N, C * M, OH, OW]."""

    n: int
    c: int
    h: int
    w: int
    multiplier: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]

    @classmethod
    def from_args(cls, args: tuple[Any, ...] | list[Any]) -> DepthwiseConv2dOp:
        (n, c, h, w), (kc, m, kh, kw), stride, pad, dilation = conv_args(args,
                                                                        "depthwise_conv2d")
        if kc != c:
            raise WorkloadError(
                f"args[1] (kernel): {kc} channels, data has {c}; a depthwise kernel is "
                f"[channels, multiplier, kh, kw] = [{c}, M, kh, kw]"
            )
        op = cls(n, c, h, w, m, kh, kw, stride, pad, dilation)  # type: ignore[arg-type]
        if op.oh < 1 or op.ow < 1:
            raise WorkloadError(
                f"depthwise_conv2d output would be {op.oh}x{op.ow}: the dilated kernel "
                f"{kh}x{kw} (dilation {dilation[0]}x{dilation[1]}) does not fit the padded "
                f"{h + pad[0] + pad[2]}x{w + pad[1] + pad[3]} input"
            )
        return op

    @property
    def co(self) -> int:
        return self.c * self.multiplier

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        return [(self.n, self.c, self.h, self.w), (self.c, self.multiplier, self.kh, self.kw)]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.n, self.co, self.oh, self.ow)

    @property
    def flops(self) -> int:
        return 2 * self.n * self.co * self.oh * self.ow * self.kh * self.kw

    def reference(self, data: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        # [C, M, kh, kw] is the memory of an OIHW [C * M, 1, kh, kw] weight with groups C
        grouped = kernel.reshape(self.co, 1, self.kh, self.kw)
        return conv2d_nchw_reference(data, grouped, self.stride, self.pad, self.dilation,
                                     groups=self.c)


class DepthwiseConv2dNCHW(Template):
    name = "depthwise_conv2d_nchw.cuda"

    def parse(self, workload: Workload) -> DepthwiseConv2dOp:
        return DepthwiseConv2dOp.from_args(workload.args)

    def _space(self, op: DepthwiseConv2dOp) -> ConfigSpace:
        # Newer AutoTVM defines unroll_explicit as [1] only for nvptx / rocm targets;
        # TopHub's records (its rocm ones too, tuned before that rule) and ours use [0, 1].
        return ConfigSpace([*spatial_knobs(op), *unroll_knobs((0, 256, 1500))])

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        """Knob values of ``config``. AutoTVM applies a split by its inner factors only
        (the outer one is implied by the extent, hence the -1 it writes today); three
        records of TopHub's opencl_v0.04.log (lines 92, 96, 99) carry an outer factor
        that does not multiply out with the inner ones. They are read as AutoTVM runs
        them: inner factors as written, outer implied."""
        space = self.space(workload)
        try:
            return space.decode(config)
        except ConfigError as err:
            implied = _outer_implied(config)
            if implied is None:
                raise
            try:
                return space.decode(implied)
            except ConfigError:
                raise err from None

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """A thread per output in blocks of up to 8x8 threads, one channel per block:
        along y and x, the largest divisor of the output extent up to 8 threads."""
        op = self.parse(workload)
        space = self.space(workload)
        knobs = split_knobs(space)

        def threads(extent: int) -> tuple[int, int, int]:
            return (1, max(d for d in divisors(extent) if d <= 8), 1)

        values: dict[str, Any] = {
            "tile_f": knobs["tile_f"].nearest((1, 1, 1)),
            "tile_y": knobs["tile_y"].nearest(threads(op.oh)),
            "tile_x": knobs["tile_x"].nearest(threads(op.ow)),
            "auto_unroll_max_step": 256,
            # AutoTVM's fallback forces unroll_explicit off
            "unroll_explicit": 0,
        }
        return space.to_config(values)

    def _usage(self, op: DepthwiseConv2dOp, knobs: dict[str, np.ndarray]) -> Usage:
        return _Tiles(op, knobs).usage(op)

    def _feature_columns(self, op: DepthwiseConv2dOp,
                         knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(op, knobs)
        feats: dict[str, Any] = split_features(knobs, *SPATIAL)
        blocks = t.blocks(op)
        taps = op.kh * op.kw
        fetched = t.aa_size + t.ww_size
        inner_fmas = taps * t.acc_size
        feats.update(
            block_features(knobs, t.threads, blocks, t.acc_size, t.shared_bytes),
            # every fetched element is one global load, once per block
            flops_per_shared_load=op.flops / (blocks * fetched),
            **t.block_shape_features(),
            log_inner_fmas=log2(inner_fmas),
            inner_unrolled=inner_unrolled(knobs, inner_fmas),
            # input elements fetched per output pixel of a channel (the window's halo)
            halo_overhead=t.ah * t.aw / (t.block_y * t.block_x),
            # multiply-adds per local-memory value a thread reads in one tap (each output
            # reads an input of its own; its weight is shared along y and x)
            register_reuse=t.acc_size / (t.vf * t.fi + t.acc_size),
            flops_per_shared_byte=2 * t.threads * inner_fmas / t.shared_bytes,
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            warp_efficiency=warp_efficiency(t.threads),
        )
        return feats

    def _codegen(self, op: DepthwiseConv2dOp, knobs: dict[str, Any],
                 epilogue: Epilogue) -> Kernel:
        t = _Tiles(op, knobs)
        unroll = Unroll(knobs["auto_unroll_max_step"], bool(knobs["unroll_explicit"]))
        m = op.multiplier
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)
        # the block's output channel f0 + lf reads input channel (f0 + lf) / M, which is
        # AA's channel (f0 + lf) / M - f0 / M
        local_c = t.local_f if m == 1 else f"((f0 + {t.local_f}) / {m} - c0)"
        body = t.prologue(signature(ENTRY, ["data", "weight", *[b.name for b in extra]], "out"),
                          "float", f"  const int c0 = f0 / {m};")
        # Channels past C can be in the window only when a block's output channels may
        # straddle an input channel boundary unevenly (M > 1): they read as zero, unused.
        in_range = [f"ih >= 0 && ih < {op.h} && iw >= 0 && iw < {op.w}"]
        if m > 1:
            in_range.insert(0, f"c0 + c < {op.c}")
        fetch = [
            *t.window_fetch(op),
            f"  AA[i] = ({' && '.join(in_range)})",
            f"      ? data[((n * {op.c} + c0 + c) * {op.h} + ih) * {op.w} + iw] : 0.0f;",
            "}",
            # weight [C, M, kh, kw] is [C * M, kh, kw] in memory: the block's filters are
            # one contiguous run
            f"for (int i = tid; i < {t.ww_size}; i += {t.threads}) {{",
            f"  WW[i] = weight[f0 * {op.kh * op.kw} + i];",
            "}",
            "BARRIER();",
        ]
        body += indent(fetch)
        body += t.zero_acc("0.0f", unroll)
        inner = [
            f"acc[{t.acc_index}] += AA[{t.window_index(op, local_c, 'ky', 'kx')}]"
            f" * WW[({t.local_f} * {op.kh} + ky) * {op.kw} + kx];"
        ]
        body += indent(loop_nest([("ky", op.kh, AUTO), ("kx", op.kw, AUTO), *t.acc_loops()],
                                 inner, unroll))
        value = epilogue.c_expr(f"acc[{t.acc_index}]", "bias[f]", "residual[o]")
        body += t.store(op, value, unroll)
        return t.kernel(op, body, ENTRY, io_buffers(*op.input_shapes, extra, out_shape))


class _Tiles(SpatialTiles):
    """The output tile; the block fetches, once, the input window of the ``ac`` input
    channels its output channels read (every tap) and their filters."""

    def __init__(self, op: DepthwiseConv2dOp, k: dict[str, Any]) -> None:
        super().__init__(k)
        self.ac = channels_spanned(self.block_f, op.multiplier, op.c)
        self.ah = (self.block_y - 1) * op.stride[0] + (op.kh - 1) * op.dilation[0] + 1
        self.aw = (self.block_x - 1) * op.stride[1] + (op.kw - 1) * op.dilation[1] + 1
        self.aa_size = self.ac * self.ah * self.aw
        self.ww_size = self.block_f * op.kh * op.kw
        self.shared_bytes = 4 * (self.aa_size + self.ww_size)


def channels_spanned(block_f: Any, multiplier: int, channels: int) -> Any:
    """The most input channels any block of ``block_f`` consecutive output channels (at a
    multiple of ``block_f``) reads, with ``multiplier`` outputs per input channel.

    A block starts at an output offset r = f0 mod M that is a multiple of
    g = gcd(block_f, M), so r <= M - g, and covers floor((r + block_f - 1) / M) + 1 input
    channels: M | block_f gives block_f / M, block_f | M gives 1."""
    g = np.gcd(block_f, multiplier)
    return np.minimum((multiplier - g + block_f - 1) // multiplier + 1, channels)


def _outer_implied(config: Config) -> Config | None:
    """``config`` with every explicit outer split factor replaced by -1 (implied), or
    None when it has none to replace."""
    entity, changed = [], False
    for e in config.entity:
        value = e.value
        if e.kind == "sp" and isinstance(value, (list, tuple)) and value and value[0] != -1:
            e = e.model_copy(update={"value": [-1, *value[1:]]})
            changed = True
        entity.append(e)
    return config.model_copy(update={"entity": tuple(entity)}) if changed else None


TEMPLATE = DepthwiseConv2dNCHW()

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
    Buffer,
    Epilogue,
    Kernel,
    Template,
    Usage,
    WorkloadError,
    ceil_div,
    epilogue_buffers,
    factors,
    int_pair,
    log2,
    split_features,
    tensor_shape,
)
from compiler.templates.emit import AUTO, VTHREAD, Unroll, indent, loop_nest, signature
from compiler.templates.ops import conv2d_nchw_reference
from compiler.templates.space import (
    ConfigError,
    ConfigSpace,
    OtherKnob,
    SplitKnob,
    divisors,
)
from schemas import Config, Workload

SPATIAL = ("tile_f", "tile_y", "tile_x")
ENTRY = "depthwise_conv2d_nchw_kernel"


@dataclass(frozen=True)
class DepthwiseConv2dOp:
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
        if len(args) != 6:
            raise WorkloadError(
                "depthwise_conv2d args: expected [data, kernel, strides, padding, dilation, "
                f"out_dtype], got {len(args)} items"
            )
        (n, c, h, w), _ = tensor_shape(args[0], "args[0] (data)", 4)
        (kc, m, kh, kw), _ = tensor_shape(args[1], "args[1] (kernel)", 4)
        stride = int_pair(args[2], "args[2] (strides)")
        pad_arg = args[3]
        if isinstance(pad_arg, (list, tuple)) and len(pad_arg) == 2:
            pad_arg = [pad_arg[0], pad_arg[1], pad_arg[0], pad_arg[1]]
        pad = int_pair(pad_arg, "args[3] (padding)", length=4, minimum=0)
        dilation = int_pair(args[4], "args[4] (dilation)")
        if args[5] != "float32":
            raise WorkloadError(f"args[5] (out_dtype): {args[5]!r} is not supported (float32 only)")
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
    def oh(self) -> int:
        span = (self.kh - 1) * self.dilation[0] + 1
        return (self.h + self.pad[0] + self.pad[2] - span) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        span = (self.kw - 1) * self.dilation[1] + 1
        return (self.w + self.pad[1] + self.pad[3] - span) // self.stride[1] + 1

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
        return ConfigSpace([
            SplitKnob("tile_f", op.co, 4),
            SplitKnob("tile_y", op.oh, 4),
            SplitKnob("tile_x", op.ow, 4),
            OtherKnob("auto_unroll_max_step", (0, 256, 1500)),
            OtherKnob("unroll_explicit", (0, 1)),
        ])

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

    def default_config(self, workload: Workload) -> Config:
        """A thread per output in blocks of up to 8x8 threads, one channel per block:
        along y and x, the largest divisor of the output extent up to 8 threads."""
        op = self.parse(workload)
        space = self.space(workload)
        knobs = {k.name: k for k in space.knobs if isinstance(k, SplitKnob)}

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
        t = _Tiles(op, knobs)
        return Usage(threads=t.threads, threads_x=t.tx, threads_y=t.ty, threads_z=t.tf,
                     shared_bytes=t.shared_bytes, local_elements=t.acc_size)

    def _feature_columns(self, op: DepthwiseConv2dOp,
                         knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(op, knobs)
        feats: dict[str, Any] = split_features(knobs, *SPATIAL)
        max_step = knobs["auto_unroll_max_step"]
        blocks = op.n * t.bf * t.by * t.bx
        taps = op.kh * op.kw
        fetched = t.aa_size + t.ww_size
        inner_fmas = taps * t.acc_size
        feats.update(
            auto_unroll_max_step=max_step,
            unroll_explicit=knobs["unroll_explicit"],
            log_threads=log2(t.threads),
            log_blocks=log2(blocks),
            log_acc=log2(t.acc_size),
            log_shared_bytes=log2(t.shared_bytes),
            # every fetched element is one global load, once per block
            flops_per_shared_load=op.flops / (blocks * fetched),
            log_vthreads=log2(t.vf * t.vy * t.vx),
            log_block_outputs=log2(t.block_f * t.block_y * t.block_x),
            log_inner_fmas=log2(inner_fmas),
            # the compute nest is unrolled when it fits auto_unroll_max_step (emit.Unroll)
            inner_unrolled=(max_step > 0) & (inner_fmas <= max_step),
            # input elements fetched per output pixel of a channel (the window's halo)
            halo_overhead=t.ah * t.aw / (t.block_y * t.block_x),
            # multiply-adds per local-memory value a thread reads in one tap (each output
            # reads an input of its own; its weight is shared along y and x)
            register_reuse=t.acc_size / (t.vf * t.fi + t.acc_size),
            flops_per_shared_byte=2 * t.threads * inner_fmas / t.shared_bytes,
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            warp_efficiency=t.threads / (32 * ceil_div(t.threads, 32)),
        )
        return feats

    def _codegen(self, op: DepthwiseConv2dOp, knobs: dict[str, Any],
                 epilogue: Epilogue) -> Kernel:
        t = _Tiles(op, knobs)
        unroll = Unroll(knobs["auto_unroll_max_step"], bool(knobs["unroll_explicit"]))
        sh, sw = op.stride
        dh, dw = op.dilation
        m = op.multiplier
        ah, aw = t.ah, t.aw
        aa_size = int(t.aa_size)
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)

        acc_loops = [("vf", t.vf, VTHREAD), ("fi", t.fi, AUTO), ("vy", t.vy, VTHREAD),
                     ("yi", t.yi, AUTO), ("vx", t.vx, VTHREAD), ("xi", t.xi, AUTO)]
        acc_index = (f"((vf * {t.fi} + fi) * {t.vy * t.yi} + vy * {t.yi} + yi) * {t.vx * t.xi}"
                     f" + vx * {t.xi} + xi")
        local_f = f"((vf * {t.tf} + tz) * {t.fi} + fi)"
        local_y = f"((vy * {t.ty} + ty) * {t.yi} + yi)"
        local_x = f"((vx * {t.tx} + tx) * {t.xi} + xi)"
        # the block's output channel f0 + lf reads input channel (f0 + lf) / M, which is
        # AA's channel (f0 + lf) / M - f0 / M
        local_c = local_f if m == 1 else f"((f0 + {local_f}) / {m} - c0)"

        body = [
            signature(ENTRY, ["data", "weight", *[b.name for b in extra]], "out") + " {",
            f"  LOCAL float AA[{aa_size}];",
            f"  LOCAL float WW[{t.ww_size}];",
            f"  float acc[{t.acc_size}];",
            "  const int tx = THREAD_X, ty = THREAD_Y, tz = THREAD_Z;",
            f"  const int tid = (tz * {t.ty} + ty) * {t.tx} + tx;",
            f"  const int n = BLOCK_Z / {t.bf};",
            f"  const int f0 = (BLOCK_Z % {t.bf}) * {t.block_f};",
            f"  const int c0 = f0 / {m};",
            f"  const int y0 = BLOCK_Y * {t.block_y};",
            f"  const int x0 = BLOCK_X * {t.block_x};",
        ]
        # Channels past C can be in the window only when a block's output channels may
        # straddle an input channel boundary unevenly (M > 1): they read as zero, unused.
        in_range = [f"ih >= 0 && ih < {op.h} && iw >= 0 && iw < {op.w}"]
        if m > 1:
            in_range.insert(0, f"c0 + c < {op.c}")
        fetch = [
            f"for (int i = tid; i < {aa_size}; i += {t.threads}) {{",
            f"  const int c = i / {ah * aw}, r = (i / {aw}) % {ah}, s = i % {aw};",
            f"  const int ih = y0 * {sh} - {op.pad[0]} + r;",
            f"  const int iw = x0 * {sw} - {op.pad[1]} + s;",
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
        body += indent(loop_nest(acc_loops, [f"acc[{acc_index}] = 0.0f;"], unroll))
        inner = [
            f"acc[{acc_index}] += AA[({local_c} * {ah} + {local_y} * {sh} + ky * {dh}) * {aw}"
            f" + {local_x} * {sw} + kx * {dw}]"
            f" * WW[({local_f} * {op.kh} + ky) * {op.kw} + kx];"
        ]
        body += indent(loop_nest([("ky", op.kh, AUTO), ("kx", op.kw, AUTO), *acc_loops],
                                 inner, unroll))
        value = epilogue.c_expr(f"acc[{acc_index}]", "bias[f]", "residual[o]")
        store = [
            f"const int f = f0 + {local_f};",
            f"const int o = ((n * {op.co} + f) * {op.oh} + y0 + {local_y}) * {op.ow}"
            f" + x0 + {local_x};",
            f"out[o] = {value};",
        ]
        body += indent(loop_nest(acc_loops, store, unroll))
        body.append("}")
        buffers = (
            Buffer("data", op.input_shapes[0]),
            Buffer("weight", op.input_shapes[1]),
            *extra,
            Buffer("out", out_shape, role="out"),
        )
        return Kernel(
            source="\n".join(body) + "\n",
            entry=ENTRY,
            grid=(t.bx, t.by, op.n * t.bf),
            block=(t.tx, t.ty, t.tf),
            buffers=buffers,
            dialect="",
            meta={"shared_bytes": int(t.shared_bytes), "threads": t.threads},
        )


class _Tiles:
    """Tile extents a config implies, named as the schedule binds them: ints for one
    config's knobs (codegen), arrays [n] for ``ConfigSpace.columns`` (features, limits)."""

    def __init__(self, op: DepthwiseConv2dOp, k: dict[str, Any]) -> None:
        self.bf, self.vf, self.tf, self.fi = factors(k["tile_f"])
        self.by, self.vy, self.ty, self.yi = factors(k["tile_y"])
        self.bx, self.vx, self.tx, self.xi = factors(k["tile_x"])
        self.block_f = self.vf * self.tf * self.fi
        self.block_y = self.vy * self.ty * self.yi
        self.block_x = self.vx * self.tx * self.xi
        self.threads = self.tf * self.ty * self.tx
        self.acc_size = self.vf * self.fi * self.vy * self.yi * self.vx * self.xi
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

"""``conv2d_nchw.cuda``: AutoTVM's direct conv2d schedule for GPUs.

Each block computes a (tile_f x tile_y x tile_x) output tile; the 4-way splits bind to
block / virtual thread / thread / inner. Per (rc, ry, rx) outer step, the block fetches
the input window and weight slice it needs into local (shared) memory cooperatively,
then every thread accumulates its register tile. A TopHub config means the same here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.templates.base import (
    Buffer,
    Epilogue,
    Kernel,
    Template,
    Usage,
    block_features,
    ceil_div,
    epilogue_buffers,
    factors,
    inner_unrolled,
    io_buffers,
    log2,
    split_features,
    split_knobs,
    unroll_knobs,
    warp_efficiency,
)
from compiler.templates.emit import AUTO, VTHREAD, Unroll, indent, loop_nest, signature
from compiler.templates.ops import Conv2dOp
from compiler.templates.space import ConfigError, ConfigSpace, SplitKnob
from schemas import Config, DeviceLimits, Workload

SPATIAL = ("tile_f", "tile_y", "tile_x")


class Conv2dNCHW(Template):
    name = "conv2d_nchw.cuda"

    def parse(self, workload: Workload) -> Conv2dOp:
        return Conv2dOp.from_args(workload.args)

    def _space(self, op: Conv2dOp) -> ConfigSpace:
        return direct_space(op, op.c)

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        space = self.space(workload)
        # TopHub's older logs (cuda v0.10, rocm v0.05, opencl v0.04) list tile_rx before
        # tile_ry and name the kernel-height split tile_rx: their index agrees only with
        # that reading, square kernels included. Read a config as its entity order says
        # first; with kh != kw only one reading multiplies out, so fall back to the other.
        names = [e.name for e in config.entity]
        if "tile_ry" not in names or "tile_rx" not in names:
            return space.decode(config)
        swapped = None
        if names.index("tile_rx") < names.index("tile_ry"):
            swapped = _swap_ry_rx(config)
            try:
                return space.decode(swapped)
            except ConfigError:
                pass
        try:
            return space.decode(config)
        except ConfigError as err:  # the message names knobs as the config wrote them
            try:
                return space.decode(swapped or _swap_ry_rx(config))
            except ConfigError:
                raise err from None

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """AutoTVM's fallback for the direct schedule: a thread per output, 8x8 blocks."""
        return direct_default(self.space(workload), self.parse(workload), 8)

    def _usage(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> Usage:
        return _Tiles(op, knobs).usage(op)

    def _feature_columns(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(op, knobs)
        feats: dict[str, Any] = split_features(knobs, *SPATIAL, "tile_rc", "tile_ry", "tile_rx")
        blocks = t.blocks(op)
        steps = t.rco * t.ryo * t.rxo
        # per (rc, ry, rx) outer step: elements fetched into local memory by the block,
        # and each thread's multiply-adds on them
        fetched = t.aa_size + t.ww_size
        inner = t.rci * t.ryi * t.rxi
        inner_fmas = inner * t.acc_size
        feats.update(
            block_features(knobs, t.threads, blocks, t.acc_size, t.shared_bytes),
            log_reduction_steps=log2(steps),
            # every fetched element is one global load
            flops_per_shared_load=op.flops / (blocks * fetched * steps),
            **t.block_shape_features(),
            log_inner_reduction=log2(inner),
            log_inner_fmas=log2(inner_fmas),
            inner_unrolled=inner_unrolled(knobs, inner_fmas),
            # multiply-adds per distinct local-memory value a thread reads in a step
            register_reuse=t.acc_size / (t.vf * t.fi + t.vy * t.yi * t.vx * t.xi),
            flops_per_shared_byte=2 * t.threads * inner_fmas / t.shared_bytes,
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            warp_efficiency=warp_efficiency(t.threads),
        )
        return feats

    def _codegen(self, op: Conv2dOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        t = _Tiles(op, knobs)
        unroll = Unroll(knobs["auto_unroll_max_step"], bool(knobs["unroll_explicit"]))
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)
        entry = "conv2d_nchw_kernel"
        body = t.prologue(signature(entry, ["data", "weight", *[b.name for b in extra]], "out"),
                          "float")
        body += t.zero_acc("0.0f", unroll)
        fetch = [
            "BARRIER();",
            *t.window_fetch(op, *t.window_steps(op)),
            f"  AA[i] = (ih >= 0 && ih < {op.h} && iw >= 0 && iw < {op.w})",
            f"      ? data[((n * {op.c} + rco * {t.rci} + c) * {op.h} + ih) * {op.w} + iw]"
            " : 0.0f;",
            "}",
            *t.weight_fetch(op, op.c),
            "BARRIER();",
        ]
        inner = [
            f"acc[{t.acc_index}] += AA[{t.window_index(op, 'rci', 'ryi', 'rxi')}]"
            f" * WW[{t.weight_index()}];"
        ]
        body += indent(t.reduction(fetch, inner, unroll))
        value = epilogue.c_expr(f"acc[{t.acc_index}]", "bias[f]", "residual[o]")
        body += t.store(op, value, unroll)
        return t.kernel(op, body, entry, io_buffers(*op.input_shapes, extra, out_shape))


def direct_space(op: Conv2dOp, channels: int) -> ConfigSpace:
    """The direct schedule's knobs in AutoTVM's order; ``channels`` is the extent of the
    channel reduction tile_rc splits."""
    return ConfigSpace([
        *spatial_knobs(op),
        SplitKnob("tile_rc", channels, 2),
        SplitKnob("tile_ry", op.kh, 2),
        SplitKnob("tile_rx", op.kw, 2),
        *unroll_knobs((0, 512, 1500)),
    ])


def spatial_knobs(op: Any) -> list[SplitKnob]:
    """The three 4-way splits of the output (channels, rows, columns)."""
    return [
        SplitKnob("tile_f", op.co, 4),
        SplitKnob("tile_y", op.oh, 4),
        SplitKnob("tile_x", op.ow, 4),
    ]


def direct_default(space: ConfigSpace, op: Conv2dOp, rc: int) -> Config:
    """AutoTVM's fallback for the direct schedule: a thread per output, 8x8 blocks, ``rc``
    reduction channels per step, the whole kernel window in one."""
    knobs = split_knobs(space)
    values: dict[str, Any] = {
        "tile_f": knobs["tile_f"].nearest((1, 8, 1)),
        "tile_y": knobs["tile_y"].nearest((1, 8, 1)),
        "tile_x": knobs["tile_x"].nearest((1, 8, 1)),
        "tile_rc": knobs["tile_rc"].nearest((rc,)),
        "tile_ry": knobs["tile_ry"].nearest((op.kh,)),
        "tile_rx": knobs["tile_rx"].nearest((op.kw,)),
        "auto_unroll_max_step": 512,
        "unroll_explicit": 0,
    }
    return space.to_config(values)


class SpatialTiles:
    """The output tile of a direct schedule (conv2d_nchw, its int8 form, depthwise): the
    4-way splits tile_f / tile_y / tile_x bound to block / virtual thread / thread / inner,
    named as the schedule binds them: ints for one config's knobs (codegen), arrays [n]
    for ``ConfigSpace.columns`` (features, limits). A subclass sets the local-memory
    sizes ``aa_size`` (input window), ``ww_size`` (weights) and ``shared_bytes``, and
    the window's extent ``ah`` x ``aw``."""

    aa_size: Any
    ww_size: Any
    shared_bytes: Any
    ah: Any
    aw: Any

    def __init__(self, k: dict[str, Any]) -> None:
        self.bf, self.vf, self.tf, self.fi = factors(k["tile_f"])
        self.by, self.vy, self.ty, self.yi = factors(k["tile_y"])
        self.bx, self.vx, self.tx, self.xi = factors(k["tile_x"])
        self.block_f = self.vf * self.tf * self.fi
        self.block_y = self.vy * self.ty * self.yi
        self.block_x = self.vx * self.tx * self.xi
        self.threads = self.tf * self.ty * self.tx
        self.acc_size = self.vf * self.fi * self.vy * self.yi * self.vx * self.xi

    # ---- limits and features ----

    def usage(self, op: Any) -> Usage:
        return Usage(threads=self.threads, threads_x=self.tx, threads_y=self.ty,
                     threads_z=self.tf, shared_bytes=self.shared_bytes,
                     local_elements=self.acc_size, grid=self.grid(op))

    def grid(self, op: Any) -> tuple[Any, Any, Any]:
        # batch and channel blocks share z: at batch 128 they pass CUDA's 65,535
        return (self.bx, self.by, op.n * self.bf)

    def blocks(self, op: Any) -> Any:
        return op.n * self.bf * self.by * self.bx

    def block_shape_features(self) -> dict[str, Any]:
        return {"log_vthreads": log2(self.vf * self.vy * self.vx),
                "log_block_outputs": log2(self.block_f * self.block_y * self.block_x)}

    # ---- codegen (one config's ints) ----

    def acc_loops(self) -> list[tuple[str, int, str]]:
        return [("vf", self.vf, VTHREAD), ("fi", self.fi, AUTO), ("vy", self.vy, VTHREAD),
                ("yi", self.yi, AUTO), ("vx", self.vx, VTHREAD), ("xi", self.xi, AUTO)]

    @property
    def acc_index(self) -> str:
        return (f"((vf * {self.fi} + fi) * {self.vy * self.yi} + vy * {self.yi} + yi)"
                f" * {self.vx * self.xi} + vx * {self.xi} + xi")

    @property
    def local_f(self) -> str:
        return f"((vf * {self.tf} + tz) * {self.fi} + fi)"

    @property
    def local_y(self) -> str:
        return f"((vy * {self.ty} + ty) * {self.yi} + yi)"

    @property
    def local_x(self) -> str:
        return f"((vx * {self.tx} + tx) * {self.xi} + xi)"

    def prologue(self, head: str, dtype: str, *after_f0: str) -> list[str]:
        """The kernel's first lines: ``head`` (its signature), the local-memory tiles AA
        and WW and the accumulators of ``dtype``, the thread and block coordinates (and
        ``after_f0``, lines that need the block's first channel f0)."""
        return [
            head + " {",
            f"  LOCAL {dtype} AA[{self.aa_size}];",
            f"  LOCAL {dtype} WW[{self.ww_size}];",
            f"  {dtype} acc[{self.acc_size}];",
            "  const int tx = THREAD_X, ty = THREAD_Y, tz = THREAD_Z;",
            f"  const int tid = (tz * {self.ty} + ty) * {self.tx} + tx;",
            f"  const int n = BLOCK_Z / {self.bf};",
            f"  const int f0 = (BLOCK_Z % {self.bf}) * {self.block_f};",
            *after_f0,
            f"  const int y0 = BLOCK_Y * {self.block_y};",
            f"  const int x0 = BLOCK_X * {self.block_x};",
        ]

    def zero_acc(self, zero: str, unroll: Unroll) -> list[str]:
        return indent(loop_nest(self.acc_loops(), [f"acc[{self.acc_index}] = {zero};"], unroll))

    def window_fetch(self, op: Any, step_y: str = "", step_x: str = "") -> list[str]:
        """The head of the block's cooperative fetch of its input window AA: element i
        is channel c, window row r and column s, input row ih and column iw (``step_y``
        and ``step_x`` add the reduction step's offset)."""
        ah, aw = self.ah, self.aw
        return [
            f"for (int i = tid; i < {self.aa_size}; i += {self.threads}) {{",
            f"  const int c = i / {ah * aw}, r = (i / {aw}) % {ah}, s = i % {aw};",
            f"  const int ih = y0 * {op.stride[0]}{step_y} - {op.pad[0]} + r;",
            f"  const int iw = x0 * {op.stride[1]}{step_x} - {op.pad[1]} + s;",
        ]

    def window_index(self, op: Any, channel: str, ky: str, kx: str) -> str:
        """AA's element that a thread's output (local_y, local_x) reads at tap (ky, kx)
        of window channel ``channel``."""
        sh, sw = op.stride
        dh, dw = op.dilation
        return (f"({channel} * {self.ah} + {self.local_y} * {sh} + {ky} * {dh}) * {self.aw}"
                f" + {self.local_x} * {sw} + {kx} * {dw}")

    def store(self, op: Any, value: str, unroll: Unroll) -> list[str]:
        """Every accumulator stored as ``value`` (over f and o), and the kernel's end."""
        store = [
            f"const int f = f0 + {self.local_f};",
            f"const int o = ((n * {op.co} + f) * {op.oh} + y0 + {self.local_y}) * {op.ow}"
            f" + x0 + {self.local_x};",
            f"out[o] = {value};",
        ]
        return [*indent(loop_nest(self.acc_loops(), store, unroll)), "}"]

    def kernel(self, op: Any, body: list[str], entry: str, buffers: tuple[Buffer, ...]) -> Kernel:
        return Kernel(
            source="\n".join(body) + "\n",
            entry=entry,
            grid=self.grid(op),
            block=(self.tx, self.ty, self.tf),
            buffers=buffers,
            dialect="",
            meta={"shared_bytes": int(self.shared_bytes), "threads": self.threads},
        )


class _Tiles(SpatialTiles):
    """The output tile and the (rc, ry, rx) reduction steps: per outer step the block
    fetches an input window of rci channels and the weights of its block_f channels.
    conv2d_nchw_int8 uses it as is, its channels being packed words (rco x rci = C/4)."""

    def __init__(self, op: Conv2dOp, k: dict[str, Any]) -> None:
        super().__init__(k)
        self.rco, self.rci = factors(k["tile_rc"])
        self.ryo, self.ryi = factors(k["tile_ry"])
        self.rxo, self.rxi = factors(k["tile_rx"])
        self.ah = (self.block_y - 1) * op.stride[0] + (self.ryi - 1) * op.dilation[0] + 1
        self.aw = (self.block_x - 1) * op.stride[1] + (self.rxi - 1) * op.dilation[1] + 1
        self.aa_size = self.rci * self.ah * self.aw
        self.ww_size = self.block_f * self.rci * self.ryi * self.rxi
        self.shared_bytes = 4 * (self.aa_size + self.ww_size)

    def window_steps(self, op: Conv2dOp) -> tuple[str, str]:
        """The window's offset at reduction step (ryo, rxo), for ``window_fetch``."""
        return (f" + ryo * {self.ryi * op.dilation[0]}", f" + rxo * {self.rxi * op.dilation[1]}")

    def weight_fetch(self, op: Conv2dOp, channels: int) -> list[str]:
        """The block's cooperative fetch of its weights WW at step (rco, ryo, rxo), from a
        weight [CO, channels, KH, KW]."""
        return [
            f"for (int i = tid; i < {self.ww_size}; i += {self.threads}) {{",
            f"  const int lf = i / {self.rci * self.ryi * self.rxi},"
            f" c = (i / {self.ryi * self.rxi}) % {self.rci};",
            f"  const int ky = (i / {self.rxi}) % {self.ryi}, kx = i % {self.rxi};",
            f"  WW[i] = weight[(((f0 + lf) * {channels} + rco * {self.rci} + c) * {op.kh}"
            f" + ryo * {self.ryi} + ky) * {op.kw} + rxo * {self.rxi} + kx];",
            "}",
        ]

    def weight_index(self) -> str:
        return (f"(({self.local_f} * {self.rci} + rci) * {self.ryi} + ryi) * {self.rxi}"
                " + rxi")

    def reduction(self, fetch: list[str], inner: list[str], unroll: Unroll) -> list[str]:
        """The (rco, ryo, rxo) steps: ``fetch``, then the threads' ``inner`` statement
        over (rci, ryi, rxi) and the register tile."""
        compute = loop_nest([("rci", self.rci, AUTO), ("ryi", self.ryi, AUTO),
                             ("rxi", self.rxi, AUTO), *self.acc_loops()], inner, unroll)
        return loop_nest([("rco", self.rco, AUTO), ("ryo", self.ryo, AUTO),
                          ("rxo", self.rxo, AUTO)], fetch + compute, Unroll())


def _swap_ry_rx(config: Config) -> Config:
    """``config`` with its tile_ry and tile_rx knobs' names swapped: made only when a
    config is read the other way (copying its knobs cost more than decoding it)."""
    rename = {"tile_ry": "tile_rx", "tile_rx": "tile_ry"}
    entity = [e.model_copy(update={"name": rename.get(e.name, e.name)}) for e in config.entity]
    return config.model_copy(update={"entity": tuple(entity)})


TEMPLATE = Conv2dNCHW()

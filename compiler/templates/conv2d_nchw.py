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
    ceil_div,
    epilogue_buffers,
    factors,
    log2,
    split_features,
)
from compiler.templates.emit import AUTO, VTHREAD, Unroll, indent, loop_nest, signature
from compiler.templates.ops import Conv2dOp
from compiler.templates.space import ConfigError, ConfigSpace, OtherKnob, SplitKnob
from schemas import Config, Workload

SPATIAL = ("tile_f", "tile_y", "tile_x")


class Conv2dNCHW(Template):
    name = "conv2d_nchw.cuda"

    def parse(self, workload: Workload) -> Conv2dOp:
        return Conv2dOp.from_args(workload.args)

    def _space(self, op: Conv2dOp) -> ConfigSpace:
        return ConfigSpace([
            SplitKnob("tile_f", op.co, 4),
            SplitKnob("tile_y", op.oh, 4),
            SplitKnob("tile_x", op.ow, 4),
            SplitKnob("tile_rc", op.c, 2),
            SplitKnob("tile_ry", op.kh, 2),
            SplitKnob("tile_rx", op.kw, 2),
            OtherKnob("auto_unroll_max_step", (0, 512, 1500)),
            OtherKnob("unroll_explicit", (0, 1)),
        ])

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        space = self.space(workload)
        # TopHub's older logs (cuda v0.10, rocm v0.05, opencl v0.04) list tile_rx before
        # tile_ry and name the kernel-height split tile_rx: their index agrees only with
        # that reading, square kernels included. Read a config as its entity order says
        # first; with kh != kw only one reading multiplies out, so fall back to the other.
        swapped = _swap_ry_rx(config)
        if swapped is None:
            return space.decode(config)
        if _rx_listed_first(config):
            try:
                return space.decode(swapped)
            except ConfigError:
                pass
        try:
            return space.decode(config)
        except ConfigError as err:  # the message names knobs as the config wrote them
            try:
                return space.decode(swapped)
            except ConfigError:
                raise err from None

    def default_config(self, workload: Workload) -> Config:
        """AutoTVM's fallback for the direct schedule: a thread per output, 8x8 blocks."""
        op = self.parse(workload)
        space = self.space(workload)
        knobs = {k.name: k for k in space.knobs if isinstance(k, SplitKnob)}
        values: dict[str, Any] = {
            "tile_f": knobs["tile_f"].nearest((1, 8, 1)),
            "tile_y": knobs["tile_y"].nearest((1, 8, 1)),
            "tile_x": knobs["tile_x"].nearest((1, 8, 1)),
            "tile_rc": knobs["tile_rc"].nearest((8,)),
            "tile_ry": knobs["tile_ry"].nearest((op.kh,)),
            "tile_rx": knobs["tile_rx"].nearest((op.kw,)),
            "auto_unroll_max_step": 512,
            "unroll_explicit": 0,
        }
        return space.to_config(values)

    def _usage(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> Usage:
        t = _Tiles(op, knobs)
        return Usage(threads=t.threads, threads_x=t.tx, threads_y=t.ty, threads_z=t.tf,
                     shared_bytes=t.shared_bytes, local_elements=t.acc_size)

    def _feature_columns(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(op, knobs)
        feats: dict[str, Any] = split_features(knobs, *SPATIAL, "tile_rc", "tile_ry", "tile_rx")
        max_step = knobs["auto_unroll_max_step"]
        blocks = op.n * t.bf * t.by * t.bx
        steps = t.rco * t.ryo * t.rxo
        # per (rc, ry, rx) outer step: elements fetched into local memory by the block,
        # and each thread's multiply-adds on them
        fetched = t.aa_size + t.ww_size
        inner = t.rci * t.ryi * t.rxi
        inner_fmas = inner * t.acc_size
        feats.update(
            auto_unroll_max_step=max_step,
            unroll_explicit=knobs["unroll_explicit"],
            log_threads=log2(t.threads),
            log_blocks=log2(blocks),
            log_acc=log2(t.acc_size),
            log_shared_bytes=log2(t.shared_bytes),
            log_reduction_steps=log2(steps),
            # every fetched element is one global load
            flops_per_shared_load=op.flops / (blocks * fetched * steps),
            log_vthreads=log2(t.vf * t.vy * t.vx),
            log_block_outputs=log2(t.block_f * t.block_y * t.block_x),
            log_inner_reduction=log2(inner),
            log_inner_fmas=log2(inner_fmas),
            # the compute nest is unrolled when it fits auto_unroll_max_step (emit.Unroll)
            inner_unrolled=(max_step > 0) & (inner_fmas <= max_step),
            # multiply-adds per distinct local-memory value a thread reads in a step
            register_reuse=t.acc_size / (t.vf * t.fi + t.vy * t.yi * t.vx * t.xi),
            flops_per_shared_byte=2 * t.threads * inner_fmas / t.shared_bytes,
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            warp_efficiency=t.threads / (32 * ceil_div(t.threads, 32)),
        )
        return feats

    def _codegen(self, op: Conv2dOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        t = _Tiles(op, knobs)
        unroll = Unroll(knobs["auto_unroll_max_step"], bool(knobs["unroll_explicit"]))
        sh, sw = op.stride
        dh, dw = op.dilation
        ah, aw = t.ah, t.aw
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)

        acc_loops = [("vf", t.vf, VTHREAD), ("fi", t.fi, AUTO), ("vy", t.vy, VTHREAD),
                     ("yi", t.yi, AUTO), ("vx", t.vx, VTHREAD), ("xi", t.xi, AUTO)]
        acc_index = (f"((vf * {t.fi} + fi) * {t.vy * t.yi} + vy * {t.yi} + yi) * {t.vx * t.xi}"
                     f" + vx * {t.xi} + xi")
        local_f = f"((vf * {t.tf} + tz) * {t.fi} + fi)"
        local_y = f"((vy * {t.ty} + ty) * {t.yi} + yi)"
        local_x = f"((vx * {t.tx} + tx) * {t.xi} + xi)"

        body = [
            signature("conv2d_nchw_kernel", ["data", "weight", *[b.name for b in extra]],
                      "out") + " {",
            f"  LOCAL float AA[{t.aa_size}];",
            f"  LOCAL float WW[{t.ww_size}];",
            f"  float acc[{t.acc_size}];",
            "  const int tx = THREAD_X, ty = THREAD_Y, tz = THREAD_Z;",
            f"  const int tid = (tz * {t.ty} + ty) * {t.tx} + tx;",
            f"  const int n = BLOCK_Z / {t.bf};",
            f"  const int f0 = (BLOCK_Z % {t.bf}) * {t.block_f};",
            f"  const int y0 = BLOCK_Y * {t.block_y};",
            f"  const int x0 = BLOCK_X * {t.block_x};",
        ]
        body += indent(loop_nest(acc_loops, [f"acc[{acc_index}] = 0.0f;"], unroll))
        fetch = [
            "BARRIER();",
            f"for (int i = tid; i < {t.aa_size}; i += {t.threads}) {{",
            f"  const int c = i / {ah * aw}, r = (i / {aw}) % {ah}, s = i % {aw};",
            f"  const int ih = y0 * {sh} + ryo * {t.ryi * dh} - {op.pad[0]} + r;",
            f"  const int iw = x0 * {sw} + rxo * {t.rxi * dw} - {op.pad[1]} + s;",
            f"  AA[i] = (ih >= 0 && ih < {op.h} && iw >= 0 && iw < {op.w})",
            f"      ? data[((n * {op.c} + rco * {t.rci} + c) * {op.h} + ih) * {op.w} + iw]"
            " : 0.0f;",
            "}",
            f"for (int i = tid; i < {t.ww_size}; i += {t.threads}) {{",
            f"  const int lf = i / {t.rci * t.ryi * t.rxi}, c = (i / {t.ryi * t.rxi}) % {t.rci};",
            f"  const int ky = (i / {t.rxi}) % {t.ryi}, kx = i % {t.rxi};",
            f"  WW[i] = weight[(((f0 + lf) * {op.c} + rco * {t.rci} + c) * {op.kh}"
            f" + ryo * {t.ryi} + ky) * {op.kw} + rxo * {t.rxi} + kx];",
            "}",
            "BARRIER();",
        ]
        inner = [
            f"acc[{acc_index}] += AA[(rci * {ah} + {local_y} * {sh} + ryi * {dh}) * {aw}"
            f" + {local_x} * {sw} + rxi * {dw}]"
            f" * WW[(({local_f} * {t.rci} + rci) * {t.ryi} + ryi) * {t.rxi} + rxi];"
        ]
        compute = loop_nest([("rci", t.rci, AUTO), ("ryi", t.ryi, AUTO), ("rxi", t.rxi, AUTO),
                             *acc_loops],
                            inner, unroll)
        reduction = loop_nest([("rco", t.rco, AUTO), ("ryo", t.ryo, AUTO), ("rxo", t.rxo, AUTO)],
                              fetch + compute, Unroll())
        body += indent(reduction)
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
            entry="conv2d_nchw_kernel",
            grid=(t.bx, t.by, op.n * t.bf),
            block=(t.tx, t.ty, t.tf),
            buffers=buffers,
            dialect="",
            meta={"shared_bytes": t.shared_bytes, "threads": t.threads},
        )


class _Tiles:
    """Tile extents a config implies, named as the schedule binds them: ints for one
    config's knobs (codegen), arrays [n] for ``ConfigSpace.columns`` (features, limits)."""

    def __init__(self, op: Conv2dOp, k: dict[str, Any]) -> None:
        self.bf, self.vf, self.tf, self.fi = factors(k["tile_f"])
        self.by, self.vy, self.ty, self.yi = factors(k["tile_y"])
        self.bx, self.vx, self.tx, self.xi = factors(k["tile_x"])
        self.rco, self.rci = factors(k["tile_rc"])
        self.ryo, self.ryi = factors(k["tile_ry"])
        self.rxo, self.rxi = factors(k["tile_rx"])
        self.block_f = self.vf * self.tf * self.fi
        self.block_y = self.vy * self.ty * self.yi
        self.block_x = self.vx * self.tx * self.xi
        self.threads = self.tf * self.ty * self.tx
        self.acc_size = self.vf * self.fi * self.vy * self.yi * self.vx * self.xi
        self.ah = (self.block_y - 1) * op.stride[0] + (self.ryi - 1) * op.dilation[0] + 1
        self.aw = (self.block_x - 1) * op.stride[1] + (self.rxi - 1) * op.dilation[1] + 1
        self.aa_size = self.rci * self.ah * self.aw
        self.ww_size = self.block_f * self.rci * self.ryi * self.rxi
        self.shared_bytes = 4 * (self.aa_size + self.ww_size)


def _rx_listed_first(config: Config) -> bool:
    names = [e.name for e in config.entity]
    return names.index("tile_rx") < names.index("tile_ry")


def _swap_ry_rx(config: Config) -> Config | None:
    names = {e.name for e in config.entity}
    if not {"tile_ry", "tile_rx"} <= names:
        return None
    rename = {"tile_ry": "tile_rx", "tile_rx": "tile_ry"}
    entity = [e.model_copy(update={"name": rename.get(e.name, e.name)}) for e in config.entity]
    return config.model_copy(update={"entity": tuple(entity)})


TEMPLATE = Conv2dNCHW()

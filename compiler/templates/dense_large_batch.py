"""``dense_large_batch.gpu``: AutoTVM's tiled dense for batches of 32 and more.

Batch (tile_x) and output (tile_y) split 4-way into block / virtual thread / thread /
inner; the reduction splits 3-way into (outer, staged, inner): per outer step the block
stages a (batch tile x k tile) slice of data and an (output tile x k tile) slice of
weights in local memory, and each thread accumulates its register tile.
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
from compiler.templates.ops import DenseOp
from compiler.templates.space import ConfigSpace, SplitKnob
from schemas import Config, DeviceLimits, Workload

_VTHREADS = {2**x for x in range(1, 7)}
_THREADS = {2**x for x in range(3, 7)}
_BLOCKS = {64, 128}


def _spatial_ok(value: tuple[int, ...]) -> bool:
    return value[1] in _VTHREADS and value[2] in _THREADS and value[1] * value[2] * value[3] in _BLOCKS


def _reduce_ok(value: tuple[int, ...]) -> bool:
    return value[0] > 2


class DenseLargeBatch(Template):
    name = "dense_large_batch.gpu"

    def parse(self, workload: Workload) -> DenseOp:
        return DenseOp.from_args(workload.args)

    def _space(self, op: DenseOp) -> ConfigSpace:
        # AutoTVM prunes to power-of-two thread/vthread tiles of 64 or 128 outputs, and
        # drops the pruning for every knob when any knob would be left empty.
        pruned = [
            SplitKnob("tile_x", op.batch, 4, keep=_spatial_ok),
            SplitKnob("tile_y", op.out_dim, 4, keep=_spatial_ok),
            SplitKnob("tile_k", op.in_dim, 3, keep=_reduce_ok),
        ]
        if all(len(k) for k in pruned):
            return ConfigSpace(pruned)
        return ConfigSpace([
            SplitKnob("tile_x", op.batch, 4),
            SplitKnob("tile_y", op.out_dim, 4),
            SplitKnob("tile_k", op.in_dim, 3),
        ])

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """AutoTVM's fallback ([-1, 2, 16, 2] tiles, [-1, 8, 1] k), made exact."""
        op = self.parse(workload)
        space = self.space(workload)
        knobs = {k.name: k for k in space.knobs}
        values = {
            "tile_x": knobs["tile_x"].nearest((2, 16, 2) if op.batch > 1 else (1, 1, 1)),
            "tile_y": knobs["tile_y"].nearest((2, 16, 2) if op.out_dim > 1 else (1, 1, 1)),
            "tile_k": knobs["tile_k"].nearest((8, 1) if op.in_dim > 8 else (1, 1)),
        }
        return space.to_config(values)

    def _usage(self, op: DenseOp, knobs: dict[str, np.ndarray]) -> Usage:
        t = _Tiles(knobs)
        return Usage(threads=t.threads, threads_x=t.tx, threads_y=t.ty,
                     shared_bytes=t.shared_bytes, local_elements=t.acc_size,
                     grid=(t.bx, t.by, 1))

    def _feature_columns(self, op: DenseOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(knobs)
        feats: dict[str, Any] = split_features(knobs, "tile_x", "tile_y", "tile_k")
        blocks = t.bx * t.by
        k_tile = t.kt * t.ki
        # elements staged in local memory per ko step (one global load each)
        fetched = (t.block_x + t.block_y) * k_tile
        feats.update(
            log_threads=log2(t.threads),
            log_blocks=log2(blocks),
            log_acc=log2(t.acc_size),
            log_shared_bytes=log2(t.shared_bytes),
            flops_per_shared_load=op.flops / (blocks * t.ko * fetched),
            log_vthreads=log2(t.vx * t.vy),
            log_inner_reduction=log2(k_tile),
            # multiply-adds per distinct local-memory value a thread reads per k
            register_reuse=t.acc_size / (t.vx * t.xi + t.vy * t.yi),
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            warp_efficiency=t.threads / (32 * ceil_div(t.threads, 32)),
        )
        return feats

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        t = _Tiles(knobs)
        k_tile = t.kt * t.ki
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)
        inputs = ["data", "weight"] + (["dense_bias"] if op.has_bias else [])
        acc_loops = [("vx", t.vx, VTHREAD), ("xi", t.xi, AUTO), ("vy", t.vy, VTHREAD),
                     ("yi", t.yi, AUTO)]
        acc_index = f"((vx * {t.xi} + xi) * {t.vy * t.yi} + vy * {t.yi} + yi)"
        local_x = f"((vx * {t.tx} + tx) * {t.xi} + xi)"
        local_y = f"((vy * {t.ty} + ty) * {t.yi} + yi)"
        # No unroll knob here. AutoTVM unrolls kt; a forced unroll of kt around the
        # expanded virtual threads took PoCL 70 s to compile (0.04 s without) for the
        # same run time, so the device compiler decides.
        regs = Unroll()
        lines = [
            signature("dense_large_batch_kernel", inputs + [b.name for b in extra], "out") + " {",
            f"  LOCAL float AA[{t.block_x * k_tile}];",
            f"  LOCAL float BB[{t.block_y * k_tile}];",
            f"  float acc[{t.acc_size}];",
            "  const int tx = THREAD_X, ty = THREAD_Y;",
            f"  const int tid = ty * {t.tx} + tx;",
            f"  const int x0 = BLOCK_X * {t.block_x}, y0 = BLOCK_Y * {t.block_y};",
        ]
        lines += indent(loop_nest(acc_loops, [f"acc[{acc_index}] = 0.0f;"], regs))
        step = [
            "BARRIER();",
            f"for (int i = tid; i < {t.block_x * k_tile}; i += {t.threads}) {{",
            f"  AA[i] = data[(x0 + i / {k_tile}) * {op.in_dim} + ko * {k_tile} + i % {k_tile}];",
            "}",
            f"for (int i = tid; i < {t.block_y * k_tile}; i += {t.threads}) {{",
            f"  BB[i] = weight[(y0 + i / {k_tile}) * {op.in_dim} + ko * {k_tile} + i % {k_tile}];",
            "}",
            "BARRIER();",
        ]
        step += loop_nest(
            [("kt", t.kt, AUTO), ("ki", t.ki, AUTO), *acc_loops],
            [f"acc[{acc_index}] += AA[{local_x} * {k_tile} + kt * {t.ki} + ki]"
             f" * BB[{local_y} * {k_tile} + kt * {t.ki} + ki];"],
            regs,
        )
        lines += indent(loop_nest([("ko", t.ko, AUTO)], step, Unroll()))
        value = f"acc[{acc_index}]" + (" + dense_bias[j]" if op.has_bias else "")
        value = epilogue.c_expr(value, "bias[j]", "residual[o]")
        store = [
            f"const int j = y0 + {local_y};",
            f"const int o = (x0 + {local_x}) * {op.out_dim} + j;",
            f"out[o] = {value};",
        ]
        lines += indent(loop_nest(acc_loops, store, regs))
        lines.append("}")
        buffers = [Buffer("data", op.input_shapes[0]), Buffer("weight", op.input_shapes[1])]
        if op.has_bias:
            buffers.append(Buffer("dense_bias", (op.out_dim,)))
        return Kernel(
            source="\n".join(lines) + "\n",
            entry="dense_large_batch_kernel",
            grid=(t.bx, t.by, 1),
            block=(t.tx, t.ty, 1),
            buffers=(*buffers, *extra, Buffer("out", out_shape, role="out")),
            dialect="",
            meta={"shared_bytes": t.shared_bytes, "threads": t.threads},
        )


class _Tiles:
    """Tile extents of a config (ints, for codegen) or of many (arrays [n], for
    features and limits)."""

    def __init__(self, k: dict[str, Any]) -> None:
        self.bx, self.vx, self.tx, self.xi = factors(k["tile_x"])
        self.by, self.vy, self.ty, self.yi = factors(k["tile_y"])
        self.ko, self.kt, self.ki = factors(k["tile_k"])
        self.block_x = self.vx * self.tx * self.xi
        self.block_y = self.vy * self.ty * self.yi
        self.threads = self.tx * self.ty
        self.acc_size = self.vx * self.xi * self.vy * self.yi
        self.shared_bytes = 4 * (self.block_x + self.block_y) * self.kt * self.ki


TEMPLATE = DenseLargeBatch()

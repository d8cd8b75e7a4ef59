"""``dense_small_batch.gpu``: one block per output element, ``tile_k`` threads reducing.

AutoTVM's schedule rfactors the reduction by the inner split: each of the tile_k[1]
threads sums a strided slice of k, then the block combines the partial sums in local
memory. Suited to batch 1-16, where the output has too few elements to tile.
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
from compiler.templates.emit import signature
from compiler.templates.ops import DenseOp
from compiler.templates.space import ConfigSpace, SplitKnob
from schemas import Config, DeviceLimits, Workload


class DenseSmallBatch(Template):
    name = "dense_small_batch.gpu"

    def parse(self, workload: Workload) -> DenseOp:
        return DenseOp.from_args(workload.args)

    def _space(self, op: DenseOp) -> ConfigSpace:
        return ConfigSpace([SplitKnob("tile_k", op.in_dim, 2)])

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        # AutoTVM's fallback is [-1, 64]; the nearest divisor keeps it in the space.
        space = self.space(workload)
        (knob,) = space.knobs
        assert isinstance(knob, SplitKnob)
        return space.to_config({"tile_k": knob.nearest((64,))})

    def _usage(self, op: DenseOp, knobs: dict[str, np.ndarray]) -> Usage:
        _, kf = factors(knobs["tile_k"])
        # kf threads along x, each with one partial sum in local memory; one block per
        # output, the batch along y (past 65,535 rows CUDA cannot launch it)
        return Usage(threads=kf, threads_x=kf, shared_bytes=4 * kf,
                     grid=(op.out_dim, op.batch, 1))

    def _feature_columns(self, op: DenseOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        _, kf = factors(knobs["tile_k"])
        pow2 = (kf & (kf - 1)) == 0
        feats: dict[str, Any] = split_features(knobs, "tile_k")
        feats.update(
            log_threads=log2(kf),
            log_blocks=log2(op.batch * op.out_dim),
            kf_pow2=pow2,
            kf_over_warp=kf / 32.0,
            log_shared_bytes=log2(4 * kf),
            warp_efficiency=kf / (32 * ceil_div(kf, 32)),
            # barrier-separated halving steps of the tree (one more folds a non-power-of-2 tail)
            tree_steps=np.floor(np.log2(kf)) + np.logical_not(pow2),
        )
        return feats

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        ko, kf = knobs["tile_k"]
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)
        inputs = ["data", "weight"] + (["dense_bias"] if op.has_bias else [])
        pow2 = 1 << (kf.bit_length() - 1)  # largest power of two <= kf
        value = "red[0]" + (" + dense_bias[j]" if op.has_bias else "")
        value = epilogue.c_expr(value, "bias[j]", "residual[o]")
        lines = [
            signature("dense_small_batch_kernel", inputs + [b.name for b in extra], "out") + " {",
            f"  LOCAL float red[{kf}];",
            "  const int j = BLOCK_X, b = BLOCK_Y, t = THREAD_X;",
            f"  GLOBAL const float* a = data + b * {op.in_dim};",
            f"  GLOBAL const float* w = weight + j * {op.in_dim};",
            "  float acc = 0.0f;",
            f"  for (int ko = 0; ko < {ko}; ++ko) {{",
            f"    acc += a[ko * {kf} + t] * w[ko * {kf} + t];",
            "  }",
            "  red[t] = acc;",
            "  BARRIER();",
        ]
        if pow2 != kf:  # fold the tail onto the first lanes, then halve
            lines += [f"  if (t < {kf - pow2}) red[t] += red[t + {pow2}];", "  BARRIER();"]
        stride = pow2 // 2
        while stride >= 1:
            lines += [f"  if (t < {stride}) red[t] += red[t + {stride}];", "  BARRIER();"]
            stride //= 2
        lines += [
            "  if (t == 0) {",
            f"    const int o = b * {op.out_dim} + j;",
            f"    out[o] = {value};",
            "  }",
            "}",
        ]
        buffers = [Buffer("data", op.input_shapes[0]), Buffer("weight", op.input_shapes[1])]
        if op.has_bias:
            buffers.append(Buffer("dense_bias", (op.out_dim,)))
        return Kernel(
            source="\n".join(lines) + "\n",
            entry="dense_small_batch_kernel",
            grid=(op.out_dim, op.batch, 1),
            block=(kf, 1, 1),
            buffers=(*buffers, *extra, Buffer("out", out_shape, role="out")),
            dialect="",
            meta={"shared_bytes": 4 * kf, "threads": kf},
        )


TEMPLATE = DenseSmallBatch()

"""``dense_pack.x86``: AutoTVM's packed dense for CPU-class devices.

Knobs, as AutoTVM's x86 template (in this order): ``tile_y`` splits the batch M into
(yt, yo, yi), ``tile_x`` the output features N into (xt, xo, xi), ``tile_k`` the
reduction K into (ko, ki). The weight is read packed as ``[N / xi][K][xi]``
(``packw_bn`` = xi, AutoTVM's packed_weight): the xi features of a block are contiguous
for every k, so the inner loop over them vectorises. The compiler packs the constant
weight once at build time (``pack_weight``); the measurer packs it before a trial.

Mapping onto a grid (AutoTVM's loop nest is ``xt, yt | yo, xo | ko, ki, yi, xi``, the
first two fused and parallel, the next two fused and serial):

- the parallel loops are the work-groups, grid = (yt, xt): group ids run batch-fastest
  as AutoTVM's fused ``xt, yt``, so groups that run one after another share their packed
  weight block (on 32x4096->4096 this order ran 1.2-2x faster than the transposed one);
- the serial fused loop is the work-items of a group, local size = (xo, yo): PoCL runs
  a group's work-items one after another on one core, x fastest, as the ``yo, xo`` loop;
- each work-item computes one (yi x xi) register tile of the output: batch rows from
  ``(yt * YO + yo) * yi``, features from ``(xt * XO + xo) * xi`` (YO, XO the middle
  factors), in yi * xi scalar accumulators written out in the source (plain float C:
  PoCL's LLVM packs the xi contiguous lanes into vector registers);
- the reduction runs ``ko`` steps of an unrolled chunk of ``ki`` k values; a chunk
  whose unrolled body would exceed ``UNROLL_BUDGET`` multiply-adds is unrolled in
  sub-chunks of the largest divisor of ki that fits (same order of summation), which
  keeps every config of the space compilable in seconds.

The epilogue (DenseOp bias, then the fused bias / relu / residual add) is applied in
the store of the register tile; the output is plain row-major [M, N].
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
from compiler.templates.space import ConfigSpace, SplitKnob, divisors
from schemas import Config, DeviceLimits, Workload

# Most multiply-adds written out per step of the reduction loop: a (yi x xi) tile times
# the unrolled k values. PoCL compiles 1024 in well under a second; whole chunks of
# thousands of k values (ki = K) would take minutes.
UNROLL_BUDGET = 1024
# the default config's register tile: about 128 accumulators (8 AVX-512 or 16 AVX2
# vectors), and a k chunk of 8
DEFAULT_ACC = 128
DEFAULT_KI = 8


class DensePack(Template):
    name = "dense_pack.x86"
    thread_word, thread_one, group_word = "work-items", "work-item", "group"
    packs_weight = True

    def parse(self, workload: Workload) -> DenseOp:
        return DenseOp.from_args(workload.args)

    def _space(self, op: DenseOp) -> ConfigSpace:
        return ConfigSpace([
            SplitKnob("tile_y", op.batch, 3),
            SplitKnob("tile_x", op.out_dim, 3),
            SplitKnob("tile_k", op.in_dim, 2),
        ])

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        """[N, K] -> [N / bn][K][bn] with bn = tile_x's innermost factor (packw_bn)."""
        op = self.parse(workload)
        bn = self.decode(workload, config)["tile_x"][2]
        w = np.asarray(weight, dtype=np.float32).reshape(op.out_dim // bn, bn, op.in_dim)
        return np.ascontiguousarray(w.transpose(0, 2, 1))

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """AutoTVM's fallback (``_default_dense_pack_config``) re-sized for a CPU here.

        The register tile aims at DEFAULT_ACC accumulators: rows (yi) a power of two <= 4
        dividing M, packw_bn (xi) the widest lane-friendly divisor of N within
        DEFAULT_ACC / rows (multiples of 16 first, then 8, then 4), preferring a tile
        whose bn fills a vector (>= 16 lanes) over more rows: batch-1 dense runs one
        dependency chain per vector of bn, so a wide bn is what hides the FMA latency
        (1x2048->1000: bn 40 ran 2.5x faster than bn 8 or 10 on PoCL). Middle factors are
        1: one tile per work-group, groups ordered batch-fastest so neighbouring groups
        reuse the same packed weight block (AutoTVM's fused ``xt, yt``). The k chunk is
        8 (the nearest divisor of K) instead of AutoTVM's 1."""
        op = self.parse(workload)
        space = self.space(workload)
        best: tuple[tuple[bool, int], int, int] | None = None
        for rows in (4, 2, 1):
            if op.batch % rows:
                continue
            bn = _lane_divisor(op.out_dim, max(DEFAULT_ACC // rows, 1))
            score = (bn % 16 == 0 or bn >= 32, rows * bn)
            if best is None or score > best[0]:
                best = (score, rows, bn)
        assert best is not None
        _, rows, bn = best
        knobs = {k.name: k for k in space.knobs}
        values = {
            "tile_y": (op.batch // rows, 1, rows),
            "tile_x": (op.out_dim // bn, 1, bn),
            "tile_k": knobs["tile_k"].nearest((DEFAULT_KI,)),
        }
        return space.to_config(values)

    def _usage(self, op: DenseOp, knobs: dict[str, np.ndarray]) -> Usage:
        t = _Tiles(knobs)
        return Usage(threads=t.items, threads_x=t.xo, threads_y=t.yo, local_elements=t.acc,
                     grid=(t.yt, t.xt, 1))

    def _feature_columns(self, op: DenseOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(knobs)
        feats: dict[str, Any] = split_features(knobs, "tile_y", "tile_x", "tile_k")
        feats.update(
            log_groups=log2(t.groups),
            log_items=log2(t.items),
            log_acc=log2(t.acc),
            log_unroll=log2(t.unroll * t.acc),
            bn_vec16=t.xi % 16 == 0,
            bn_vec8=t.xi % 8 == 0,
            bn_vec4=t.xi % 4 == 0,
            # loads per multiply-add: weights (1 / yi) + data (1 / xi)
            loads_per_fma=1.0 / t.yi + 1.0 / t.xi,
            # bytes of packed weight one group streams, and of data it rereads
            log_group_weight_bytes=log2(4 * t.xo * t.xi * op.in_dim),
            log_group_data_bytes=log2(4 * t.yo * t.yi * op.in_dim),
            # parallelism: work-items over the whole grid
            log_work_items=log2(t.groups * t.items),
            # k values written out per step, and the sub-chunks of ki they run in
            log_unroll_k=log2(t.unroll),
            log_unroll_chunks=log2(t.ki // t.unroll),
            # accumulator registers at 16 lanes, and the share of their lanes in use
            log_vector_acc=log2(t.yi * ceil_div(t.xi, 16)),
            lane_use16=t.xi / (16 * ceil_div(t.xi, 16)),
            # bytes a work-item loads per ko step (a ki-chunk of its rows and packed weights)
            log_step_bytes=log2(4 * (t.yi + t.xi) * t.ki),
        )
        return feats

    def _codegen(self, op: DenseOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        t = _Tiles(knobs)
        m, n, k_dim = op.batch, op.out_dim, op.in_dim
        yi, xi, ki, u = t.yi, t.xi, t.ki, t.unroll
        out_shape = op.output_shape
        extra = epilogue_buffers(epilogue, out_shape, 1)
        inputs = ["data", "weight"] + (["dense_bias"] if op.has_bias else [])

        def acc(i: int, j: int) -> str:
            return f"c{i}_{j}"

        lines = [
            signature("dense_pack_kernel", inputs + [b.name for b in extra], "out") + " {",
            "  // work-group = (yt, xt), work-item = (xo, yo): one (yi x xi) tile each",
            f"  const int xb = BLOCK_Y * {t.xo} + THREAD_X;  // feature block of {xi}",
            f"  const int y0 = (BLOCK_X * {t.yo} + THREAD_Y) * {yi};  // first batch row",
            f"  GLOBAL const float* a = data + y0 * {k_dim};",
            f"  GLOBAL const float* w = weight + xb * {k_dim * xi};",
        ]
        for i in range(yi):
            lines.append("  float " + ", ".join(f"{acc(i, j)} = 0.0f" for j in range(xi)) + ";")

        # one unrolled step: u consecutive k values from k0, every multiply-add written out
        step: list[str] = []
        for s in range(u):
            kk = f"k0 + {s}" if s else "k0"
            step.append("{")
            step += [f"  const float a{i} = a[{i * k_dim} + {kk}];" for i in range(yi)]
            step.append(f"  GLOBAL const float* wk = w + ({kk}) * {xi};")
            step += [f"  const float w{j} = wk[{j}];" for j in range(xi)]
            step += [f"  {acc(i, j)} += a{i} * w{j};" for i in range(yi) for j in range(xi)]
            step.append("}")
        if u == ki:
            body = [f"const int k0 = ko * {ki};", *step]
        else:
            body = [f"for (int kj = 0; kj < {ki // u}; ++kj) {{",
                    f"  const int k0 = ko * {ki} + kj * {u};",
                    *["  " + line for line in step],
                    "}"]
        lines.append(f"  for (int ko = 0; ko < {t.ko}; ++ko) {{")
        lines += ["    " + line for line in body]
        lines.append("  }")

        lines.append(f"  const int x0 = xb * {xi};")
        for i in range(yi):
            for j in range(xi):
                jj = f"x0 + {j}" if j else "x0"
                oo = f"(y0 + {i}) * {n} + {jj}" if i else f"y0 * {n} + {jj}"
                value = acc(i, j) + (f" + dense_bias[{jj}]" if op.has_bias else "")
                value = epilogue.c_expr(value, f"bias[{jj}]", f"residual[{oo}]")
                lines.append(f"  out[{oo}] = {value};")
        lines.append("}")

        buffers = [Buffer("data", (m, k_dim)), Buffer("weight", (n // xi, k_dim, xi))]
        if op.has_bias:
            buffers.append(Buffer("dense_bias", (n,)))
        return Kernel(
            source="\n".join(lines) + "\n",
            entry="dense_pack_kernel",
            grid=(t.yt, t.xt, 1),
            block=(t.xo, t.yo, 1),
            buffers=(*buffers, *extra, Buffer("out", out_shape, role="out")),
            dialect="",
            meta={"shared_bytes": 0, "threads": t.items, "packw_bn": xi,
                  "unroll": t.unroll},
        )


def _lane_divisor(extent: int, cap: int) -> int:
    """The largest divisor of ``extent`` <= ``cap`` that is a multiple of 16, else of 8,
    else of 4, else any."""
    below = [d for d in divisors(extent) if d <= cap]
    for lanes in (16, 8, 4, 1):
        fit = [d for d in below if d % lanes == 0]
        if fit:
            return max(fit)
    return 1


class _Tiles:
    """Tile extents of a config (ints, for codegen) or of many (arrays [n], for
    features and limits)."""

    def __init__(self, k: dict[str, Any]) -> None:
        self.yt, self.yo, self.yi = factors(k["tile_y"])
        self.xt, self.xo, self.xi = factors(k["tile_x"])
        self.ko, self.ki = factors(k["tile_k"])
        self.groups = self.xt * self.yt
        self.items = self.xo * self.yo
        self.acc = self.yi * self.xi
        self.unroll = _unroll(self.ki, self.acc)


def _unroll(ki: Any, acc: Any) -> Any:
    """k values written out per step: the largest divisor d of ki with d * acc within
    UNROLL_BUDGET (1 when none is); an int for ints, an array for arrays."""
    ki_arr, acc_arr = np.asarray(ki), np.asarray(acc)
    best = np.ones(np.broadcast(ki_arr, acc_arr).shape, dtype=np.int64)
    # every ki divides their lcm (itself a divisor of K): its divisors are the candidates
    for d in divisors(int(np.lcm.reduce(ki_arr.reshape(-1)))):
        best = np.where((ki_arr % d == 0) & (d * acc_arr <= UNROLL_BUDGET), d, best)
    return best if best.ndim else int(best)


TEMPLATE = DensePack()

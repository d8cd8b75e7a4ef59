"""``conv2d_NCHWc_1x1.x86``: 1x1 convolutions on CPU-class OpenCL devices (PoCL) as a
packed GEMM, out[k][p] = sum_c W[k][c] X[c][p] over the flattened output pixels p.

The direct ``conv2d_NCHWc.x86`` tiles a 1x1 layer by output rows and a ``reg_n`` that
must divide OW, so its register block is whatever OW's divisors allow (8 x 16 channels
by default: 16 AVX2 registers of accumulators, more than the register file holds with
its weights). Here the pixels of an image are one flat axis (a 1x1 kernel has no window),
so the register block is any ``tile_p`` pixels x ``oc_bn`` channels, MLAS's SGEMM shape
(6 rows x 16 columns of AVX2 FMA: 12 accumulator registers, 2 of weights, 1 broadcast).

Kernel: one work-item per (image and oc block, block of ``tile_p`` pixels); accumulators
``acc[tile_p][oc_bn / vec]`` are ``vec``-wide vectors in registers (the source is
unrolled over them). It walks the input channels (``unroll_ci`` steps written out per
loop step); each step loads ``oc_bn / vec`` weight vectors (the weight is packed once,
``pack_weight``: [K/oc_bn][C][oc_bn], so a step's weights are one contiguous row and a
work-item streams one contiguous slice) and one input scalar per pixel (broadcast), a
vector multiply-add per accumulator. Input pixel offsets are set once per work-item:
with stride 1 they are constants from one base pointer; a strided layer (the stride-2
downsample convs) or the last, partial pixel block gets one pointer per pixel of the
tile (the strided row read into the register tile), so the inner loop has no index math
either way. The last block's missing pixels re-read the last pixel and are not stored.
Where the weight is 1 MB or more, the pixel blocks of an oc block but its first prefetch
the next oc block's weight, a slice each, a chunk of channels at a time
(``compiler.templates.prefetch``): a model reads each layer's weight from memory.

Blocked activations as ``conv2d_NCHWc.x86`` (``blocked_io``): data read in
NCHW[data_block]c (any block dividing C; plain NCHW reads a channel HW floats apart),
output written in NCHW[out_block]c (the compiler asks for oc_bn: one vector store per
accumulator, the epilogue on vectors), a fused residual read in NCHW[residual_block]c;
any other block stores lane by lane. So it chains with the direct and Winograd templates
with no layout transform. Fused epilogues (bias, residual add, activations) at the store.

Workload: ``conv2d_NCHWc.x86``'s eight args (the same workload, another template: its
records are keyed apart by template name, TopHub's ``conv2d_NCHWc.x86`` records keep
their meaning), limited to 1x1 kernels without padding (any stride; dilation has no
effect on a 1x1 kernel). ``conv2d_NCHWc_gemm.x86`` runs this GEMM (``GemmPlan``,
``GemmSource``) over a kernel's taps for every other window.

Knobs (index order, first least significant): ``tile_oc`` [K/oc_bn, oc_bn], ``tile_p``
(pixels per register block, 1-8 and 12, 16; at most the image's pixels), ``vec`` (1, 2,
4, 8, 16: lanes per vector, must divide oc_bn), ``unroll_ci`` (1, 2, 4, 8: channel steps
written out per loop step, must divide C; with blocked data it is capped at the largest
power of two dividing the data block, which a step never crosses), ``wg`` (1, 2, 4, 8:
work-items per group, along the pixel blocks) and ``order_oc`` (0: oc blocks outermost in
the grid, a group's work-items share one weight slice; 1: innermost, the oc blocks of
one pixel block run one after another while its input is in cache).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from compiler.templates import prefetch
from compiler.templates.base import (
    AVX512_LANES,
    Epilogue,
    IOLayout,
    Kernel,
    Prologue,
    Rule,
    Template,
    Usage,
    WorkloadError,
    ceil_div,
    factors,
    log2,
    simd_lanes,
    split_features,
)
from compiler.templates.conv2d_nchwc import TEMPLATE as DIRECT
from compiler.templates.conv2d_nchwc import blocked_io_buffers
from compiler.templates.emit import indent, private_tile, signature
from compiler.templates.ops import Conv2dOp
from compiler.templates.space import ConfigSpace, OtherKnob, SplitKnob
from schemas import Config, DeviceLimits, Workload

TILE_P = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
VEC_CANDIDATES = (1, 2, 4, 8, 16)
UNROLL_CI = (1, 2, 4, 8)
WG_CANDIDATES = (1, 2, 4, 8)
ORDER_CANDIDATES = (0, 1)
ENTRY = "conv2d_nchwc_1x1_kernel"
# The 16-lane (AVX-512) default: output-channel blocks (the first dividing K taken),
# accumulator vectors per work-item, channel steps per loop step (see ``avx512_knobs``)
AVX512_OC_BLOCKS = (64, 32, 16)
AVX512_ACC_VECTORS = 16
AVX512_UNROLL_CI = 4


def avx512_knobs(op: Conv2dOp) -> dict[str, Any] | None:
    """The 16-lane default's oc_bn, tile_p, vec and unroll_ci; None when 16 does not
    divide K (the 8-lane default then). oc_bn the first of ``AVX512_OC_BLOCKS`` dividing K,
    in 16-lane vectors, ``AVX512_ACC_VECTORS`` accumulator vectors (4 pixels x 64, 8 x 32
    or 16 x 16; at most the image's pixels: 256 accumulators, PoCL's cap), the channel
    loop unrolled by ``AVX512_UNROLL_CI`` (or the most of 2, 1 dividing C).
    Why: AVX2's 6 x 16 tile in 16-lane vectors is 6 accumulator chains, fewer than two
    FMA units of 4 cycles' latency keep busy; 16 of the 32 zmm registers (MLAS's
    AVX-512 kernels hold 24, past PoCL's 256) leave room for 4 weights and a broadcast.
    On a 2-core Xeon (Emerald Rapids, PoCL's skylake-avx512), CPU seconds, alternating,
    on ResNet-50's 15 1x1 workloads and DenseNet-121's, weighted by layers, speed over the
    8-lane default (ResNet-50 / DenseNet-121; two runs of 5-7 rounds): 4 x 64 unrolled by
    4 1.60 / 1.57-1.60x (1.26-1.99x a layer); 4 x 64 by 2 1.55 / 1.55-1.63x, 8 x 32 by 4
    1.52-1.59 / 1.56-1.58x, by 2 1.47 / 1.53x, by 8 1.41 / 1.41x, the direct template's
    16-lane default 1.49-1.53 / 1.47-1.55x; in noisier runs 6 x 32, 7 x 32, 3 x 64
    1.44-1.63x, 12 or 16 x 16 1.16-1.28x, 2 x 128 1.32-1.35x, oc blocks innermost
    1.29-1.50x, 8 x 32 in 8 lanes 0.57-0.63x. ``bench/conv1x1.py --lanes`` (quiet, 9
    rounds): 1.65 / 1.57x, the direct 16-lane default 1.58 / 1.51x, onnxruntime's Conv
    1.37 / 1.26x."""
    oc_bn = next((b for b in AVX512_OC_BLOCKS if op.co % b == 0), None)
    if oc_bn is None:
        return None
    most = AVX512_ACC_VECTORS * AVX512_LANES // oc_bn
    return {
        "tile_oc": (op.co // oc_bn, oc_bn),
        "tile_p": max(t for t in TILE_P if t <= min(most, op.oh * op.ow)),
        "vec": AVX512_LANES,
        "unroll_ci": max(u for u in UNROLL_CI if u <= AVX512_UNROLL_CI and op.c % u == 0),
    }


def check_1x1(name: str, op: Conv2dOp) -> Conv2dOp:
    """``op`` if this template computes it: a 1x1 kernel without padding."""
    if (op.kh, op.kw) != (1, 1):
        raise WorkloadError(f"{name}: only 1x1 kernels, got {op.kh}x{op.kw}")
    if any(op.pad):
        raise WorkloadError(f"{name}: only padding 0, got {list(op.pad)}")
    return op


class Conv2dNCHWc1x1(Template):
    name = "conv2d_NCHWc_1x1.x86"
    thread_word, thread_one, group_word = "work-items", "work-item", "group"
    packs_weight = True
    blocked_io = True
    takes_prologue = True
    entry = ENTRY

    def parse(self, workload: Workload) -> Conv2dOp:
        """conv2d_NCHWc.x86's eight args, limited to 1x1 kernels without padding."""
        return check_1x1(self.name, DIRECT.parse(workload))

    def _space(self, op: Conv2dOp) -> ConfigSpace:
        return ConfigSpace([
            SplitKnob("tile_oc", op.co, 2),
            OtherKnob("tile_p", TILE_P),
            OtherKnob("vec", VEC_CANDIDATES),
            OtherKnob("unroll_ci", UNROLL_CI),
            OtherKnob("wg", WG_CANDIDATES),
            OtherKnob("order_oc", ORDER_CANDIDATES),
        ])

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        """OIHW (1x1) -> [K/oc_bn][C][oc_bn]: a channel step's oc_bn weights contiguous."""
        op = self.parse(workload)
        oc_bn = int(self.decode(workload, config)["tile_oc"][1])
        w = np.asarray(weight, dtype=np.float32).reshape(op.co // oc_bn, oc_bn, op.c)
        return np.ascontiguousarray(w.transpose(0, 2, 1))

    def out_block(self, workload: Workload, config: Config) -> int:
        """oc_bn: each accumulator vector is then one contiguous vector store."""
        return int(self.decode(workload, config)["tile_oc"][1])

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """MLAS's AVX2 SGEMM tile: 6 pixels x oc_bn 16 (the largest factor of K up to 16)
        in 8-lane vectors (the largest candidate up to 8 dividing oc_bn: an AVX2
        register), at most the image's pixels; the channel loop unrolled by 2 (when C is
        even), one work-item per group, oc blocks outermost. ``limits`` None, or a device
        of fewer than 16 lanes or that does not say (``simd_lanes``), gets this tile.
        On a 16-lane device (AVX-512) where 16 divides K, ``avx512_knobs`` replace
        oc_bn, tile_p, vec and unroll_ci (4 x 64 by 4 where they fit: ~1.6x faster)."""
        op = self.parse(workload)
        oc_bn = max(f for f in range(1, min(op.co, 16) + 1) if op.co % f == 0)
        pixels = op.oh * op.ow
        values: dict[str, Any] = {
            "tile_oc": (op.co // oc_bn, oc_bn),
            "tile_p": max(t for t in TILE_P if t <= min(6, pixels)),
            "vec": max(v for v in VEC_CANDIDATES if v <= 8 and oc_bn % v == 0),
            "unroll_ci": 2 if op.c % 2 == 0 else 1,
            "wg": 1,
            "order_oc": 0,
        }
        wide = avx512_knobs(op) if simd_lanes(limits) >= AVX512_LANES else None
        values.update(wide or {})
        return self.space(workload).to_config(values)

    def _weight_shape(self, op: Conv2dOp, p: GemmPlan) -> tuple[int, ...]:
        """The packed weight buffer's shape (``pack_weight``)."""
        return (p.kb, op.c, p.oc_bn)

    def _source(self, op: Conv2dOp, p: GemmPlan, epilogue: Epilogue, extra: list[str],
                io: IOLayout, prologue: Prologue) -> GemmSource:
        return GemmSource(op, p, epilogue, extra, io, prologue, self.entry)

    def _usage(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> Usage:
        p = GemmPlan(op, knobs)
        return Usage(threads=p.wg, threads_x=p.wg, local_elements=p.acc,
                     local_detail=((p.tp, "pixels"), (p.oc_bn, "channels")),
                     rules=gemm_rules(p), grid=p.grid)

    def _feature_columns(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        p = GemmPlan(op, knobs)
        feats: dict[str, Any] = split_features(knobs, "tile_oc")
        vector_fmas = p.tp * p.nvec
        feats.update(
            log_tile_p=log2(p.tp),
            log_vec=log2(p.vec),
            vec_divides=p.oc_bn % p.vec == 0,
            log_wg=log2(p.wg),
            log_acc=log2(p.acc),
            log_vector_acc=log2(p.acc / p.vec),
            # one channel step: tile_p broadcasts and nvec weight vectors feed
            # tile_p * nvec vector multiply-adds
            loads_per_vector_fma=(p.tp + p.nvec) / vector_fmas,
            log_vector_registers=log2(vector_fmas + p.nvec + 1),
            log_unroll_ci=log2(p.unroll_ci),
            unroll_divides=op.c % p.unroll_ci == 0,
            log_unrolled_fmas=log2(vector_fmas * p.unroll_ci),
            order_oc=p.oc_inner,
            log_work_items=log2(op.n * p.kb * p.pblocks),
            log_groups=log2(op.n * p.kb * p.groups_x),
            # pixels computed for nothing in the last register block, work-items with no
            # block in the last group
            idle_pixels=(p.pblocks * p.tp - p.pixels) / (p.pblocks * p.tp),
            idle_items=(p.groups_x * p.wg - p.pblocks) / (p.groups_x * p.wg),
            # the weight slice a work-item streams (one oc block, every channel)
            log_weight_slice_bytes=log2(4 * op.c * p.oc_bn),
            log_reduction_steps=log2(op.c),
            strided=float(op.stride != (1, 1)),
        )
        return feats

    def _codegen(self, op: Conv2dOp, knobs: dict[str, Any], epilogue: Epilogue,
                 io: IOLayout = IOLayout(), prologue: Prologue = Prologue()) -> Kernel:
        p = GemmPlan(op, knobs)
        buffers, extra = blocked_io_buffers(op, epilogue, io, self._weight_shape(op, p),
                                            gemm_rules(p), prologue)
        source = self._source(op, p, epilogue, [b.name for b in extra], io, prologue).lines()
        return Kernel(
            source="\n".join(source) + "\n",
            entry=self.entry,
            grid=p.grid,
            block=(p.wg, 1, 1),
            buffers=buffers,
            dialect="",
            meta={"accumulators": p.acc, "threads": p.wg, "io": io},
        )


class GemmPlan:
    """Block sizes a config implies: ints for one config's knobs (codegen), arrays [n]
    for ``ConfigSpace.columns`` (features, limits)."""

    def __init__(self, op: Conv2dOp, k: dict[str, Any]) -> None:
        self.op = op
        self.oc_bn = factors(k["tile_oc"])[1]
        self.kb = op.co // self.oc_bn
        self.tp = k["tile_p"]
        self.vec = k["vec"]
        self.unroll_ci = k["unroll_ci"]
        self.wg = k["wg"]
        self.oc_inner = k["order_oc"]
        self.pixels = op.oh * op.ow
        self.pblocks = ceil_div(self.pixels, self.tp)
        self.groups_x = ceil_div(self.pblocks, self.wg)
        self.nvec = np.maximum(self.oc_bn // self.vec, 1) if np.ndim(self.oc_bn) \
            else max(self.oc_bn // self.vec, 1)
        self.acc = self.tp * self.oc_bn

    @property
    def grid(self) -> tuple[Any, Any, Any]:
        """Groups along x (pixel blocks; times the oc blocks when order_oc puts them
        innermost: x varies fastest in PoCL's group order), 1, and z (images; times the
        oc blocks otherwise)."""
        x_kb = np.where(self.oc_inner, self.kb, 1)
        grid = (self.groups_x * x_kb, 1, self.op.n * self.kb // x_kb)
        return grid if np.ndim(self.oc_inner) or np.ndim(self.kb) \
            else (int(grid[0]), 1, int(grid[2]))


def gemm_rules(p: GemmPlan) -> tuple[Rule, ...]:
    """vec splits oc_bn into vectors, unroll_ci the channels into steps: each must
    divide; a register block of more pixels than the image has is refused."""
    return (
        Rule(ok=p.oc_bn % p.vec == 0,
             message="vec {vec} does not divide the output-channel block {oc_bn}",
             values={"vec": p.vec, "oc_bn": p.oc_bn}),
        Rule(ok=p.op.c % p.unroll_ci == 0,
             message="unroll_ci {unroll_ci} does not divide the {c} input channels",
             values={"unroll_ci": p.unroll_ci, "c": p.op.c}),
        Rule(ok=p.tp <= p.pixels,
             message="tile_p {tile_p} is more than the image's {pixels} output pixels",
             values={"tile_p": p.tp, "pixels": p.pixels}),
    )


class GemmSource:
    """The kernel body, written against the prelude's macros; vec = 1 is plain floats."""

    def __init__(self, op: Conv2dOp, p: GemmPlan, epilogue: Epilogue, extra: list[str],
                 io: IOLayout, prologue: Prologue = Prologue(), entry: str = ENTRY) -> None:
        self.op, self.p, self.epilogue, self.extra, self.io = op, p, epilogue, extra, io
        self.prologue, self.entry = prologue, entry
        db = io.data_block
        # a step's channels lie in one data block: cap the unroll at what divides it
        self.unroll = math.gcd(p.unroll_ci, db) if db else p.unroll_ci

    def vtype(self) -> str:
        return "float" if self.p.vec == 1 else f"VEC_T({self.p.vec})"

    def vbcast(self, x: str) -> str:
        return x if self.p.vec == 1 else f"VBCAST({self.p.vec}, {x})"

    def vload(self, i: int, ptr: str) -> str:
        return f"{ptr}[{i}]" if self.p.vec == 1 else f"VLOAD({self.p.vec}, {i}, {ptr})"

    def accs(self) -> list[tuple[int, int, str]]:
        return [(t, v, f"acc_{t}_{v}") for t in range(self.p.tp) for v in range(self.p.nvec)]

    def lines(self) -> list[str]:
        op, p = self.op, self.p
        block = op.c * op.kh * op.kw * p.oc_bn  # an oc block's packed weight, floats
        body = [signature(self.entry, ["data", "weight", *self.extra], "out") + " {"]
        if p.oc_inner:
            body.append(f"  const int kb = BLOCK_X % {p.kb}, n = BLOCK_Z;")
            body.append(f"  const int pb = (BLOCK_X / {p.kb}) * {p.wg} + THREAD_X;")
        else:
            body.append(f"  const int n = BLOCK_Z / {p.kb}, kb = BLOCK_Z % {p.kb};")
            body.append(f"  const int pb = BLOCK_X * {p.wg} + THREAD_X;")
        if p.groups_x * p.wg != p.pblocks:  # the last group's spare work-items
            body.append(f"  if (pb >= {p.pblocks}) return;")
        body += [
            f"  const int p0 = pb * {p.tp};",
            f"  GLOBAL const float* dn = data + n * {op.c * op.h * op.w};",
            f"  GLOBAL const float* wk = weight + kb * {block};",
        ]
        slices = self.prefetch_slices()
        if slices:  # a work-item's place among its block's is its pixel block
            body += indent(prefetch.slice_start("pb", p.kb, block, slices))
        body += [f"  {self.vtype()} {name} = {self.vbcast('0.0f')};" for *_, name in self.accs()]
        body += indent(self.reductions())
        body += indent(self.store())
        body.append("}")
        return body

    def prefetch_slices(self) -> int:
        """How many work-items of a channel block (its pixel blocks, one after another
        with oc blocks outermost) share out the prefetch of the next block's weight
        (``prefetch.slices``), a chunk of channels at a time (``prefetch.chunk_channels``)."""
        op, p = self.op, self.p
        return prefetch.slices(4 * op.co * op.c * op.kh * op.kw, p.pblocks, p.kb, p.oc_inner)

    def reductions(self) -> list[str]:
        """The whole reduction: stride 1 reads a full block from one pointer (the last,
        partial block per pixel), a strided layer per pixel."""
        op, p = self.op, self.p
        if op.stride != (1, 1):
            return self.reduction(contiguous=False)
        if p.pixels % p.tp == 0:
            return self.reduction(contiguous=True)
        return [f"if (p0 + {p.tp} <= {p.pixels}) {{",
                *indent(self.reduction(contiguous=True)), "} else {",
                *indent(self.reduction(contiguous=False)), "}"]

    def input_pixel(self, q: str) -> str:
        """Input pixel (row-major in the image) that output pixel ``q`` reads."""
        op = self.op
        if op.stride == (1, 1):
            return q
        sh, sw = op.stride
        return f"(({q}) / {op.ow}) * {sh * op.w} + (({q}) % {op.ow}) * {sw}"

    def reduction(self, contiguous: bool) -> list[str]:
        """Every channel into the accumulators. ``contiguous``: the tile's input pixels
        are consecutive (stride 1, a full block): constant offsets from one pointer;
        else one pointer per pixel, the missing pixels of the last block clamped."""
        p = self.p
        ps = self.io.data_block or 1  # floats between neighbouring pixels of one channel
        lines = []
        if contiguous:
            lines.append(f"GLOBAL const float* x = dn + p0 * {ps};")
            at = {t: ("x", t * ps) for t in range(p.tp)}
        else:
            at = {}
            for t in range(p.tp):
                q = f"p0 + {t}" if t else "p0"
                if p.pixels % p.tp and t >= p.pixels % p.tp:
                    q = f"min({q}, {p.pixels - 1})"
                lines.append(f"GLOBAL const float* x{t} = dn + ({self.input_pixel(q)}) * {ps};")
                at[t] = (f"x{t}", 0)
        return lines + self.channel_loop(at, "wk")

    def channel_loop(self, at: dict[int, tuple[str, int]], weights: str,
                     masks: bool = False, moves: dict[str, str] | None = None) -> list[str]:
        """Every input channel into the accumulators: pixel t's channel 0 at ``at[t]``
        (pointer, offset), the oc block's packed weights [C][oc_bn] from ``weights``.
        ``masks``: pixel t's value where ``v{t}``, else 0 (it reads padding). ``moves``:
        what each pointer moves on by from one data block to the next (default: a block).
        The prologue applies to each loaded value."""
        op, p, db = self.op, self.p, self.io.data_block
        cs = 1 if db else op.h * op.w  # floats between neighbouring channels of one block
        block = db or op.c  # channels a run of the step loop walks
        runs = op.c // block
        u = self.unroll
        step: list[str] = []
        for s in range(u):
            c = f"ci + {s}" if s else "ci"
            inner = [f"GLOBAL const float* wq = wc + ({c}) * {p.oc_bn};"]
            inner += [f"const {self.vtype()} w{v} = {self.vload(v, 'wq')};"
                      for v in range(p.nvec)]
            channel = f"cb * {block} + {c}" if runs > 1 else c
            for t in range(p.tp):
                ptr, off = at[t]
                index = (c if cs == 1 else f"({c}) * {cs}") + (f" + {off}" if off else "")
                load = f"{ptr}[{index}]"
                if masks:  # the implicit GEMM's padded taps (it takes no prologue)
                    value = self.vbcast(f"(v{t} ? {load} : 0.0f)")
                else:
                    value = self.prologue.load(load, channel, p.vec)
                inner.append(f"const {self.vtype()} d{t} = {value};")
            inner += [f"{name} = " + (f"d{t} * w{v} + {name};" if p.vec == 1
                                      else f"VFMA(d{t}, w{v}, {name});")
                      for t, v, name in self.accs()]
            step += ["{", *indent(inner), "}"]
        ptrs = list(dict.fromkeys(ptr for ptr, _ in at.values()))
        slices = self.prefetch_slices()
        if slices:
            loop = prefetch.paced_loop("ci", block, u, step, "wc - wk", p.oc_bn, slices)
        else:
            loop = [f"for (int ci = 0; ci < {block}; ci += {u}) {{", *indent(step), "}"]
        if runs == 1:
            return [f"GLOBAL const float* wc = {weights};", *loop]
        # blocked data: a run per data block, the pixel pointers moved on by a block
        return [f"for (int cb = 0; cb < {runs}; ++cb) {{",
                f"  GLOBAL const float* wc = {weights} + cb * {block * p.oc_bn};",
                *indent(loop),
                *[f"  {x} += {(moves or {}).get(x, op.h * op.w * db)};" for x in ptrs],
                "}"]

    def element(self, block: int, k: str, t: int | str) -> str:
        """Index of output element (n, k, pixel p0 + t) in NCHW (``block`` 0) or
        NCHW[block]c: the output's and the residual's layouts."""
        op = self.op
        q = f"p0 + {t}" if t else "p0"
        pixels = op.oh * op.ow
        if not block:
            return f"(n * {op.co} + {k}) * {pixels} + {q}"
        return (f"((n * {op.co // block} + ({k}) / {block}) * {pixels} + {q}) * {block}"
                f" + ({k}) % {block}")

    def store(self) -> list[str]:
        """Each pixel's accumulators through the epilogue: vector stores (and a vector
        epilogue) into NCHW[oc_bn]c where the epilogue allows it (a residual in any block
        that vec divides: a pointer per accumulator vector); otherwise (another
        layout, vec 1, an epilogue applied lane by lane) through a private tile
        (``private_tile``: pixel t's lanes at ``t * oc_bn``, as vec divides oc_bn) and a
        loop over the block's channels and pixels, one lane at a time (vec 1 included: on
        12 random configs of a ResNet-50 1x1 layer, bench/compile_ab.py, no config ran
        slower through the tile, unlike the direct template's scalar ones). Pixels past
        the image (the last block's) are not stored."""
        p, io, ep = self.p, self.io, self.epilogue
        bn, ob, rb = p.oc_bn, io.out_block, io.residual_block
        vector = (ob == bn and p.vec > 1 and ep.vectorizable
                  and ("add" not in ep.ops or rb == bn or io.residual_vectors(p.vec)))
        if not vector:
            k = f"kb * {bn} + e"
            value = ep.c_expr(f"tile_f[t * {bn} + e]", f"bias[{k}]",
                              f"residual[{self.element(rb, k, 't')}]")
            # the last block's pixels past the image are not stored
            count = f"min({p.tp}, {p.pixels} - p0)" if p.pixels % p.tp else str(p.tp)
            lines = [*private_tile(self.vtype(), [name for *_, name in self.accs()]),
                     f"const int tn = {count};",
                     f"for (int e = 0; e < {bn}; ++e) {{",
                     "  for (int t = 0; t < tn; ++t) {",
                     f"    out[{self.element(ob, k, 't')}] = {value};", "  }", "}"]
            return ["{", *indent(lines), "}"]
        lines = [f"GLOBAL float* po = out + ((n * {p.kb} + kb) * {p.pixels} + p0) * {bn};"]
        if "bias" in ep.ops:
            lines.append(f"GLOBAL const float* bk = bias + kb * {bn};")
        if "add" in ep.ops and rb == bn:
            lines.append(f"GLOBAL const float* pr = residual + ((n * {p.kb} + kb) * "
                         f"{p.pixels} + p0) * {bn};")
        elif "add" in ep.ops:  # another block: a pointer per accumulator vector
            lines += [f"GLOBAL const float* pr{v} = residual + "
                      f"{self.element(rb, f'kb * {bn} + {v * p.vec}', 0)};"
                      for v in range(p.nvec)]
        rem = p.pixels % p.tp
        for t in range(p.tp):
            stores = []
            for v in range(p.nvec):
                value = f"acc_{t}_{v}"
                for name in ep.ops:
                    if name == "bias":
                        value = f"VADD({value}, {self.vload(v, 'bk')})"
                    elif name == "add":
                        residual = (self.vload(v, f"(pr + {t * bn})") if rb == bn
                                    else self.vload(0, f"(pr{v} + {t * rb})"))
                        value = f"VADD({value}, {residual})"
                    else:  # relu: the only other op of a vectorizable epilogue
                        value = f"VMAX({value}, {self.vbcast('0.0f')})"
                stores.append(f"VSTORE({p.vec}, {value}, {v}, po + {t * bn});")
            if rem and t >= rem:
                lines += [f"if (p0 + {t} < {p.pixels}) {{", *indent(stores), "}"]
            else:
                lines += stores
        return ["{", *indent(lines), "}"]


TEMPLATE = Conv2dNCHWc1x1()

"""``conv2d_NCHWc_winograd.x86``: Winograd F(m x m, 3 x 3) conv2d for CPU-class OpenCL
devices (PoCL), on 3x3 stride-1 dilation-1 convolutions.

Winograd does alpha^2 / (9 m^2) of the direct convolution's multiplies (alpha = m + 2:
0.44 for m = 2, 0.25 for m = 4, 0.20 for m = 6); onnxruntime's MLAS has no Winograd, so
on 3x3 stride-1 layers this is where a CPU kernel can beat it. Three launches
(``Stage``), one kernel:

- the filter transform U = G g G^T is a constant (``pack_weight``, float64, at build time
  and before a trial), packed as [K/oc_bn][alpha^2][C][oc_bn] so that the GEMM reads
  each (block, point) slice as one contiguous stream of ``oc_bn``-wide rows;
- input transform (untuned): one work-item per (image and tile row, group of ``cv``
  channels) walks the row's tiles; each tile's alpha x alpha patch is loaded as
  ``cv``-channel vectors (a vector load from NCHW[db]c data, a gather from NCHW),
  transformed with adds only (V = B^T d B, on vectors) and stored to the scratch
  V [alpha^2][P][C] (P = N * nH * nW tiles), channels contiguous (a large V with
  non-temporal stores: ``_Source.streams_v``). Tiles whose patch
  lies inside the image load without checks; border tiles mask each row and column;
- batched GEMM (tuned): one work-item per (oc block, transformed point b) walks every
  block of ``tile_p`` tiles, so its U slice (C * oc_bn floats) stays in cache across
  them: accumulators ``acc[tile_p][oc_bn / vec]`` are ``vec``-wide vectors in
  registers (the source is unrolled over them); per input channel one scalar of V
  per tile (broadcast) and ``oc_bn / vec`` weight vectors, a vector multiply-add each.
  Results go to the scratch M [alpha^2][P][K]. Where U is 1 MB or more, a work-item
  prefetches the next group's U slice (the next oc block's, same point) a share each pass
  over its tiles (``compiler.templates.prefetch``);
- output transform (untuned): one work-item per (image and tile row, oc block) takes
  each tile's alpha^2 vectors of M, computes Y = A^T M A on vectors, crops the tile to
  the output and stores it through the fused epilogue: one vector store per pixel and
  oc vector into NCHW[oc_bn]c, lane by lane into any other layout.

Blocked activations as ``conv2d_NCHWc.x86`` (``blocked_io``): data read in
NCHW[data_block]c, output written in NCHW[out_block]c (the compiler asks for oc_bn),
a fused residual read in NCHW[residual_block]c, so Winograd layers chain with direct ones
without layout transforms.

Knobs (index order, first least significant): ``tile_size`` (m: 2 or 4), ``tile_oc``
[K/oc_bn, oc_bn], ``tile_p`` (tiles per register block, 1-8; at most P), ``vec`` (1, 2,
4, 8, 16: lanes per vector, must divide oc_bn; the input transform takes the largest
power of two up to it that divides C and the data block), ``wg`` (1, 2, 4: GEMM
work-items per group, along the points) and ``wide_tile`` (False, True: F(6x6, 3x3) in
place of tile_size 4's F(4x4); only with tile_size 4, so every valid point is one
kernel). wide_tile is the most significant knob, so a record from before it keeps its
``index``, and one without it decodes as F(2x2) or F(4x4), as it was timed. F(6x6) at the
points 0, +-1, +-1/2, +-2 errs up to ~20% of the measurer's tolerance at 512 input
channels (F(4x4) ~5%; every trial is checked); its tiles waste more of an image whose
side is not a multiple of 6 and its transforms cost more, so it pays on large images
only (docs/BENCHMARKS.md, "Winograd F(6x6)").
The transform matrices are those of ``conv2d_nchw_winograd.cuda``. FLOPs are the
direct convolution's (as AutoTVM counts them), so GFLOP/s compare as speed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from compiler.templates import prefetch
from compiler.templates.base import (
    AVX512_LANES,
    Buffer,
    Epilogue,
    IOLayout,
    Kernel,
    Rule,
    Stage,
    Template,
    Usage,
    ceil_div,
    factors,
    log2,
    simd_lanes,
    split_features,
)
from compiler.templates.conv2d_nchwc import TEMPLATE as DIRECT
from compiler.templates.conv2d_nchwc import blocked_io_buffers
from compiler.templates.conv2d_winograd import (
    KERNEL_SIZE,
    WinogradOp,
    _transform_2d,
    check_winograd,
    pack_filter,
    transform_matrices,
)
from compiler.templates.emit import indent, private_tile, signature
from compiler.templates.ops import Conv2dOp
from compiler.templates.space import ConfigSpace, OtherKnob, SplitKnob
from schemas import Config, DeviceLimits, KnobEntity, Workload

TILE_SIZES = (2, 4)
WIDE_TILE = 6  # the tile size of ``wide_tile``, which takes tile_size 4's place
TILE_P = (1, 2, 3, 4, 5, 6, 7, 8)
VEC_CANDIDATES = (1, 2, 4, 8, 16)
WG_CANDIDATES = (1, 2, 4)  # each divides alpha^2 (16, 36 and 64)
# The 16-lane default (``avx512_default``), measured on a 2-core Xeon (Emerald Rapids,
# PoCL skylake-avx512) with bench/winograd.py --lanes
AVX512_MAX_OC_BN = 64  # 4 zmm of weights per channel step
SMALL_TILE_TILES = 16  # F(4x4) tiles of a 14x14 (or smaller) image
SMALL_TILE_WEIGHTS = 128 * 128  # C * K: U at F(4x4) 2.4 MB, past a core's 2 MiB L2
# V's bytes from which the input transform streams it (``_Source.streams_v``)
STREAM_V_BYTES = 8 << 20
STREAM_LANES = 16  # a store of 16 floats writes a whole 64-byte cache line
ENTRY_INPUT = "wino_cpu_input_transform"
ENTRY_GEMM = "wino_cpu_batched_gemm"
ENTRY_OUTPUT = "wino_cpu_output_transform"

# Arithmetic on the prelude's vectors: OpenCL's floatN has +, - and scalar * built in;
# CUDA's VecF gets them here (guarded: several kernels may share one translation unit).
# WMAKE(n, ...) builds a vector from n scalars (a gather).
_VECTOR_OPS = """\
#ifndef WINO_CPU_VECTOR_OPS
#define WINO_CPU_VECTOR_OPS
#ifdef __OPENCL_VERSION__
#define WMAKE(n, ...) ((float##n)(__VA_ARGS__))
#else
template <int N> __device__ __forceinline__ VecF<N> operator+(VecF<N> a, VecF<N> b) {
  return vec_add(a, b);
}
template <int N> __device__ __forceinline__ VecF<N> operator-(VecF<N> a, VecF<N> b) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = a.s[k] - b.s[k];
  return r;
}
template <int N> __device__ __forceinline__ VecF<N> operator-(VecF<N> a) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = -a.s[k];
  return r;
}
template <int N> __device__ __forceinline__ VecF<N> operator*(float a, VecF<N> b) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = a * b.s[k];
  return r;
}
#define WMAKE(n, ...) (VecF<n>{{__VA_ARGS__}})
#endif
#endif
"""


class Conv2dNCHWcWinograd(Template):
    name = "conv2d_NCHWc_winograd.x86"
    thread_word, thread_one, group_word = "work-items", "work-item", "group"
    packs_weight = True
    blocked_io = True

    def parse(self, workload: Workload) -> Conv2dOp:
        """conv2d_NCHWc.x86's eight args (the same workload, another template), limited
        to what F(m, 3) computes: 3x3 kernels, stride 1, dilation 1."""
        return check_winograd(self.name, DIRECT.parse(workload))

    def _space(self, op: Conv2dOp) -> ConfigSpace:
        return ConfigSpace([
            OtherKnob("tile_size", TILE_SIZES),
            SplitKnob("tile_oc", op.co, 2),
            OtherKnob("tile_p", TILE_P),
            OtherKnob("vec", VEC_CANDIDATES),
            OtherKnob("wg", WG_CANDIDATES),
            OtherKnob("wide_tile", (False, True)),
        ])

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        """Knob values; a config without ``wide_tile`` (recorded before it) gets False."""
        if not any(e.name == "wide_tile" for e in config.entity):
            config = config.model_copy(update={"entity": (
                *config.entity, KnobEntity(name="wide_tile", kind="ot", value=False))})
        return self.space(workload).decode(config)

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        """OIHW -> U = G g G^T as [K/oc_bn][alpha^2][C][oc_bn] float32 (from float64)."""
        op = self.parse(workload)
        k = self.decode(workload, config)
        wop = winograd_op(op, tile_m(k))
        oc_bn = int(k["tile_oc"][1])
        u = pack_filter(wop, np.asarray(weight))  # [alpha, alpha, C, K]
        a2 = wop.alpha * wop.alpha
        u = u.reshape(a2, op.c, op.co // oc_bn, oc_bn)
        return np.ascontiguousarray(u.transpose(2, 0, 1, 3))

    def out_block(self, workload: Workload, config: Config) -> int:
        """oc_bn: each oc vector of an output pixel is then one vector store."""
        return int(self.decode(workload, config)["tile_oc"][1])

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """F(4x4, 3x3), oc_bn the largest factor of K up to 16, 4 tiles per register
        block (at most P), 8 lanes (the largest candidate up to 8 dividing oc_bn: an AVX2
        register), one work-item per group: the best, or within noise of it, of the
        24-config search of ``bench/winograd.py --cpu`` on ResNet-50's 3x3 layers.
        ``limits`` None, or a device of fewer than 16 lanes (or that does not say), keeps
        it. A 16-lane device (AVX-512: 32 zmm registers, two FMA ports) gets
        ``avx512_default``: on a 2-core Emerald Rapids Xeon (PoCL skylake-avx512) it ran
        1.51x faster than this one over the 16 Winograd workloads of ResNet-50, VGG-19 and
        DenseNet-121, weighted by layer count (CPU seconds; 1.46x / 1.52x / 1.48x per
        model; every row faster, ``bench/winograd.py --lanes``), and within 3% of the best
        per layer of the 7 variants measured (oc_bn 32 or 64, 4-8 tiles, F(2x2) or F(4x4),
        wg 1 or 2)."""
        op = self.parse(workload)
        if simd_lanes(limits) >= AVX512_LANES:
            values = avx512_default(op)
        else:
            oc_bn = max(f for f in range(1, min(op.co, 16) + 1) if op.co % f == 0)
            values = {
                "tile_size": 4,
                "tile_oc": (op.co // oc_bn, oc_bn),
                "tile_p": min(4, winograd_op(op, 4).tiles),
                "vec": max(v for v in VEC_CANDIDATES if v <= 8 and oc_bn % v == 0),
                "wg": 1,
                "wide_tile": False,
            }
        return self.space(workload).to_config(values)

    def default_variants(self, workload: Workload,
                         limits: DeviceLimits | None = None) -> list[Config]:
        """The default at each other tile size (F(2x2), F(4x4), F(6x6)), its other knobs
        kept (tile_p at most the tiles). Which tile pays depends on the image, the
        channels and the device's caches (F(6x6) ran 1.07-1.26x faster than the default on
        VGG-19's 224- to 56-pixel layers and slower on 28 and 14, a Zen 4 VM), and a search
        of a few trials drew F(6x6) only with other knobs far from the default."""
        op = self.parse(workload)
        space = self.space(workload)
        knobs = self.decode(workload, self.default_config(workload, limits))
        return [space.to_config(dict(knobs, tile_size=min(m, 4), wide_tile=m == WIDE_TILE,
                                     tile_p=min(knobs["tile_p"], winograd_op(op, m).tiles)))
                for m in (*TILE_SIZES, WIDE_TILE) if m != tile_m(knobs)]

    def _usage(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> Usage:
        p = _Plan(op, knobs)
        return Usage(threads=p.wg, threads_y=p.wg, local_elements=p.acc,
                     local_detail=((p.pt, "tiles"), (p.oc_bn, "channels")),
                     rules=_rules(p), grid=(p.kb, p.a2 // p.wg, 1))

    def _feature_columns(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        p = _Plan(op, knobs)
        feats: dict[str, Any] = split_features(knobs, "tile_oc")
        vector_fmas = p.pt * p.nvec
        out_pixels = op.n * op.oh * op.ow
        feats.update(
            log_tile_size=log2(p.m),
            log_tile_p=log2(p.pt),
            log_vec=log2(p.vec),
            vec_divides=p.oc_bn % p.vec == 0,
            log_wg=log2(p.wg),
            log_acc=log2(p.acc),
            log_vector_acc=log2(p.acc / p.vec),
            # one GEMM channel step: tile_p broadcasts and nvec weight vectors feed
            # tile_p * nvec vector multiply-adds
            loads_per_vector_fma=(p.pt + p.nvec) / vector_fmas,
            log_vector_registers=log2(vector_fmas + p.nvec),
            log_gemm_items=log2(p.kb * p.a2),
            log_tiles=log2(p.tiles),
            # the GEMM's multiply-adds per direct-convolution one (the Winograd saving,
            # less the padding of the last tile row and column)
            gemm_flop_ratio=p.a2 * p.tiles / (9 * out_pixels),
            # tiles computed for nothing in the last register block
            idle_tiles=(p.pblocks * p.pt - p.tiles) / (p.pblocks * p.pt),
            # the U slice a GEMM work-item keeps in cache, and the V it streams per block
            log_weight_slice_bytes=log2(4 * op.c * p.oc_bn),
            log_scratch_bytes=log2(4 * p.a2 * p.tiles * (op.c + op.co)),
            log_reduction_steps=log2(op.c),
        )
        return feats

    def _codegen(self, op: Conv2dOp, knobs: dict[str, Any], epilogue: Epilogue,
                 io: IOLayout = IOLayout()) -> Kernel:
        p = _Plan(op, knobs)
        buffers, extra = blocked_io_buffers(op, epilogue, io, (p.kb, p.a2, op.c, p.oc_bn), _rules(p))
        scratch = (Buffer("V", (p.a2, p.tiles, op.c), role="scratch"),
                   Buffer("M", (p.a2, p.tiles, op.co), role="scratch"))
        v_arg, m_arg, out_arg = len(buffers), len(buffers) + 1, len(buffers) - 1
        src = _Source(op, p, epilogue, io)
        rows = op.n * p.n_h
        gemm_grid = (p.kb, p.a2 // p.wg, 1)
        stages = (
            Stage(ENTRY_INPUT, (rows, op.c // src.cv, 1), (1, 1, 1), (0, v_arg)),
            Stage(ENTRY_GEMM, gemm_grid, (1, p.wg, 1), (1, v_arg, m_arg)),
            Stage(ENTRY_OUTPUT, (rows, p.kb, 1), (1, 1, 1),
                  (m_arg, *range(2, 2 + len(extra)), out_arg)),
        )
        source = "\n".join([
            _VECTOR_OPS, *src.input_transform(), "", *src.gemm(), "",
            *src.output_transform([b.name for b in extra])]) + "\n"
        return Kernel(
            source=source,
            entry=ENTRY_GEMM,
            grid=gemm_grid,
            block=(1, p.wg, 1),
            buffers=buffers,
            dialect="",
            meta={"accumulators": p.acc, "threads": p.wg, "io": io, "tile_size": p.m,
                  "input_lanes": src.cv},
            stages=stages,
            scratch=scratch,
        )


def avx512_default(op: Conv2dOp) -> dict[str, Any]:
    """The 16-lane default's knobs: oc_bn the largest factor of K up to
    ``AVX512_MAX_OC_BN``, vec 16 (the largest candidate dividing oc_bn), 4 tiles per register
    block as before (at most P: with oc_bn 64, 16 zmm accumulators of the 32 and 4 of
    weights), one work-item per group; F(4x4), or F(2x2) where ``small_tile`` says."""
    oc_bn = max(f for f in range(1, min(op.co, AVX512_MAX_OC_BN) + 1) if op.co % f == 0)
    m = 2 if small_tile(op) else 4
    return {
        "tile_size": m,
        "tile_oc": (op.co // oc_bn, oc_bn),
        "tile_p": min(4, winograd_op(op, m).tiles),
        "vec": max(v for v in VEC_CANDIDATES if v <= AVX512_LANES and oc_bn % v == 0),
        "wg": 1,
        "wide_tile": False,
    }


def small_tile(op: Conv2dOp) -> bool:
    """F(2x2) rather than F(4x4) on a layer of at most ``SMALL_TILE_TILES`` F(4x4) tiles
    and at least ``SMALL_TILE_WEIGHTS`` weights (C * K). The GEMM streams U (alpha^2 * C
    * K floats) and does one multiply-add per float of it and tile: with few tiles and a
    U past a core's L2, the stream sets the time, and F(2x2)'s U is 1 / 2.25 of
    F(4x4)'s (ResNet-50's 512->512 on 7x7: 4 tiles, U 38 MB at F(4x4); F(2x2) ran 1.6x
    faster). With more tiles (28x28: 49), or a U that stays in cache (DenseNet-121's
    128->32), F(4x4)'s fewer multiply-adds win."""
    return (winograd_op(op, 4).tiles <= SMALL_TILE_TILES
            and op.c * op.co >= SMALL_TILE_WEIGHTS)


def tile_m(knobs: dict[str, Any]) -> Any:
    """The output tile size m a config's knobs (one config's, or ``ConfigSpace.columns``'
    arrays) compute with."""
    return np.where(knobs["wide_tile"], WIDE_TILE, knobs["tile_size"]) \
        if np.ndim(knobs["tile_size"]) else (WIDE_TILE if knobs["wide_tile"]
                                             else int(knobs["tile_size"]))


def winograd_op(op: Conv2dOp, m: int) -> WinogradOp:
    """``op`` with its Winograd tiling of m x m output tiles."""
    fields = {f.name: getattr(op, f.name) for f in dataclasses.fields(Conv2dOp)}
    return WinogradOp(**fields, m=m)


class _Plan:
    """Block sizes a config implies: ints for one config's knobs (codegen), arrays [n]
    for ``ConfigSpace.columns`` (features, limits)."""

    def __init__(self, op: Conv2dOp, k: dict[str, Any]) -> None:
        self.m = tile_m(k)
        self.wide, self.tile_size = k["wide_tile"], k["tile_size"]
        self.alpha = self.m + KERNEL_SIZE - 1
        self.a2 = self.alpha * self.alpha
        self.n_h = ceil_div(op.oh, self.m)
        self.n_w = ceil_div(op.ow, self.m)
        self.tiles = op.n * self.n_h * self.n_w
        self.oc_bn = factors(k["tile_oc"])[1]
        self.kb = op.co // self.oc_bn
        self.pt = k["tile_p"]
        self.pblocks = ceil_div(self.tiles, self.pt)
        self.vec = k["vec"]
        self.wg = k["wg"]
        self.nvec = np.maximum(self.oc_bn // self.vec, 1) if np.ndim(self.oc_bn) \
            else max(self.oc_bn // self.vec, 1)
        self.acc = self.pt * self.oc_bn


def _rules(p: _Plan) -> tuple[Rule, ...]:
    """vec splits oc_bn into vectors: it must divide it. A register block of more tiles
    than the layer has computes copies of the last tile: refused. wide_tile goes with
    tile_size 4 only (with 2 it would be the same kernel again)."""
    return (
        Rule(ok=p.oc_bn % p.vec == 0,
             message="vec {vec} does not divide the output-channel block {oc_bn}",
             values={"vec": p.vec, "oc_bn": p.oc_bn}),
        Rule(ok=p.pt <= p.tiles,
             message="tile_p {tile_p} is more than the layer's {tiles} tiles of {m}x{m}",
             values={"tile_p": p.pt, "tiles": p.tiles, "m": p.m}),
        Rule(ok=np.logical_or(np.logical_not(p.wide), p.tile_size == 4),
             message="wide_tile takes tile_size 4's place, not tile_size {tile_size}'s "
                     "(the same F(6x6) kernel)",
             values={"tile_size": p.tile_size}),
    )


class _Source:
    """The three kernels' bodies, written against the prelude's macros (vec 1: floats)."""

    def __init__(self, op: Conv2dOp, p: _Plan, epilogue: Epilogue, io: IOLayout) -> None:
        self.op, self.p, self.epilogue, self.io = op, p, epilogue, io
        db = io.data_block
        # input lanes: a power of two up to vec dividing C (and the data block, so that a
        # lane group is one contiguous load)
        self.cv = max(v for v in VEC_CANDIDATES
                      if v <= p.vec and op.c % v == 0 and (not db or db % v == 0))

    @staticmethod
    def vtype(lanes: int) -> str:
        return "float" if lanes == 1 else f"VEC_T({lanes})"

    @staticmethod
    def vload(lanes: int, ptr: str) -> str:
        return f"({ptr})[0]" if lanes == 1 else f"VLOAD({lanes}, 0, {ptr})"

    @staticmethod
    def vstore(lanes: int, value: str, ptr: str, stream: bool = False) -> str:
        if lanes == 1:
            return f"({ptr})[0] = {value};"
        return f"{'VSTREAM' if stream else 'VSTORE'}({lanes}, {value}, 0, {ptr});"

    def streams_v(self) -> bool:
        """Whether the input transform writes V with non-temporal stores (``VSTREAM``):
        where V is ``STREAM_V_BYTES`` or more it has left the caches when the GEMM reads
        it, and a plain store first reads each line it writes. Only with 16-lane
        stores: each then writes a whole cache line (a lane group's channels are
        contiguous, c0 a multiple of them, so the line is aligned), where a narrower
        lane group leaves the rest of the line to other work-items. The default
        F(4x4) kernel on the Zen 4 VM: VGG's 64x224x224 3x3 layer 0.75-0.78x the time,
        128x112x112 0.90-0.95x, 256x56x56 (V 7.2 MB) 0.96-1.00x; below, a V the GEMM
        finds in the caches: 256x14x14 (0.8 MB) 1.24-1.28x, 512x28x28 (3.6 MB) ~1.07x,
        within the noise (docs/BENCHMARKS.md, "Winograd's V streamed")."""
        p = self.p
        return self.cv == STREAM_LANES and 4 * p.a2 * p.tiles * self.op.c >= STREAM_V_BYTES

    @staticmethod
    def vbcast(lanes: int, x: str) -> str:
        return x if lanes == 1 else f"VBCAST({lanes}, {x})"

    def input_transform(self) -> list[str]:
        op, p, cv = self.op, self.p, self.cv
        alpha, m, db = p.alpha, p.m, self.io.data_block
        hw = op.h * op.w
        vt = self.vtype(cv)
        _, b_mat, _ = transform_matrices(m)
        lines = [
            signature(ENTRY_INPUT, ["data"], "V") + " {",
            "  const int r = BLOCK_X, cg = BLOCK_Y;",
            f"  const int n = r / {p.n_h}, th = r % {p.n_h};",
            f"  const int c0 = cg * {cv};",
            f"  const int y0 = th * {m} - {op.pad[0]};",
        ]
        if db:  # NCHW[db]c: a pixel's db channels are contiguous, one block after another
            lines.append(f"  GLOBAL const float* src = data + (n * {op.c // db} + c0 / {db})"
                         f" * {hw * db} + c0 % {db};")
            ps = db
        else:
            lines.append(f"  GLOBAL const float* src = data + (n * {op.c} + c0) * {hw};")
            ps = 1
        lines.append(f"  GLOBAL float* dst = V + r * {p.n_w * op.c} + c0;")
        for i in range(alpha):
            lines.append(f"  const int rv{i} = y0 + {i} >= 0 && y0 + {i} < {op.h};")

        def load(i: int, j: int) -> str:
            at = f"((y0 + {i}) * {op.w} + x0 + {j}) * {ps}" if ps > 1 else \
                f"(y0 + {i}) * {op.w} + x0 + {j}"
            if db or cv == 1:
                return self.vload(cv, f"src + {at}")
            lanes = ", ".join(f"src[{at} + {e * hw}]" for e in range(cv))
            return f"WMAKE({cv}, {lanes})"

        zero = self.vbcast(cv, "0.0f")
        inside = [f"d{i}_{j} = {load(i, j)};" for i in range(alpha) for j in range(alpha)]
        border = [f"const int cv{j} = x0 + {j} >= 0 && x0 + {j} < {op.w};" for j in range(alpha)]
        border += [f"d{i}_{j} = (rv{i} && cv{j}) ? {load(i, j)} : {zero};"
                   for i in range(alpha) for j in range(alpha)]
        body = [f"const int x0 = tw * {m} - {op.pad[1]};"]
        body += [f"{vt} " + ", ".join(f"d{i}_{j}" for j in range(alpha)) + ";"
                 for i in range(alpha)]
        body += [f"if (y0 >= 0 && y0 + {alpha - 1} < {op.h} && x0 >= 0 && "
                 f"x0 + {alpha - 1} < {op.w}) {{", *indent(inside), "} else {",
                 *indent(border), "}"]
        body += _transform_2d(b_mat.T, "d", "vt", "v", vt)
        stream = self.streams_v()
        for i in range(alpha):
            for j in range(alpha):
                b = i * alpha + j
                body.append(self.vstore(cv, f"v{i}_{j}",
                                        f"dst + {b * p.tiles * op.c} + tw * {op.c}", stream))
        lines += [f"  for (int tw = 0; tw < {p.n_w}; ++tw) {{", *indent(indent(body)), "  }"]
        lines.append("}")
        return lines

    def prefetches(self) -> bool:
        """Whether a GEMM work-item prefetches the U slice of the next group's (the next
        oc block's, same point: groups run with x, the oc block, fastest) while it walks
        its own tiles, a share each pass (``compiler.templates.prefetch``): where U is
        large enough (``prefetch.wanted``) that a model reads it from memory."""
        op, p = self.op, self.p
        return prefetch.wanted(4 * p.a2 * op.c * op.co, p.kb)

    def gemm(self) -> list[str]:
        """M[b][p][kb * oc_bn + :] = sum_c V[b][p][c] U[kb][b][c][:], tile_p tiles at once."""
        op, p = self.op, self.p
        vec, nvec, pt, tiles = p.vec, p.nvec, p.pt, p.tiles
        vt = self.vtype(vec)
        lines = [
            signature(ENTRY_GEMM, ["weight", "V"], "M") + " {",
            f"  const int kb = BLOCK_X, b = BLOCK_Y * {p.wg} + THREAD_Y;",
            f"  GLOBAL const float* ub = weight + (kb * {p.a2} + b) * {op.c * p.oc_bn};",
            f"  GLOBAL const float* vb = V + b * {tiles * op.c};",
            f"  GLOBAL float* mb = M + b * {tiles * op.co} + kb * {p.oc_bn};",
        ]
        if self.prefetches():  # no slices (prefetch.slice_start): the whole next slice
            nxt = p.a2 * op.c * p.oc_bn
            lines.append(f"  GLOBAL const float* wn = kb + 1 == {p.kb} ? ub : ub + {nxt};")
        tail = tiles % pt != 0
        body = []
        for t in range(pt):
            # the last block's missing tiles repeat the last tile (same value, same place)
            at = f"p0 + {t}" if t else "p0"
            if t and tail:
                at = f"min(p0 + {t}, {tiles - 1})"
            body.append(f"GLOBAL const float* v{t} = vb + ({at}) * {op.c};")
            body.append(f"GLOBAL float* m{t} = mb + ({at}) * {op.co};")
        accs = [(t, v, f"acc{t}_{v}") for t in range(pt) for v in range(nvec)]
        body += [f"{vt} {name} = {self.vbcast(vec, '0.0f')};" for _, _, name in accs]
        inner = [f"GLOBAL const float* uc = ub + c * {p.oc_bn};"]
        inner += [f"const {vt} w{v} = {self.vload(vec, f'uc + {v * vec}')};"
                  for v in range(nvec)]
        inner += [f"const {vt} d{t} = {self.vbcast(vec, f'v{t}[c]')};" for t in range(pt)]
        inner += [f"{name} = " + (f"d{t} * w{v} + {name};" if vec == 1
                                  else f"VFMA(d{t}, w{v}, {name});")
                  for t, v, name in accs]
        if self.prefetches():  # the next group's slice, a share each pass over the tiles
            body += prefetch.paced_loop("c", op.c, 1, inner, f"(p0 / {pt}) * {op.c * p.oc_bn}",
                                        p.oc_bn, p.pblocks)
        else:
            body += [f"for (int c = 0; c < {op.c}; ++c) {{", *indent(inner), "}"]
        body += [self.vstore(vec, name, f"m{t} + {v * vec}") for t, v, name in accs]
        lines += [f"  for (int p0 = 0; p0 < {tiles}; p0 += {pt}) {{",
                  *indent(indent(body)), "  }", "}"]
        return lines

    def element(self, block: int, k: str, y: str, x: str) -> str:
        """Index of output element (n, k, y, x) in NCHW (``block`` 0) or NCHW[block]c."""
        op = self.op
        if not block:
            return f"((n * {op.co} + {k}) * {op.oh} + {y}) * {op.ow} + {x}"
        return (f"(((n * {op.co // block} + ({k}) / {block}) * {op.oh} + {y}) * {op.ow} + {x})"
                f" * {block} + ({k}) % {block}")

    def output_transform(self, extra: list[str]) -> list[str]:
        op, p, io, ep = self.op, self.p, self.io, self.epilogue
        alpha, m, vec = p.alpha, p.m, p.vec
        vt = self.vtype(vec)
        a_mat, _, _ = transform_matrices(m)
        ob = io.out_block
        vector_store = (ob == p.oc_bn and ep.vectorizable
                        and ("add" not in ep.ops or io.residual_block == p.oc_bn
                             or io.residual_vectors(vec)))
        lines = [
            signature(ENTRY_OUTPUT, ["M", *extra], "out") + " {",
            "  const int r = BLOCK_X, kb = BLOCK_Y;",
            f"  const int n = r / {p.n_h}, th = r % {p.n_h};",
        ]
        body = [f"const int k0 = kb * {p.oc_bn} + v * {vec};",
                f"GLOBAL const float* mp = M + (r * {p.n_w} + tw) * {op.co} + k0;"]
        for i in range(alpha):
            for j in range(alpha):
                b = i * alpha + j
                body.append(f"const {vt} s{i}_{j} = "
                            f"{self.vload(vec, f'mp + {b * p.tiles * op.co}')};")
        body += _transform_2d(a_mat.T, "s", "yt", "y", vt)
        crop_h, crop_w = op.oh % m, op.ow % m
        stores = []
        for i in range(m):
            for j in range(m):
                y, x = f"th * {m} + {i}", f"tw * {m} + {j}"
                conds = ([f"{y} < {op.oh}"] if crop_h and i >= crop_h else []) + \
                        ([f"{x} < {op.ow}"] if crop_w and j >= crop_w else [])
                store = (self.store_vector(f"y{i}_{j}", y, x) if vector_store
                         else self.store_lane(f"tile_f[{(i * m + j) * vec} + e]", y, x))
                if conds:
                    stores += [f"if ({' && '.join(conds)}) {{", *indent(store), "}"]
                else:
                    stores += ["{", *indent(store), "}"]
        if vector_store:
            body += stores
        else:  # lane by lane, through a private tile and a loop over the lanes (every
            # vec: on 12 random configs, bench/compile_ab.py, none ran slower so)
            body += private_tile(vt, [f"y{i}_{j}" for i in range(m) for j in range(m)])
            body += [f"for (int e = 0; e < {vec}; ++e) {{", "  const int k = k0 + e;",
                     *indent(stores), "}"]
        loops = [f"for (int tw = 0; tw < {p.n_w}; ++tw) {{",
                 *indent([f"for (int v = 0; v < {p.nvec}; ++v) {{", *indent(body), "}"]),
                 "}"]
        lines += indent(loops)
        lines.append("}")
        return lines

    def store_vector(self, value: str, y: str, x: str) -> list[str]:
        """NCHW[oc_bn]c output: the pixel's vector of oc lanes k0.. (and the residual's,
        from its own block where that is not oc_bn)."""
        p, vec, rb = self.p, self.p.vec, self.io.residual_block
        at = (f"(((n * {p.kb} + kb) * {self.op.oh} + {y}) * {self.op.ow} + {x})"
              f" * {p.oc_bn} + v * {vec}")
        out = [f"const int o = {at};"]
        for name in self.epilogue.ops:
            if name == "bias":
                value = f"({value} + {self.vload(vec, 'bias + k0')})"
            elif name == "add":
                r = "o" if rb == p.oc_bn else self.element(rb, "k0", y, x)
                value = f"({value} + {self.vload(vec, f'residual + {r}')})"
            else:  # relu: the only other op of a vectorizable epilogue
                value = (f"fmax({value}, 0.0f)" if vec == 1
                         else f"VMAX({value}, {self.vbcast(vec, '0.0f')})")
        out.append(self.vstore(vec, value, "out + o"))
        return out

    def store_lane(self, value: str, y: str, x: str) -> list[str]:
        """Any other layout or epilogue: lane ``value`` of channel k through the scalar
        epilogue (``output_transform`` loops over the lanes)."""
        io = self.io
        residual = f"residual[{self.element(io.residual_block, 'k', y, x)}]"
        value = self.epilogue.c_expr(value, "bias[k]", residual)
        return [f"out[{self.element(io.out_block, 'k', y, x)}] = {value};"]


TEMPLATE = Conv2dNCHWcWinograd()

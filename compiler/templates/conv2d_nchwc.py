"""``conv2d_NCHWc.x86``: AutoTVM's CPU conv2d schedule, as an OpenCL kernel for CPU devices.

AutoTVM's x86 template blocks channels (NCHW[x]c data, OIHW[x]i[y]o weights) and keeps a
row of ``reg_n`` output x positions times ``oc_bn`` output channels in vector registers.
Here the weight is packed once (``pack_weight``: [K/oc_bn][C/ic_bn][R][S][ic_bn][oc_bn],
a constant transform the compiler does at build time and the measurer before a trial).
Activations are plain NCHW by default; ``codegen(..., io=IOLayout(...))`` reads the data
in NCHW[data_block]c, writes the output in NCHW[out_block]c and reads a fused residual
in NCHW[residual_block]c (``blocked_io``): the compiler keeps that layout between
consecutive convolutions (``compiler/build_module.py``). A data block is any divisor of
C, independent of ic_bn (the data loads are scalar; only their index math changes);
with out_block = oc_bn each accumulator vector is one vector store (and the epilogue
runs on vectors when vec divides the residual's block: ``IOLayout.residual_vectors``),
any other block stores lane by lane.

Kernel: one work-item per (image and output-channel block, ``tile_oh`` output rows, block
of ``reg_n`` output x); its accumulators ``acc[tile_oh][reg_n][oc_bn / vec]`` are
``vec``-wide float vectors held in registers (the source is unrolled over them). It loops
over the ic blocks, kh, kw (unrolled in the source when ``unroll_kw``) and the channels of
a block; each step loads one input scalar per output position and ``oc_bn / vec`` weight
vectors (contiguous in the packed weight) and does a vector multiply-add per accumulator.
Padding: the x blocks whose input window leaves the image (a few at each side, known at
code generation) each get their own copy of the reduction with x0 written in, kw unrolled
and the taps that read padding left out, so no load is checked or masked; the other
blocks share one copy without checks. Rows outside the image are skipped per kh step
(masked to zero when a work-item holds tile_oh = 2 rows). Fused epilogues apply at the
store, a prologue (``Prologue``: DenseNet's pre-activation) on each loaded input value.
Local size (wg, 1, 1) along the x blocks. Where the weight is 1 MB or more (a model
reads it from memory, not from the caches a trial leaves it in), the work-items of an
output-channel block but its first prefetch the next block's weight, a slice each
(``compiler.templates.prefetch``). The same body compiles as CUDA C through
the prelude's vector macros.

Knobs, as AutoTVM defines them (index order, first least significant), so a TopHub llvm
record is a config here and its ``index`` means the same point:
``tile_ic`` [C/ic_bn, ic_bn], ``tile_oc`` [K/oc_bn, oc_bn], ``tile_ow`` [OW/reg_n, reg_n]
(reg_n <= 64), and for kernels other than 1x1 ``unroll_kw`` (True, False), for 1x1 kernels
``tile_oh`` ((1, 2), or (1,) when OH is 1: output rows per work-item). Appended after them
(most significant, so TopHub indices stay valid), the OpenCL knobs: ``vec`` (1, 2, 4, 8,
16: lanes per vector; must divide oc_bn, else ``check_limits`` rejects the config) and
``wg`` (1, 2, 4, 8: work-items per work-group). A record without ``vec``/``wg`` (every
TopHub record) decodes with vec = 16 if it divides oc_bn, else the largest candidate
that does, and wg = 1: 16 floats is the vector width of the skylake-avx512 targets those
records were tuned for (AutoTVM vectorised the whole oc_bn axis and LLVM split it into
such registers), and on this AVX-512 host 16 beat 8 on the same blocks.

After them, two loop knobs (issue 17), AutoTVM-style reduction split and loop order:
``unroll_ci`` (1, 2, 4, 8, 16: the ci loop split into an outer loop and an inner part of
that many steps written out, so LLVM schedules the loads of one step under the
multiply-adds of the previous; must divide ic_bn, else ``check_limits`` rejects the
config) and ``order_oc`` (0: the output-channel blocks are the outermost grid axis, each
sweeps the whole image with its weight block in cache; 1: innermost, the channel blocks
of one pixel block run one after another and its input rows stay in cache: it pays where
the input is large against the weight, the stride-2 1x1 convs). A config without them
(every TopHub record, our records from before) decodes with unroll_ci = 1, order_oc = 0:
the loops as they were, and the same ``index``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from compiler.templates import prefetch
from compiler.templates.base import (
    AVX512_LANES,
    Buffer,
    Epilogue,
    IOLayout,
    Kernel,
    Prologue,
    Rule,
    Template,
    Usage,
    WorkloadError,
    blocked_shape,
    epilogue_buffers,
    factors,
    log2,
    simd_lanes,
    split_features,
)
from compiler.templates.emit import indent, private_tile, signature
from compiler.templates.ops import Conv2dOp
from compiler.templates.space import ConfigError, ConfigSpace, OtherKnob, SplitKnob
from schemas import Config, DeviceLimits, KnobEntity, Workload

VEC_CANDIDATES = (1, 2, 4, 8, 16)
WG_CANDIDATES = (1, 2, 4, 8)
# What a config without the OpenCL knobs (a TopHub llvm record) runs with.
DEFAULT_VEC, DEFAULT_WG = 16, 1
OPENCL_KNOBS = ("vec", "wg")
ORDER_CANDIDATES = (0, 1)
UNROLL_CI_CANDIDATES = (1, 2, 4, 8, 16)
# The loop-structure knobs appended after the OpenCL ones; a config without them (a
# TopHub record, a record of ours from before) runs today's loops: these values.
LOOP_DEFAULTS = {"order_oc": 0, "unroll_ci": 1}
# oc_bn of the 16-lane (AVX-512) default where it divides K (``default_oc_bn``)
AVX512_OC_BN = 32
# ci unrolls a strided KxK default config takes, the largest dividing ic_bn first
STRIDED_UNROLL_CI = (4, 8)
ENTRY = "conv2d_nchwc_kernel"
# the narrowest vectors whose lane-wise stores loop over a private tile (``_Source.store``)
TILE_STORE_MIN_VEC = 4


def default_vec(oc_bn: int) -> int:
    """vec for a config that does not set it: 16 if it divides oc_bn, else the largest
    candidate that does (1 always does)."""
    if oc_bn % DEFAULT_VEC == 0:
        return DEFAULT_VEC
    return max(v for v in VEC_CANDIDATES if oc_bn % v == 0)


def default_reg_n(ow: int, lanes: int = 0) -> int:
    """reg_n of the default config. Below 16 lanes (AVX2, or unknown): the largest factor
    of OW up to 6, or up to 8 when that is below 4. With oc_bn 16, 6 x 16 accumulators
    fill 12 of AVX2's 16 vector registers (MLAS's 6x16 tile), where AutoTVM's reg_n up to
    8 (128 accumulators, all 16 registers, for AVX-512's 32) spills: on ResNet-50's
    layers the default config ran 1.4-2.2x faster with reg_n 4 than 8 at OW 56 and 112,
    up to 2.1x than 7 at OW 28, 1.21-1.23x weighted over all of them
    (bench/direct_defaults.py, a Zen 1 AVX2 VM). OW 7 and 14 keep 7: their factors below
    it (1, 2) leave too little work per step (reg_n 1 ran 0.5x).
    At 16 lanes (AVX-512: 32 registers): the largest factor of OW up to 8, beside
    ``AVX512_OC_BN``: see ``default_oc_bn``."""
    if lanes >= AVX512_LANES:
        return _largest_factor(ow, 8)
    reg_n = _largest_factor(ow, 6)
    return reg_n if reg_n >= 4 else _largest_factor(ow, 8)


def default_oc_bn(co: int, lanes: int = 0) -> int:
    """oc_bn of the default config: the largest factor of K up to 16 (AutoTVM's), or
    ``AVX512_OC_BN`` (32) at 16 lanes where it divides K. One 16-lane vector per pixel
    left the AVX-512 default with 4-6 accumulator vectors, too few chains for two FMA
    units of 4 cycles' latency; two vectors x reg_n up to 8 keep 14-16 in flight (of 32
    registers). On a 2-core Xeon (Emerald Rapids, PoCL's skylake-avx512) that ran
    ResNet-50's direct layers 1.37-1.40x faster weighted than the 8-lane default
    (0.99-2.66x per layer; oc_bn 64 x reg_n 4 or 6 came out 0.96-1.06x, oc_bn 16 x reg_n
    up to 14 or 28 1.06-1.11x): ``bench/direct_defaults.py --models resnet50 --all``."""
    if lanes >= AVX512_LANES and co % AVX512_OC_BN == 0:
        return AVX512_OC_BN
    return _largest_factor(co, 16)


def strided_loops(op: Conv2dOp, ic_bn: int, lanes: int = 0) -> dict[str, int]:
    """The default loop knobs of a strided kernel larger than 1x1 (else none): channel
    blocks innermost (order_oc 1: a pixel block's input rows, read at stride 2, stay in
    cache while every weight block passes over them) and the ci loop unrolled by the
    largest of ``STRIDED_UNROLL_CI`` dividing ic_bn; none where neither 4 nor 8 divides
    ic_bn. On ResNet-50's three 3x3 stride-2 layers it took 4-20% less CPU time per launch
    than the loops before, side by side on a loaded machine (load 5-12,
    bench/direct_strided.py; a Zen 1 AVX2 VM).
    At 16 lanes a layer whose weights outweigh its input (C*K*kh*kw against N*C*H*W
    floats) keeps the channel blocks outermost (each weight block then stays in cache
    while every row passes over it): on the AVX-512 Xeon ResNet-50's 256->256 on 28x28
    (2.4 MB of weights, 0.8 MB of input) and 512->512 on 14x14 (9.4 MB, 0.4 MB) ran
    1.32-1.33x faster so, 128->128 on 56x56 (0.6 MB, 1.6 MB) the same
    (bench/direct_defaults.py's "16-lane, order_oc 1" variant is the rule before)."""
    if op.stride == (1, 1) or (op.kh, op.kw) == (1, 1):
        return {}
    unroll = max(u for u in (1, *STRIDED_UNROLL_CI) if ic_bn % u == 0)
    if unroll == 1:
        return {}
    weights_win = lanes >= AVX512_LANES and op.co * op.kh * op.kw > op.n * op.h * op.w
    return {"order_oc": 0 if weights_win else 1, "unroll_ci": unroll}


class Conv2dNCHWc(Template):
    name = "conv2d_NCHWc.x86"
    thread_word, thread_one, group_word = "work-items", "work-item", "group"
    packs_weight = True
    blocked_io = True
    takes_prologue = True  # padded taps are left out, masked rows zeroed after it

    def parse(self, workload: Workload) -> Conv2dOp:
        args = workload.args
        if len(args) != 8:
            raise WorkloadError(
                "conv2d_NCHWc args: expected [data, kernel, strides, padding, dilation, layout, "
                f"out_layout, out_dtype], got {len(args)} items")
        for i, what in ((5, "layout"), (6, "out_layout")):
            if args[i] != "NCHW":
                raise WorkloadError(
                    f"args[{i}] ({what}): {args[i]!r} is not supported; this template reads "
                    "and writes NCHW tensors (the weight it packs itself), so only \"NCHW\"")
        return Conv2dOp.from_args((*args[:5], args[7]))

    def _space(self, op: Conv2dOp) -> ConfigSpace:
        knobs: list[SplitKnob | OtherKnob] = [
            SplitKnob("tile_ic", op.c, 2),
            SplitKnob("tile_oc", op.co, 2),
            SplitKnob("tile_ow", op.ow, 2, keep=_reg_n_at_most_64),
        ]
        if op.kh == 1 and op.kw == 1:
            knobs.append(OtherKnob("tile_oh", (1, 2) if op.oh > 1 else (1,)))
        else:
            knobs.append(OtherKnob("unroll_kw", (True, False)))
        knobs += [OtherKnob("vec", VEC_CANDIDATES), OtherKnob("wg", WG_CANDIDATES)]
        knobs += [OtherKnob("order_oc", ORDER_CANDIDATES),
                  OtherKnob("unroll_ci", UNROLL_CI_CANDIDATES)]
        return ConfigSpace(knobs)

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        """Knob values; a config that lacks both OpenCL knobs (a TopHub record) gets vec =
        ``default_vec(oc_bn)`` and wg = 1, one that lacks both loop knobs gets
        ``LOOP_DEFAULTS`` (the loops as they were before the knobs)."""
        space = self.space(workload)
        names = {e.name for e in config.entity}
        if not any(n in names for n in OPENCL_KNOBS):
            config = _with_opencl_defaults(space, config)
        if not any(n in names for n in LOOP_DEFAULTS):
            config = config.model_copy(update={"entity": (*config.entity, *(
                KnobEntity(name=k.name, kind="ot", value=LOOP_DEFAULTS[k.name])
                for k in space.knobs if k.name in LOOP_DEFAULTS))})
        return space.decode(config)

    def autotvm_index(self, workload: Workload, config: Config) -> int:
        """The index of ``config``'s point among AutoTVM's knobs alone (what a TopHub
        record's ``index`` counts): our index modulo the size of AutoTVM's part."""
        space = self.space(workload)
        base = math.prod(len(k) for k in space.knobs
                         if k.name not in (*OPENCL_KNOBS, *LOOP_DEFAULTS))
        return space.index_of(self.decode(workload, config)) % base

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        """OIHW -> [K/oc_bn][C/ic_bn][R][S][ic_bn][oc_bn] (AutoTVM's OIHW[x]i[y]o)."""
        op = self.parse(workload)
        k = self.decode(workload, config)
        ic_bn, oc_bn = k["tile_ic"][1], k["tile_oc"][1]
        w = np.asarray(weight, dtype=np.float32).reshape(
            op.co // oc_bn, oc_bn, op.c // ic_bn, ic_bn, op.kh, op.kw)
        return np.ascontiguousarray(w.transpose(0, 2, 4, 5, 3, 1))

    def out_block(self, workload: Workload, config: Config) -> int:
        """oc_bn: with it as the output's channel block, every accumulator vector is one
        contiguous vector store (AutoTVM's NCHW[oc_bn]c output)."""
        return int(self.decode(workload, config)["tile_oc"][1])

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """AutoTVM's x86 fallback, shaped for this kernel: oc_bn by ``default_oc_bn`` (16,
        or 32 on a 16-lane device), ic_bn the largest factor of C up to min(oc_bn, 16),
        reg_n by ``default_reg_n`` (by the device's lanes), vec 16 (or the largest that
        divides oc_bn; 8 measured no faster on AVX2), kw unrolled, one row, one work-item
        per group, channel blocks outermost. ``limits`` None (or a device that does not
        say its lanes) gets the AVX2 tile, measured on a Zen 1 VM. A 1x1 kernel's ci loop
        is unrolled by 2 (when ic_bn is even): its loop body has no kw copies to schedule
        loads under, and the unroll was faster on every 1x1 row of ResNet-50 measured
        (bench/space.py).
        A strided kernel larger than 1x1 (ResNet-50's 3x3 stride-2 layers) runs its
        ci loop unrolled by ``STRIDED_UNROLL_CI`` and its channel blocks innermost (on a
        16-lane device only where its input outweighs its weights; see
        ``strided_loops``); other kernels keep the loops as they were."""
        op = self.parse(workload)
        space = self.space(workload)
        lanes = simd_lanes(limits)
        oc_bn = default_oc_bn(op.co, lanes)
        ic_bn = _largest_factor(op.c, min(oc_bn, 16))
        reg_n = default_reg_n(op.ow, lanes)
        one_by_one = op.kh == 1 and op.kw == 1
        values: dict[str, Any] = {
            "tile_ic": (op.c // ic_bn, ic_bn),
            "tile_oc": (op.co // oc_bn, oc_bn),
            "tile_ow": (op.ow // reg_n, reg_n),
            "vec": default_vec(oc_bn),
            "wg": 1,
            "order_oc": 0,
            "unroll_ci": 2 if one_by_one and ic_bn % 2 == 0 else 1,
        }
        values.update(strided_loops(op, ic_bn, lanes))
        if one_by_one:
            values["tile_oh"] = 1
        else:
            values["unroll_kw"] = True
        return space.to_config(values)

    def _usage(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> Usage:
        p = _Plan(op, knobs)
        return Usage(threads=p.wg, threads_x=p.wg, local_elements=p.acc,
                     local_detail=((p.oh_f, "rows"), (p.reg_n, ""), (p.oc_bn, "channels")),
                     rules=(_vec_rule(p), _unroll_rule(p)), grid=p.grid)

    def _feature_columns(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        p = _Plan(op, knobs)
        feats: dict[str, Any] = split_features(knobs, "tile_ic", "tile_oc", "tile_ow")
        # one (ci, kh, kw) step: oh_f * reg_n input scalars (broadcast to vectors) and
        # nvec weight vectors loaded, oh_f * reg_n * nvec vector multiply-adds
        pixels = p.oh_f * p.reg_n
        vector_fmas = pixels * p.nvec
        step_flops = 2 * p.acc
        feats.update(
            tile_oh=p.oh_f,
            unroll_kw=p.unroll_kw,
            log_vec=log2(p.vec),
            vec_divides=p.oc_bn % p.vec == 0,
            log_wg=log2(p.wg),
            log_acc=log2(p.acc),
            log_vector_acc=log2(p.acc / p.vec),
            log_work_items=log2(p.work_items),
            log_groups=log2(p.groups),
            loads_per_flop=(pixels + p.oc_bn) / step_flops,
            border_x_fraction=p.border_count / p.owb,
            log_reduction_steps=log2(op.c * op.kh * op.kw),
            loads_per_vector_fma=(pixels + p.nvec) / vector_fmas,
            # register reuse: each weight vector feeds every pixel, each input every vector
            log_weight_reuse=log2(pixels),
            log_data_reuse=log2(p.nvec),
            # vector registers live in the inner loop: accumulators plus weights
            log_vector_registers=log2(vector_fmas + p.nvec),
            # vector multiply-adds written out per ci loop step (kw copies when unrolled,
            # unroll_ci copies of the ci body)
            log_unrolled_fmas=log2(vector_fmas * np.where(p.unroll_kw, op.kw, 1)
                                   * p.unroll_ci),
            log_unroll_ci=log2(p.unroll_ci),
            unroll_divides=p.ic_bn % p.unroll_ci == 0,
            order_oc=p.oc_inner,
            # channel blocks that read one pixel block's input while it is in cache
            log_input_reuse_in_cache=log2(np.where(p.oc_inner, p.kb, 1)),
            # packed weight bytes one ic block walks (its ci loop over kh x kw taps)
            log_weight_block_bytes=log2(4 * op.kh * op.kw * p.ic_bn * p.oc_bn),
            # share of work-items of the grid that have no x block (the last group's spare)
            idle_items=(p.groups_x * p.wg - p.owb) / (p.groups_x * p.wg),
        )
        return feats

    def _codegen(self, op: Conv2dOp, knobs: dict[str, Any], epilogue: Epilogue,
                 io: IOLayout = IOLayout(), prologue: Prologue = Prologue()) -> Kernel:
        p = _Plan(op, knobs)
        buffers, extra = blocked_io_buffers(
            op, epilogue, io, (p.kb, p.cb, op.kh, op.kw, p.ic_bn, p.oc_bn),
            (_vec_rule(p), _unroll_rule(p)), prologue)
        source = _Source(op, p, epilogue, [b.name for b in extra], io, prologue).lines()
        return Kernel(
            source="\n".join(source) + "\n",
            entry=ENTRY,
            grid=p.grid,
            block=(p.wg, 1, 1),
            buffers=buffers,
            dialect="",
            meta={"accumulators": p.acc, "threads": p.wg, "io": io},
        )


def _reg_n_at_most_64(value: tuple[int, ...]) -> bool:
    return value[-1] <= 64


def _largest_factor(n: int, cap: int) -> int:
    return max(f for f in range(1, min(n, cap) + 1) if n % f == 0)


def _with_opencl_defaults(space: ConfigSpace, config: Config) -> Config:
    oc = next((e for e in config.entity if e.name == "tile_oc"), None)
    if oc is None:
        raise ConfigError("config knobs do not match the space: missing tile_oc")
    knob = next(k for k in space.knobs if k.name == "tile_oc")
    oc_bn = knob.decode(oc.value)[1]
    entity = (*config.entity, KnobEntity(name="vec", kind="ot", value=default_vec(oc_bn)),
              KnobEntity(name="wg", kind="ot", value=DEFAULT_WG))
    return config.model_copy(update={"entity": entity})


def blocked_io_buffers(op: Conv2dOp, epilogue: Epilogue, io: IOLayout,
                       weight_shape: tuple[int, ...], rules: Iterable[Rule],
                       prologue: Prologue = Prologue()
                       ) -> tuple[tuple[Buffer, ...], list[Buffer]]:
    """The buffers every blocked-IO CPU conv kernel takes (data, packed weight, the
    epilogue's, the prologue's, out: the layouts they chain in), after the config's
    codegen rules: (buffers, the epilogue's and prologue's buffers). Raises ConfigError
    for a rule the config breaks."""
    for rule in rules:
        if not rule.ok:
            raise ConfigError(rule.message_at(0))
    if io.residual_block and "add" not in epilogue.ops:
        raise ValueError(f"residual_block {io.residual_block}: the epilogue "
                         f"{epilogue.ops} reads no residual")
    out_shape = op.output_shape
    residual_shape = blocked_shape(out_shape, io.residual_block, "residual")
    extra = epilogue_buffers(epilogue, out_shape, 1, residual_shape) + prologue.buffers(op.c)
    buffers = (
        Buffer("data", blocked_shape(op.input_shapes[0], io.data_block, "data")),
        Buffer("weight", weight_shape),
        *extra,
        Buffer("out", blocked_shape(out_shape, io.out_block, "output"), role="out"),
    )
    return buffers, extra


class _Plan:
    """Block sizes a config implies: ints for one config's knobs (codegen), arrays [n]
    for ``ConfigSpace.columns`` (features, limits)."""

    def __init__(self, op: Conv2dOp, k: dict[str, Any]) -> None:
        self.op = op
        self.ic_bn = factors(k["tile_ic"])[1]
        self.cb = op.c // self.ic_bn
        self.oc_bn = factors(k["tile_oc"])[1]
        self.kb = op.co // self.oc_bn
        self.reg_n = factors(k["tile_ow"])[1]
        self.owb = op.ow // self.reg_n
        self.oh_f = k.get("tile_oh", 1)
        self.ohb = -(-op.oh // self.oh_f)
        # a 1x1 kernel's kw loop has one step: nothing left to unroll
        self.unroll_kw = k.get("unroll_kw", True)
        self.vec = k["vec"]
        self.wg = k["wg"]
        self.oc_inner = k["order_oc"]
        self.unroll_ci = k["unroll_ci"]
        self.nvec = _at_least_1(self.oc_bn // self.vec)
        self.acc = self.oh_f * self.reg_n * self.oc_bn
        self.groups_x = -(-self.owb // self.wg)
        self.work_items = op.n * self.kb * self.ohb * self.owb
        self.groups = op.n * self.kb * self.ohb * self.groups_x
        sh, dh = op.stride[0], op.dilation[0]
        # static bounds: which sides of the input window can leave the image
        self.check_top = op.pad[0] > 0
        self.check_bottom = (op.oh - 1) * sh - op.pad[0] + (op.kh - 1) * dh >= op.h
        self.row_tail = op.oh % self.oh_f != 0

    @property
    def grid(self) -> tuple[Any, Any, Any]:
        """Work-groups along x (x blocks; times the channel blocks when order_oc puts them
        innermost: x varies fastest in PoCL's group order), y (row blocks) and z (images;
        times the channel blocks otherwise)."""
        x_kb = np.where(self.oc_inner, self.kb, 1)
        grid = (self.groups_x * x_kb, self.ohb, self.op.n * self.kb // x_kb)
        return grid if np.ndim(self.oc_inner) else (int(grid[0]), int(grid[1]), int(grid[2]))

    @property
    def border_blocks(self) -> list[int]:
        """The x blocks whose input window leaves the image (one config: codegen)."""
        return _border_blocks(self.op, int(self.reg_n))

    @property
    def border_count(self) -> Any:
        """How many x blocks run a border copy of the reduction, per config."""
        if not np.ndim(self.reg_n):
            return len(self.border_blocks)
        # reg_n takes few values (divisors of OW): count each once, then look up
        table = np.zeros(int(np.max(self.reg_n)) + 1, dtype=np.int64)
        for reg_n in np.unique(self.reg_n):
            table[reg_n] = len(_border_blocks(self.op, int(reg_n)))
        return table[self.reg_n]


def _border_blocks(op: Conv2dOp, reg_n: int) -> list[int]:
    sw, dw, pl = op.stride[1], op.dilation[1], op.pad[1]
    return [b for b in range(op.ow // reg_n)
            if b * reg_n * sw - pl < 0
            or ((b + 1) * reg_n - 1) * sw - pl + (op.kw - 1) * dw >= op.w]


def _at_least_1(value: Any) -> Any:
    return np.maximum(value, 1) if np.ndim(value) else max(value, 1)


def _vec_rule(p: _Plan) -> Rule:
    """The kernel splits each oc_bn block into vectors of vec lanes: vec must divide it."""
    return Rule(ok=p.oc_bn % p.vec == 0,
                message="vec {vec} does not divide the output-channel block {oc_bn}",
                values={"vec": p.vec, "oc_bn": p.oc_bn})


def _unroll_rule(p: _Plan) -> Rule:
    """The ci loop is unrolled by unroll_ci copies per step: it must divide ic_bn."""
    return Rule(ok=p.ic_bn % p.unroll_ci == 0,
                message="unroll_ci {unroll_ci} does not divide the input-channel block {ic_bn}",
                values={"unroll_ci": p.unroll_ci, "ic_bn": p.ic_bn})


def _offset(base: str, rows: int, step: int) -> str:
    """``base + rows + j * step`` in C, without the zero and unit terms."""
    terms = [t for t in (base, str(rows) if rows else "") if t]
    terms.append(f"j * {step}" if step != 1 else "j")
    return " + ".join(terms)


def _hex(e: int) -> str:
    return format(e, "x")


class _Source:
    """The kernel body, written against the prelude's macros; vec = 1 is plain floats."""

    def __init__(self, op: Conv2dOp, p: _Plan, epilogue: Epilogue, extra: list[str],
                 io: IOLayout = IOLayout(), prologue: Prologue = Prologue()) -> None:
        self.op, self.p, self.epilogue, self.extra, self.io = op, p, epilogue, extra, io
        self.prologue = prologue

    # vector helpers: one lane is a plain float (OpenCL has no float1)
    def vtype(self) -> str:
        return "float" if self.p.vec == 1 else f"VEC_T({self.p.vec})"

    def vbcast(self, x: str) -> str:
        return x if self.p.vec == 1 else f"VBCAST({self.p.vec}, {x})"

    def vload(self, i: int, ptr: str) -> str:
        return f"{ptr}[{i}]" if self.p.vec == 1 else f"VLOAD({self.p.vec}, {i}, {ptr})"

    def vfma(self, a: str, b: str, c: str) -> str:
        return f"({a} * {b} + {c})" if self.p.vec == 1 else f"VFMA({a}, {b}, {c})"

    def velem(self, v: str, e: int) -> str:
        return v if self.p.vec == 1 else f"VELEM({v}, {_hex(e)})"

    def acc_names(self) -> list[tuple[int, int, int, str]]:
        p = self.p
        return [(i, j, v, f"acc_{i}_{j}_{v}") for i in range(p.oh_f) for j in range(p.reg_n)
                for v in range(p.nvec)]

    def prefetch_slices(self) -> int:
        """How many work-items of a channel block share out the prefetch of the next
        block's weight (``prefetch.slices``): each prefetches its slice row of taps by
        row. Prefetched so, ResNet-50's 512-channel 3x3 layers took ~0.9 ms in the model
        against ~1.15 with their weight read cold (docs/BENCHMARKS.md)."""
        p, op = self.p, self.op
        return prefetch.slices(4 * op.co * op.c * op.kh * op.kw, p.ohb * p.owb, p.kb,
                               p.oc_inner)

    def lines(self) -> list[str]:
        op, p = self.op, self.p
        sh, sw = op.stride
        pt, pl = op.pad[0], op.pad[1]
        body = [signature(ENTRY, ["data", "weight", *self.extra], "out") + " {"]
        if p.oc_inner:  # the channel blocks of one pixel block run one after another
            body.append(f"  const int kb = BLOCK_X % {p.kb}, n = BLOCK_Z;")
            body.append(f"  const int owb = (BLOCK_X / {p.kb}) * {p.wg} + THREAD_X;")
        else:
            body.append(f"  const int n = BLOCK_Z / {p.kb}, kb = BLOCK_Z % {p.kb};")
            body.append(f"  const int owb = BLOCK_X * {p.wg} + THREAD_X;")
        if p.groups_x * p.wg != p.owb:  # the last group's spare work-items
            body.append(f"  if (owb >= {p.owb}) return;")
        body += [
            f"  const int oh0 = BLOCK_Y * {p.oh_f};",
            f"  const int ow0 = owb * {p.reg_n};",
            f"  const int x0 = ow0 * {sw} - {pl};",
        ]
        for i in range(p.oh_f):
            row = f"oh0 + {i}" if i else "oh0"
            if i and p.row_tail:  # the last block's missing rows recompute the last row
                row = f"(oh0 + {i} < {op.oh} ? oh0 + {i} : {op.oh - 1})"
            body.append(f"  const int y{i} = ({row}) * {sh} - {pt};")
        block = p.cb * op.kh * op.kw * p.ic_bn * p.oc_bn
        body += [
            f"  GLOBAL const float* dn = data + n * {op.c * op.h * op.w};",
            f"  GLOBAL const float* wk = weight + kb * {block};",
        ]
        slices = self.prefetch_slices()
        if slices:
            # pq: the work-item's place among its block's
            body += [f"  const int pq = BLOCK_Y * {p.owb} + owb;",
                     *indent(prefetch.slice_start("pq", p.kb, block, slices))]
        for _, _, _, name in self.acc_names():
            body.append(f"  {self.vtype()} {name} = {self.vbcast('0.0f')};")
        # x blocks whose input window leaves the image get a copy of the reduction with
        # their x0 written in: taps that fall in the padding are left out at compile time
        branches = [(f"owb == {b}", self.reduction(b * p.reg_n * sw - pl))
                    for b in p.border_blocks]
        if len(p.border_blocks) < p.owb:
            branches.append(("", self.reduction(None)))
        if len(branches) == 1:
            body += indent(branches[0][1])
        else:
            for idx, (cond, lines) in enumerate(branches):
                if idx == len(branches) - 1:  # the last branch needs no test
                    body.append("  } else {")
                else:
                    body.append(f"  {'if' if idx == 0 else '} else if'} ({cond}) {{")
                body += indent(indent(lines))
            body.append("  }")
        body += indent(self.store())
        body.append("}")
        return body

    def reduction(self, x0: int | None) -> list[str]:
        """Loops over ic blocks, kh, kw, ic. ``x0`` None: every column of the window is
        inside the image (x0 read at run time); else the block's x0, and the taps that
        read padding are not emitted (kw is unrolled for that). Rows outside the image are
        skipped (one row per work-item) or masked to zero (tile_oh > 1)."""
        op, p = self.op, self.p
        sw = op.stride[1]
        dh, dw = op.dilation
        hw = op.h * op.w
        wstep = p.ic_bn * p.oc_bn
        slices = self.prefetch_slices()
        # NCHW[db]c data: a pixel is db floats apart, a channel 1 (within its block)
        db = self.io.data_block
        ps = db or 1
        row = op.w * ps
        rows_checked = p.check_top or p.check_bottom
        row_masked = rows_checked and p.oh_f > 1
        rows = []
        for i in range(p.oh_f):
            if not rows_checked:
                rows.append(f"const int ro{i} = (y{i} + r * {dh}) * {row};")
                continue
            rows.append(f"const int ih{i} = y{i} + r * {dh};")
            if p.oh_f == 1:
                rows.append(f"if (ih{i} < 0 || ih{i} >= {op.h}) continue;")
                rows.append(f"const int ro{i} = ih{i} * {row};")
            else:
                rows.append(f"const int rv{i} = ih{i} >= 0 && ih{i} < {op.h};")
                rows.append(f"const int ro{i} = (rv{i} ? ih{i} : 0) * {row};")
                rows.append(f"const float rm{i} = rv{i} ? 1.0f : 0.0f;")
        # channel c = cb * ic_bn + ci: plain at dn + c * hw; blocked at
        # dn + (c / db) * hw * db + c % db, simplified when one block size divides the other
        if not db:
            dc = f"dn + cb * {p.ic_bn * hw}"
            dp = f"dc + ci * {hw}"
        elif db % p.ic_bn == 0:  # an ic block lies inside one data block
            per = db // p.ic_bn
            dc = (f"dn + cb * {hw * db}" if per == 1 else
                  f"dn + (cb / {per}) * {hw * db} + (cb % {per}) * {p.ic_bn}")
            dp = "dc + ci"
        elif p.ic_bn % db == 0:  # an ic block spans whole data blocks
            dc = f"dn + cb * {p.ic_bn * hw}"
            dp = f"dc + (ci / {db}) * {hw * db} + ci % {db}"
        else:
            dc = "dn"
            dp = f"dn + ((cb * {p.ic_bn} + ci) / {db}) * {hw * db} + (cb * {p.ic_bn} + ci) % {db}"

        def kw_step(s: int | str) -> list[str]:
            out = [f"GLOBAL const float* wp = wc + (r * {op.kw} + {s}) * {wstep};"]
            cols: dict[int, str] = {}
            if x0 is None:
                xs = f"x0 + {s} * {dw}" if s != 0 else "x0"
                out.append(f"const int xs = ({xs}) * {ps};" if ps > 1 else f"const int xs = {xs};")
                cols = {j: f"xs + {j * sw * ps}" if j else "xs" for j in range(p.reg_n)}
            else:
                assert isinstance(s, int)
                for j in range(p.reg_n):
                    col = x0 + j * sw + s * dw
                    if 0 <= col < op.w:
                        cols[j] = str(col * ps)
                if not cols:
                    return []
            inner = [f"GLOBAL const float* dp = {dp};",
                     f"GLOBAL const float* wq = wp + ci * {p.oc_bn};"]
            for v in range(p.nvec):
                inner.append(f"const {self.vtype()} w{v} = {self.vload(v, 'wq')};")
            channel = f"cb * {p.ic_bn} + ci"  # for the prologue
            for i in range(p.oh_f):
                for j, col in cols.items():
                    # a row outside the image: 0 after the prologue
                    value = self.prologue.load(f"dp[ro{i} + {col}]", channel, p.vec,
                                               f"rm{i}" if row_masked else "")
                    inner.append(f"const {self.vtype()} d{i}_{j} = {value};")
            for i, j, v, name in self.acc_names():
                if j in cols:
                    inner.append(f"{name} = {self.vfma(f'd{i}_{j}', f'w{v}', name)};")
            u = p.unroll_ci
            if u == 1:
                out.append(f"for (int ci = 0; ci < {p.ic_bn}; ++ci) {{")
                out += indent(inner)
                out.append("}")
                return out
            copies: list[str] = []
            for t in range(u):
                ci = f"cu + {t}" if t else "cu"
                copies += ["{", f"  const int ci = {ci};", *indent(inner), "}"]
            if u == p.ic_bn:
                return out + ["{", "  const int cu = 0;", *indent(copies), "}"]
            out.append(f"for (int cu = 0; cu < {p.ic_bn}; cu += {u}) {{")
            out += indent(copies)
            out.append("}")
            return out

        kw_lines: list[str] = []
        if op.kw == 1:
            kw_lines = ["{", *indent(kw_step(0)), "}"]
        elif p.unroll_kw or x0 is not None:
            for s in range(op.kw):
                step = kw_step(s)
                if step:
                    kw_lines += ["{", *indent(step), "}"]
        else:
            kw_lines = [f"for (int s = 0; s < {op.kw}; ++s) {{", *indent(kw_step("s")), "}"]
        # a row's share of the slice, before the row's checks (rows outside the image too):
        # the next block's floats at this row's offset in its own block, over slices
        row_step = op.kw * wstep
        ahead = prefetch.chunk(f"wc - wk + r * {row_step}", row_step, slices) if slices else []
        r_loop = [f"for (int r = 0; r < {op.kh}; ++r) {{", *indent(ahead + rows + kw_lines),
                  "}"]
        return [
            f"for (int cb = 0; cb < {p.cb}; ++cb) {{",
            f"  GLOBAL const float* dc = {dc};",
            f"  GLOBAL const float* wc = wk + cb * {op.kh * op.kw * wstep};",
            *indent(r_loop),
            "}",
        ]

    def element(self, block: int, k: str, i: int, j: int) -> str:
        """Index of output element (n, k, oh0 + i, ow0 + j) in NCHW (``block`` 0) or in
        NCHW[block]c: the output's and the residual's layouts."""
        op = self.op
        y = f"oh0 + {i}" if i else "oh0"
        x = f"ow0 + {j}" if j else "ow0"
        if not block:
            return f"((n * {op.co} + {k}) * {op.oh} + {y}) * {op.ow} + {x}"
        return (f"(((n * {op.co // block} + ({k}) / {block}) * {op.oh} + {y}) * {op.ow} + {x})"
                f" * {block} + ({k}) % {block}")

    def store(self) -> list[str]:
        """Any output layout but NCHW[oc_bn]c: lane by lane, through the epilogue. With
        vectors of ``TILE_STORE_MIN_VEC`` lanes or more the accumulators go through a
        private tile (``private_tile``: the lanes of pixel (i, j) at ``(i * reg_n + j) *
        oc_bn``, as vec divides oc_bn) and a loop over the block's channels stores them;
        narrower ones keep one statement per lane (``store_lanes``)."""
        if self.io.out_block == self.p.oc_bn:
            return self.store_vectors()
        if self.p.vec < TILE_STORE_MIN_VEC:
            return self.store_lanes()
        op, p, io = self.op, self.p, self.io
        ob, rb = io.out_block, io.residual_block
        lines = private_tile(self.vtype(), [name for *_, name in self.acc_names()])
        body = [f"const int k = kb * {p.oc_bn} + e;", *self.store_origins(ob, rb)]
        for i in range(p.oh_f):
            o = _offset("o0", i * op.ow * (ob or 1), ob or 1)
            r = o if rb == ob else _offset("r0", i * op.ow * (rb or 1), rb or 1)
            value = self.epilogue.c_expr(
                f"tile_f[{_offset('', i * p.reg_n * p.oc_bn, p.oc_bn)} + e]", "bias[k]",
                f"residual[{r}]")
            stores = [f"for (int j = 0; j < {p.reg_n}; ++j) {{", f"  out[{o}] = {value};", "}"]
            if i and p.row_tail:
                body += [f"if (oh0 + {i} < {op.oh}) {{", *indent(stores), "}"]
            else:
                body += stores
        lines += [f"for (int e = 0; e < {p.oc_bn}; ++e) {{", *indent(body), "}"]
        return ["{", *indent(lines), "}"]

    def store_lanes(self) -> list[str]:
        """One statement per lane: the scalar code of vec 1 and 2, which LLVM's and
        PoCL's vectorisers rework, ran up to 1.2-1.6x slower on some configs (and faster
        on others) through the private tile (bench/compile_ab.py)."""
        op, p, io = self.op, self.p, self.io
        ob, rb = io.out_block, io.residual_block
        out = []
        for v in range(p.nvec):
            for e in range(p.vec):
                lines = [f"const int k = kb * {p.oc_bn} + {v * p.vec + e};",
                         *self.store_origins(ob, rb)]
                for i in range(p.oh_f):
                    stores = []
                    for j in range(p.reg_n):
                        o = f"o0 + {(i * op.ow + j) * (ob or 1)}"
                        r = o if rb == ob else f"r0 + {(i * op.ow + j) * (rb or 1)}"
                        value = self.epilogue.c_expr(self.velem(f"acc_{i}_{j}_{v}", e),
                                                     "bias[k]", f"residual[{r}]")
                        stores.append(f"out[{o}] = {value};")
                    if i and p.row_tail:
                        lines += [f"if (oh0 + {i} < {op.oh}) {{", *indent(stores), "}"]
                    else:
                        lines += stores
                out += ["{", *indent(lines), "}"]
        return out

    def store_origins(self, ob: int, rb: int) -> list[str]:
        """``o0``/``r0``: where channel k's pixel (oh0, ow0) lies in the output and (when
        blocked otherwise) the residual."""
        op = self.op
        if not ob:  # plain NCHW: rows OW apart, columns adjacent
            lines = [f"const int o0 = ((n * {op.co} + k) * {op.oh} + oh0) * {op.ow} + ow0;"]
        else:
            lines = [f"const int o0 = {self.element(ob, 'k', 0, 0)};"]
        if rb != ob:
            lines.append(f"const int r0 = {self.element(rb, 'k', 0, 0)};")
        return lines

    def store_vectors(self) -> list[str]:
        """NCHW[oc_bn]c output: a pixel's oc_bn channels are contiguous, one vector store
        per accumulator. The epilogue runs on vectors unless it has activations other
        than relu or the residual lies in another block whose vectors cannot be read as
        such (``IOLayout.residual_vectors``: plain NCHW, a block vec does not divide, vec
        1); then it is applied lane by lane before the store. A residual in another
        block that can (its producer's, where a tuned record's oc_bn differs) is read a
        vector at a time from a pointer per accumulator vector."""
        op, p, io = self.op, self.p, self.io
        bn, rb = p.oc_bn, io.residual_block
        ops = self.epilogue.ops
        base = f"(((n * {p.kb} + kb) * {op.oh} + oh0) * {op.ow} + ow0) * {bn}"
        lines = [f"GLOBAL float* po = out + {base};"]
        if "bias" in ops:
            lines.append(f"GLOBAL const float* pb = bias + kb * {bn};")
        lane_wise = (("add" in ops and rb != bn and not io.residual_vectors(p.vec))
                     or not self.epilogue.vectorizable)
        if "add" in ops and not lane_wise:
            if rb == bn:
                lines.append(f"GLOBAL const float* pr = residual + {base};")
            else:
                lines += [f"GLOBAL const float* pr{v} = residual + "
                          f"{self.element(rb, f'kb * {bn} + {v * p.vec}', 0, 0)};"
                          for v in range(p.nvec)]
        for i in range(p.oh_f):
            stores = []
            for j in range(p.reg_n):
                off = (i * op.ow + j) * bn
                for v in range(p.nvec):
                    acc = f"acc_{i}_{j}_{v}"
                    if lane_wise:
                        for e in range(p.vec):
                            k = f"kb * {bn} + {v * p.vec + e}"
                            value = self.epilogue.c_expr(
                                self.velem(acc, e), f"bias[{k}]",
                                f"residual[{self.element(rb, k, i, j)}]")
                            stores.append(f"{self.velem(acc, e)} = {value};")
                        value = acc
                    else:
                        residual = (self.vload(v, f"(pr + {off})") if rb == bn else
                                    self.vload(0, f"(pr{v} + {(i * op.ow + j) * rb})"))
                        value = self.vector_epilogue(acc, v, residual)
                    if p.vec == 1:
                        stores.append(f"po[{off + v}] = {value};")
                    else:
                        stores.append(f"VSTORE({p.vec}, {value}, {v}, po + {off});")
            if i and p.row_tail:
                lines += [f"if (oh0 + {i} < {op.oh}) {{", *indent(stores), "}"]
            else:
                lines += stores
        return ["{", *indent(lines), "}"]

    def vector_epilogue(self, value: str, v: int, residual: str) -> str:
        """The epilogue on accumulator vector ``v``: bias lanes from ``pb``, the
        residual's vector as ``residual`` loads it."""
        scalar = self.p.vec == 1  # plain floats, no vector macros

        def add(a: str, b: str) -> str:
            return f"({a} + {b})" if scalar else f"VADD({a}, {b})"

        for op in self.epilogue.ops:
            if op == "bias":
                value = add(value, self.vload(v, "pb"))
            elif op == "add":
                value = add(value, residual)
            else:
                value = (f"fmax({value}, 0.0f)" if scalar
                         else f"VMAX({value}, {self.vbcast('0.0f')})")
        return value


TEMPLATE = Conv2dNCHWc()

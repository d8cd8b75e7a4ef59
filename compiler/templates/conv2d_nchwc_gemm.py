"""``conv2d_NCHWc_gemm.x86``: any CPU convolution as an implicit GEMM over (tap, channel),
out[k][p] = sum_{r,s,c} W[k][r][s][c] X[c][p's input at tap (r, s)], with the 1x1
template's register block: ``tile_p`` flattened output pixels x ``oc_bn`` channels.

Why: the direct ``conv2d_NCHWc.x86`` blocks a row by a ``reg_n`` that must divide OW, so on
ResNet-50's 14x14 and 7x7 outputs its register block is 7 or 14 pixels (7 x 16 channels:
14 AVX2 registers of accumulators, spilling with its weights and broadcast) or 1-2 (too few
accumulator chains to keep two FMA units busy). Flat pixels take MLAS's 6 x 16 AVX2 tile
on any image; ResNet-50's strided 3x3 layers ran 1.6x onnxruntime's time on the direct
template, 1.0x on this one (docs/BENCHMARKS.md, "An implicit GEMM for the CPU").

Kernel: the 1x1 template's (``conv2d_nchwc_1x1``: work-items, accumulators, channel
steps, blocked IO, epilogue and stores are its code), with a loop over the kernel's taps
around the channel loop: per tap each pixel of the block gets one pointer (its input
pixel for that tap), so the channel loop has no index math. Padding, where a tap of some
pixel reads it: with blocked data (NCHW[db]c, what builds and trials feed) that pixel's
pointer is the zero tail of the packed weight and moves on by 0 from one data block to the
next (the others by a block), so every tap runs the same loop; selects in the loop instead
cost 1.4x on ResNet-50's 512 -> 512 stride-2 layer, whose 7x7 output has few pixels off
the border. With plain NCHW data (channels an image apart: a zero tail would be an image)
a tap where every pixel reads inside runs the plain loop, others a copy that selects 0
(the pointer clamped into the image). The taps are a loop, not written out: the source is
one or two copies of the channel step, whatever the kernel size (short compiles).
Weight packed once: [K/oc_bn][KH][KW][C][oc_bn] (a tap's channel steps one contiguous
slice), flat, then C zeros.

Workload: ``conv2d_NCHWc.x86``'s eight args, any kernel, stride, padding and dilation
(records keyed apart by template name). Knobs: the 1x1 template's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.templates.base import Epilogue, IOLayout, Prologue, log2
from compiler.templates.conv2d_nchwc import TEMPLATE as DIRECT
from compiler.templates.conv2d_nchwc_1x1 import (
    Conv2dNCHWc1x1,
    GemmPlan,
    GemmSource,
)
from compiler.templates.emit import indent
from compiler.templates.ops import Conv2dOp
from schemas import Config, Workload

ENTRY = "conv2d_nchwc_gemm_kernel"


class Conv2dNCHWcGemm(Conv2dNCHWc1x1):
    name = "conv2d_NCHWc_gemm.x86"
    entry = ENTRY
    # blocked padded taps read a block of zeros the prologue would not leave at 0
    takes_prologue = False

    def parse(self, workload: Workload) -> Conv2dOp:
        """conv2d_NCHWc.x86's eight args, any window."""
        return DIRECT.parse(workload)

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        """OIHW -> [K/oc_bn][KH][KW][C][oc_bn] (a tap's channel steps contiguous), flat,
        then C zeros: what a pixel reads at a tap in the padding (at most a data block,
        at most C)."""
        op = self.parse(workload)
        oc_bn = int(self.decode(workload, config)["tile_oc"][1])
        w = np.asarray(weight, dtype=np.float32).reshape(op.co // oc_bn, oc_bn, op.c, op.kh, op.kw)
        return np.concatenate([w.transpose(0, 3, 4, 2, 1).ravel(),
                               np.zeros(op.c, dtype=np.float32)])

    def _feature_columns(self, op: Conv2dOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        feats = super()._feature_columns(op, knobs)
        taps = op.kh * op.kw
        feats.update(
            log_taps=log2(taps),
            log_reduction_steps=log2(op.c * taps),
            log_weight_slice_bytes=log2(4 * op.c * taps * GemmPlan(op, knobs).oc_bn),
            # output pixels with a tap in the padding (it reads the zero tail, or plain
            # data selects 0 there)
            border_pixels=1.0 - _inner_pixels(op) / (op.oh * op.ow),
        )
        return feats

    def _weight_shape(self, op: Conv2dOp, p: GemmPlan) -> tuple[int, ...]:
        return (_weight_floats(op) + op.c,)

    def _source(self, op: Conv2dOp, p: GemmPlan, epilogue: Epilogue, extra: list[str],
                io: IOLayout, prologue: Prologue) -> GemmSource:
        return _TapSource(op, p, epilogue, extra, io, prologue, self.entry)


def _inner_pixels(op: Conv2dOp) -> int:
    """Output pixels whose every tap reads inside the image."""
    def inner(out: int, size: int, k: int, stride: int, pad: int, dil: int) -> int:
        return sum(1 for o in range(out)
                   if o * stride - pad >= 0 and o * stride - pad + (k - 1) * dil < size)
    return (inner(op.oh, op.h, op.kh, op.stride[0], op.pad[0], op.dilation[0])
            * inner(op.ow, op.w, op.kw, op.stride[1], op.pad[1], op.dilation[1]))


class _TapSource(GemmSource):
    """The 1x1 kernel with the reduction over taps: per tap, one pointer a pixel."""

    def reductions(self) -> list[str]:
        """The taps' loop around the 1x1 channel loop (the window: no stride-1 contiguous
        shortcut, a pixel's taps are not its neighbours' pixels)."""
        op, p = self.op, self.p
        db = self.io.data_block
        ps = db or 1  # floats between neighbouring pixels of one channel
        sh, sw = op.stride
        dh, dw = op.dilation
        padded = _inner_pixels(op) != op.oh * op.ow  # some pixel's tap reads padding
        lines = []
        if padded and db:
            lines.append(f"GLOBAL const float* zeros = weight + {_weight_floats(op)};")
        for t in range(p.tp):
            q = f"min(p0 + {t}, {p.pixels - 1})" if p.pixels % p.tp else f"p0 + {t}"
            lines += [f"const int q{t} = {q};",
                      f"const int iy{t} = (q{t} / {op.ow}) * {sh} - {op.pad[0]};",
                      f"const int ix{t} = (q{t} % {op.ow}) * {sw} - {op.pad[1]};"]
        at = {t: (f"x{t}", 0) for t in range(p.tp)}
        tap = [f"GLOBAL const float* wt = wk + (r * {op.kw} + s) * {op.c * p.oc_bn};"]
        for t in range(p.tp):
            tap.append(f"const int y{t} = iy{t} + r * {dh}, x{t}i = ix{t} + s * {dw};")
            if not padded:
                tap.append(f"GLOBAL const float* x{t} = dn + (y{t} * {op.w} + x{t}i) * {ps};")
                continue
            tap.append(f"const int v{t} = (unsigned)y{t} < {op.h}u && (unsigned)x{t}i < {op.w}u;")
            if db:  # padding reads the zeros, and stays on them from block to block
                tap.append(f"GLOBAL const float* x{t} = v{t} ? dn + (y{t} * {op.w} + x{t}i) * "
                           f"{db} : zeros;")
                if op.c > db:
                    tap.append(f"const int step{t} = v{t} ? {op.h * op.w * db} : 0;")
            else:
                tap.append(f"GLOBAL const float* x{t} = dn + (v{t} ? y{t} * {op.w} + x{t}i : 0);")
        if not padded:
            tap += self.channel_loop(at, "wt")
        elif db:
            tap += self.channel_loop(at, "wt", moves={f"x{t}": f"step{t}" for t in range(p.tp)})
        else:  # plain data: a channel is an image apart; padding masked where read
            every = " && ".join(f"v{t}" for t in range(p.tp))
            tap += [f"if ({every}) {{", *indent(self.channel_loop(at, "wt")), "} else {",
                    *indent(self.channel_loop(at, "wt", masks=True)), "}"]
        lines += [f"for (int r = 0; r < {op.kh}; ++r) {{",
                  f"  for (int s = 0; s < {op.kw}; ++s) {{",
                  *indent(indent(tap)), "  }", "}"]
        return lines


def _weight_floats(op: Conv2dOp) -> int:
    """Floats of the packed weight before its zeros."""
    return op.co * op.kh * op.kw * op.c


TEMPLATE = Conv2dNCHWcGemm()

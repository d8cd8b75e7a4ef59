"""Operator semantics shared by templates: argument parsing, shapes, FLOPs, numpy reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.templates.base import WorkloadError, int_pair, tensor_shape


class ConvWindow:
    """Output extent of a 2-D convolution window, for the conv ops' dataclasses: reads
    their fields h, w, kh, kw, stride, pad (top, left, bottom, right) and dilation. Not
    a dataclass itself, so it adds no fields (nor workload features)."""

    h: int
    w: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]

    @property
    def oh(self) -> int:
        span = (self.kh - 1) * self.dilation[0] + 1
        return (self.h + self.pad[0] + self.pad[2] - span) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        span = (self.kw - 1) * self.dilation[1] + 1
        return (self.w + self.pad[1] + self.pad[3] - span) // self.stride[1] + 1


def conv_args(args: tuple[Any, ...] | list[Any], what: str
              ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                         tuple[int, ...], tuple[int, ...]]:
    """AutoTVM's conv args [data, kernel, strides, padding, dilation, out_dtype] (float32):
    data and kernel shapes, strides, padding (t, l, b, r; 2 values mean (t, l) twice) and
    dilation. ``what`` names the operator in the count message."""
    if len(args) != 6:
        raise WorkloadError(
            f"{what} args: expected [data, kernel, strides, padding, dilation, out_dtype], "
            f"got {len(args)} items"
        )
    data, _ = tensor_shape(args[0], "args[0] (data)", 4)
    kernel, _ = tensor_shape(args[1], "args[1] (kernel)", 4)
    stride = int_pair(args[2], "args[2] (strides)")
    pad_arg = args[3]
    if isinstance(pad_arg, (list, tuple)) and len(pad_arg) == 2:
        pad_arg = [pad_arg[0], pad_arg[1], pad_arg[0], pad_arg[1]]
    pad = int_pair(pad_arg, "args[3] (padding)", length=4, minimum=0)
    dilation = int_pair(args[4], "args[4] (dilation)")
    if args[5] != "float32":
        raise WorkloadError(f"args[5] (out_dtype): {args[5]!r} is not supported (float32 only)")
    return data, kernel, stride, pad, dilation


@dataclass(frozen=True)
class Conv2dOp(ConvWindow):
    """conv2d NCHW/OIHW with AutoTVM's args: data, kernel, strides, padding, dilation, out_dtype."""

    n: int
    c: int
    h: int
    w: int
    co: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]

    @classmethod
    def from_args(cls, args: tuple[Any, ...]) -> Conv2dOp:
        (n, c, h, w), (co, ci, kh, kw), stride, pad, dilation = conv_args(args, "conv2d")
        if ci != c:
            raise WorkloadError(f"args[1] (kernel): {ci} input channels, data has {c}")
        op = cls(n, c, h, w, co, kh, kw, stride, pad, dilation)  # type: ignore[arg-type]
        if op.oh < 1 or op.ow < 1:
            raise WorkloadError(
                f"conv2d output would be {op.oh}x{op.ow}: the dilated kernel "
                f"{op.kh}x{op.kw} does not fit the padded {h}x{w} input"
            )
        return op

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        return [(self.n, self.c, self.h, self.w), (self.co, self.c, self.kh, self.kw)]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.n, self.co, self.oh, self.ow)

    @property
    def flops(self) -> int:
        return 2 * self.n * self.co * self.oh * self.ow * self.c * self.kh * self.kw

    def reference(self, data: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        return conv2d_nchw_reference(data, kernel, self.stride, self.pad, self.dilation)


def conv2d_nchw_reference(data: np.ndarray, kernel: np.ndarray, stride: tuple[int, int],
                          pad: tuple[int, int, int, int], dilation: tuple[int, int],
                          groups: int = 1, out_dtype: str = "float32") -> np.ndarray:
    """Grouped conv2d NCHW/OIHW in numpy with float64 accumulation; pad is t, l, b, r.
    Integer operands (int8) sum exactly in float64, so ``out_dtype`` int32 is exact."""
    pt, pl, pb, pr = pad
    n, c, h, w = data.shape
    co, cig, kh, kw = kernel.shape
    sh, sw = stride
    dh, dw = dilation
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    out = np.zeros((n, co, oh, ow), dtype=np.float64)
    cog = co // groups
    for g in range(groups):
        part = padded[:, g * cig:(g + 1) * cig]
        weight = kernel[g * cog:(g + 1) * cog].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * dh, kx * dw
                window = part[:, :, y0:y0 + sh * (oh - 1) + 1:sh, x0:x0 + sw * (ow - 1) + 1:sw]
                out[:, g * cog:(g + 1) * cog] += np.einsum("nchw,oc->nohw", window,
                                                           weight[:, :, ky, kx])
    return out.astype(out_dtype)


@dataclass(frozen=True)
class DenseOp:
    """dense: out[b, j] = sum_k data[b, k] * weight[j, k] (+ bias[j]); AutoTVM's args."""

    batch: int
    in_dim: int
    out_dim: int
    has_bias: bool

    @classmethod
    def from_args(cls, args: tuple[Any, ...]) -> DenseOp:
        if len(args) not in (3, 4):
            raise WorkloadError(
                f"dense args: expected [data, weight, bias or null, out_dtype], got {len(args)} items"
            )
        if len(args) == 3:  # some logs leave the bias out
            args = (args[0], args[1], None, args[2])
        (batch, in_dim), _ = tensor_shape(args[0], "args[0] (data)", 2)
        (out_dim, k), _ = tensor_shape(args[1], "args[1] (weight)", 2)
        if k != in_dim:
            raise WorkloadError(f"args[1] (weight): in_dim {k}, data has {in_dim}")
        has_bias = args[2] is not None
        if has_bias:
            (bias_dim,), _ = tensor_shape(args[2], "args[2] (bias)", 1)
            if bias_dim != out_dim:
                raise WorkloadError(f"args[2] (bias): {bias_dim} values for {out_dim} outputs")
        if args[3] not in ("float32", None):
            raise WorkloadError(f"args[3] (out_dtype): {args[3]!r} is not supported (float32 only)")
        return cls(batch, in_dim, out_dim, has_bias)

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        shapes: list[tuple[int, ...]] = [(self.batch, self.in_dim), (self.out_dim, self.in_dim)]
        if self.has_bias:
            shapes.append((self.out_dim,))
        return shapes

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.batch, self.out_dim)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.in_dim * self.out_dim

    def reference(self, data: np.ndarray, weight: np.ndarray,
                  bias: np.ndarray | None = None) -> np.ndarray:
        out = data.astype(np.float64) @ weight.astype(np.float64).T
        if bias is not None:
            out = out + bias.astype(np.float64)
        return out.astype(np.float32)

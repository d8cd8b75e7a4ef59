"""``conv2d_nchw_winograd.cuda``: AutoTVM's Winograd conv2d for GPUs (3x3, stride 1).

F(m x m, 3 x 3) with output tiles of m = 4 when the data height is a multiple of 8, else
m = 2 (TVM's ``_infer_tile_size``); alpha = m + 2 input points per tile side.

- The filter transform U = G g G^T is a constant: the compiler does it once at build time
  and the measurer before a trial (``pack_weight``), into [alpha, alpha, CI, CO].
- Stage 1 (untuned): each work-item takes one (channel, tile) input patch d of
  alpha x alpha (zero outside the padded input) and writes V = B^T d B into the scratch
  V [alpha*alpha, CI, P], P = N * nH * nW tiles.
- Stage 2 (tuned, AutoTVM's ``bgemm`` schedule): alpha^2 independent GEMMs
  M[b][co][p] = sum_ci U[b][ci][co] * V[b][ci][p]. blockIdx.z is b (``tile_b`` keeps only
  [alpha^2, 1, 1, 1]); CO splits 4-way by ``tile_y`` and P by ``tile_x`` into block /
  virtual thread / thread / inner; per outer ``tile_rc`` step the block fetches its U and
  V slices into local memory cooperatively, and each thread accumulates its registers.
- Stage 3 (untuned): each work-item takes one (channel, tile) of M, computes
  Y = A^T M A, crops it to the output and stores it through the fused epilogue.

The transform matrices are Cook-Toom's with TVM's interpolation points (0, -1, 1 for
F(2, 3); 0, -1, 1, 1/2, -2 for F(4, 3); the point at infinity last), built in float64.
FLOPs are the direct convolution's, as AutoTVM counts them, so GFLOP/s compare with
``conv2d_nchw.cuda``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache, reduce
from operator import mul
from typing import Any

import numpy as np

from compiler.templates.base import (
    Buffer,
    Epilogue,
    Kernel,
    Stage,
    Template,
    Usage,
    WorkloadError,
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
from compiler.templates.emit import (
    AUTO,
    VTHREAD,
    Unroll,
    c_float,
    indent,
    loop_nest,
    signature,
)
from compiler.templates.ops import Conv2dOp
from compiler.templates.space import ConfigError, ConfigSpace, SplitKnob
from schemas import Config, DeviceLimits, Workload

KERNEL_SIZE = 3
# Work-items per block of the two untuned transform stages: fits every GPU and PoCL.
TRANSFORM_THREADS = 64
# TVM's interpolation points (finite ones; infinity is the last) per output tile size
# (6: conv2d_NCHWc_winograd.x86's wide_tile).
POINTS = {2: (0.0, -1.0, 1.0), 4: (0.0, -1.0, 1.0, 0.5, -2.0),
          6: (0.0, -1.0, 1.0, 0.5, -0.5, 2.0, -2.0)}

ENTRY_INPUT = "winograd_input_transform"
ENTRY_GEMM = "winograd_batched_gemm"
ENTRY_OUTPUT = "winograd_output_transform"


def tile_size(height: int) -> int:
    """TVM's ``_infer_tile_size``: 4x4 output tiles when the data height is a multiple
    of 8, else 2x2."""
    return 4 if height % 8 == 0 else 2


@lru_cache(maxsize=None)
def transform_matrices(m: int, r: int = KERNEL_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A [alpha, m], B [alpha, alpha], G [alpha, r]) in float64, such that the
    correlation of a length-alpha input d with a length-r filter g is
    y = A^T [(G g) * (B^T d)] (and in 2-D, Y = A^T [(G g G^T) * (B^T d B)] A).

    Toom-Cook for the linear convolution s = h * g (deg h < m, deg g < r): evaluate both
    at the points (infinity: the leading coefficient), multiply, interpolate with the
    inverse of the Vandermonde matrix V; the correlation is its transpose,
    y = E_m^T [(E_r g) * (V^-T d)]. The diagonal of Lagrange denominators moves from B^T
    into G (as Lavin and Gray, and TVM, write them: fractions in G, small values in B).
    """
    points = POINTS[m]
    alpha = m + r - 1
    assert len(points) == alpha - 1

    def evaluation(cols: int) -> np.ndarray:
        rows = [[a ** j for j in range(cols)] for a in points]
        rows.append([0.0] * (cols - 1) + [1.0])
        return np.array(rows, dtype=np.float64)

    denominators = [reduce(mul, (a - b for b in points if b != a), 1.0) for a in points]
    if denominators[0] < 0:  # TVM's sign convention for the first row
        denominators[0] = -denominators[0]
    scale = np.array([*denominators, 1.0])
    e_m, e_r, vander = evaluation(m), evaluation(r), evaluation(alpha)
    g_mat = e_r / scale[:, None]
    b_t = np.linalg.inv(vander).T * scale[:, None]
    # B^T's exact entries are dyadic (coefficients of products of x - a over these
    # points): clear the round-off of the inversion so the kernel's constants are exact
    exact = np.round(b_t * 1024) / 1024
    assert np.abs(exact - b_t).max() < 1e-9, "B^T of these points is not dyadic"
    b_t = exact
    return e_m, b_t.T.copy(), g_mat


def check_winograd(template: str, op: Conv2dOp) -> Conv2dOp:
    """``op`` if F(m, 3) computes it (3x3 kernel, stride 1, dilation 1), else the
    WorkloadError naming ``template`` and the argument that rules it out."""
    if (op.kh, op.kw) != (KERNEL_SIZE, KERNEL_SIZE):
        raise WorkloadError(f"{template}: only 3x3 kernels are supported, "
                            f"args[1] (kernel) is {op.kh}x{op.kw}")
    if op.stride != (1, 1):
        raise WorkloadError(f"{template}: only stride 1 is supported, "
                            f"args[2] (strides) is {list(op.stride)}")
    if op.dilation != (1, 1):
        raise WorkloadError(f"{template}: only dilation 1 is supported, "
                            f"args[4] (dilation) is {list(op.dilation)}")
    return op


@dataclass(frozen=True)
class WinogradOp(Conv2dOp):
    """A 3x3 stride-1 conv2d (``Conv2dOp``) with its Winograd tiling: ``m`` output points
    per tile side."""

    m: int = 2

    @classmethod
    def from_args(cls, args: tuple[Any, ...]) -> WinogradOp:
        op = check_winograd("conv2d_nchw_winograd", Conv2dOp.from_args(args))
        fields = {f.name: getattr(op, f.name) for f in dataclasses.fields(Conv2dOp)}
        return cls(**fields, m=tile_size(op.h))

    @property
    def alpha(self) -> int:
        return self.m + KERNEL_SIZE - 1

    @property
    def n_h(self) -> int:
        return ceil_div(self.oh, self.m)

    @property
    def n_w(self) -> int:
        return ceil_div(self.ow, self.m)

    @property
    def tiles(self) -> int:
        """P: the number of (image, tile row, tile column) tiles."""
        return self.n * self.n_h * self.n_w

    @property
    def packed_shape(self) -> tuple[int, int, int, int]:
        return (self.alpha, self.alpha, self.c, self.co)

    @property
    def gemm_flops(self) -> int:
        return 2 * self.alpha * self.alpha * self.co * self.tiles * self.c


def pack_filter(op: WinogradOp, weight: np.ndarray) -> np.ndarray:
    """U = G g G^T of each (co, ci) filter, as [alpha, alpha, CI, CO] float32 (TVM's
    ``kernel_pack``), computed in float64."""
    _, _, g_mat = transform_matrices(op.m)
    if tuple(weight.shape) != (op.co, op.c, KERNEL_SIZE, KERNEL_SIZE):
        raise WorkloadError(f"weight of shape {tuple(weight.shape)}, expected "
                            f"{(op.co, op.c, KERNEL_SIZE, KERNEL_SIZE)}")
    u = np.einsum("ak,oikl,bl->abio", g_mat, weight.astype(np.float64), g_mat)
    return np.ascontiguousarray(u, dtype=np.float32)


def winograd_numpy(op: WinogradOp, data: np.ndarray, packed: np.ndarray) -> np.ndarray:
    """The three stages in numpy (float64), from the packed filter: what the kernel
    computes, for tests of the transforms."""
    a_mat, b_mat, _ = transform_matrices(op.m)
    m, alpha = op.m, op.alpha
    pt, pl = op.pad[0], op.pad[1]
    span_h, span_w = op.n_h * m + 2, op.n_w * m + 2
    padded = np.zeros((op.n, op.c, span_h, span_w))
    h_end, w_end = min(op.h, span_h - pt), min(op.w, span_w - pl)
    padded[:, :, pt:pt + h_end, pl:pl + w_end] = data[:, :, :h_end, :w_end]
    tiles = np.empty((op.n, op.c, op.n_h, op.n_w, alpha, alpha))
    for th in range(op.n_h):
        for tw in range(op.n_w):
            tiles[:, :, th, tw] = padded[:, :, th * m:th * m + alpha, tw * m:tw * m + alpha]
    v = np.einsum("ka,nchwkl,lb->abcnhw", b_mat, tiles, b_mat)
    prod = np.einsum("abio,abinhw->abonhw", packed.astype(np.float64), v)
    y = np.einsum("ai,abonhw,bj->nohiwj", a_mat, prod, a_mat)
    y = y.reshape(op.n, op.co, op.n_h * m, op.n_w * m)
    return y[:, :, :op.oh, :op.ow]


def _combine(coeffs: np.ndarray, names: list[str]) -> str:
    """sum_k coeffs[k] * names[k] as C, without the zero terms and the unit factors."""
    terms: list[str] = []
    for c, name in zip(coeffs, names):
        if c == 0:
            continue
        if c == 1:
            term, sign = name, "+"
        elif c == -1:
            term, sign = name, "-"
        else:
            term, sign = f"{c_float(abs(c))} * {name}", "+" if c > 0 else "-"
        if not terms:
            terms.append(term if sign == "+" else f"-{term}")
        else:
            terms.append(f"{sign} {term}")
    return " ".join(terms) if terms else "0.0f"


def _transform_2d(mat_t: np.ndarray, src: str, tmp: str, dst: str,
                  vtype: str = "float") -> list[str]:
    """C statements for dst = mat_t src mat_t^T over ``vtype`` values named ``{src}{i}_{j}``
    (scalars here; float vectors in ``conv2d_NCHWc_winograd.x86``)."""
    rows, inner = mat_t.shape
    out: list[str] = []
    for i in range(rows):
        for j in range(inner):
            expr = _combine(mat_t[i], [f"{src}{k}_{j}" for k in range(inner)])
            out.append(f"const {vtype} {tmp}{i}_{j} = {expr};")
    for i in range(rows):
        for j in range(rows):
            expr = _combine(mat_t[j], [f"{tmp}{i}_{k}" for k in range(inner)])
            out.append(f"const {vtype} {dst}{i}_{j} = {expr};")
    return out


class Conv2dWinograd(Template):
    name = "conv2d_nchw_winograd.cuda"
    packs_weight = True

    def parse(self, workload: Workload) -> WinogradOp:
        return WinogradOp.from_args(workload.args)

    def _space(self, op: WinogradOp) -> ConfigSpace:
        return ConfigSpace([
            SplitKnob("tile_b", op.alpha * op.alpha, 4, keep=lambda e: e[1:] == (1, 1, 1)),
            SplitKnob("tile_y", op.co, 4),
            SplitKnob("tile_x", op.tiles, 4),
            SplitKnob("tile_rc", op.c, 2),
            *unroll_knobs((0, 128, 1500)),
        ])

    def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
        """Knob values of ``config``. Two of TopHub's rocm records (rocm_v0.05.log lines
        31 and 38) carry an ``auto_unroll_max_step`` of 512 and 1024, not one of AutoTVM's
        candidates (0, 128, 1500): TVM applies such an entity as written. Such a value is
        read as the candidate that unrolls exactly the same loops of this config's
        kernel (the same source), the nearest one if several do; ConfigError if none."""
        space = self.space(workload)
        try:
            return space.decode(config)
        except ConfigError as err:
            step = config.as_dict().get("auto_unroll_max_step")
            knob = next(k for k in space.knobs if k.name == "auto_unroll_max_step")
            if not isinstance(step, int) or isinstance(step, bool) or step < 0 \
                    or step in knob.candidates:
                raise
            try:
                values = space.decode(_with_knob(config, "auto_unroll_max_step", 0))
            except ConfigError:
                raise err from None
            loops = _gemm_loops(_Tiles(self.parse(workload), values))
            explicit = bool(values["unroll_explicit"])

            def modes(max_step: int) -> list[list[str]]:
                return [Unroll(max_step, explicit).modes(nest) for nest in loops]

            same = [c for c in knob.candidates if modes(c) == modes(step)]
            if not same:
                raise ConfigError(f"auto_unroll_max_step: {step} is not one of "
                                  f"{list(knob.candidates)}, and none of them unrolls the "
                                  "same loops of this config") from None
            values["auto_unroll_max_step"] = min(
                same, key=lambda c: abs(np.log2(max(c, 1)) - np.log2(max(step, 1))))
            return values

    def pack_weight(self, workload: Workload, config: Config, weight: np.ndarray) -> np.ndarray:
        return pack_filter(self.parse(workload), weight)

    def default_config(self, workload: Workload,
                       limits: DeviceLimits | None = None) -> Config:
        """No fallback is tuned in AutoTVM for this template: 16x16 threads with 2x2
        register tiles (nearest exact splits), 8 channels per local-memory step."""
        space = self.space(workload)
        knobs = split_knobs(space)
        values: dict[str, Any] = {
            "tile_b": knobs["tile_b"].values[0],
            "tile_y": knobs["tile_y"].nearest((1, 16, 2)),
            "tile_x": knobs["tile_x"].nearest((1, 16, 2)),
            "tile_rc": knobs["tile_rc"].nearest((8,)),
            "auto_unroll_max_step": 128,
            "unroll_explicit": 1,
        }
        return space.to_config(values)

    def _usage(self, op: WinogradOp, knobs: dict[str, np.ndarray]) -> Usage:
        # the tuned GEMM's block; the transform stages use TRANSFORM_THREADS, which fit
        t = _Tiles(op, knobs)
        return Usage(threads=t.threads, threads_x=t.tx, threads_y=t.ty, threads_z=t.tz,
                     shared_bytes=t.shared_bytes, local_elements=t.acc_size,
                     local_detail=((t.vy * t.yi, "co"), (t.vx * t.xi, "tiles")),
                     grid=(t.bx, t.by, t.bz))

    def _feature_columns(self, op: WinogradOp, knobs: dict[str, np.ndarray]) -> dict[str, Any]:
        t = _Tiles(op, knobs)
        feats: dict[str, Any] = split_features(knobs, "tile_b", "tile_y", "tile_x", "tile_rc")
        blocks = t.bz * t.by * t.bx
        fetched = t.aa_size + t.bb_size
        inner_fmas = t.rci * t.acc_size
        feats.update(
            block_features(knobs, t.threads, blocks, t.acc_size, t.shared_bytes),
            log_reduction_steps=log2(t.rco),
            # the GEMM's multiply-adds per element fetched into local memory
            flops_per_shared_load=op.gemm_flops / (blocks * fetched * t.rco),
            log_vthreads=log2(t.vy * t.vx),
            log_block_outputs=log2(t.block_y * t.block_x),
            log_inner_reduction=log2(t.rci),
            log_inner_fmas=log2(inner_fmas),
            inner_unrolled=inner_unrolled(knobs, inner_fmas),
            register_reuse=t.acc_size / (t.vy * t.yi + t.vx * t.xi),
            flops_per_shared_byte=2 * t.threads * inner_fmas / t.shared_bytes,
            log_fetch_per_thread=log2(ceil_div(fetched, t.threads)),
            warp_efficiency=warp_efficiency(t.threads),
            # the share of the work left to the untuned transforms, and the GEMM's
            # multiply-adds per direct-convolution one (the Winograd saving)
            log_gemm_flops=log2(op.gemm_flops),
            gemm_flop_ratio=op.gemm_flops / op.flops,
        )
        return feats

    def _codegen(self, op: WinogradOp, knobs: dict[str, Any], epilogue: Epilogue) -> Kernel:
        t = _Tiles(op, knobs)
        extra = epilogue_buffers(epilogue, op.output_shape, 1)
        buffers = io_buffers(op.input_shapes[0], op.packed_shape, extra, op.output_shape)
        alpha2 = op.alpha * op.alpha
        scratch = (Buffer("V", (alpha2, op.c, op.tiles), role="scratch"),
                   Buffer("M", (alpha2, op.co, op.tiles), role="scratch"))
        v_arg, m_arg = len(buffers), len(buffers) + 1
        out_arg = len(buffers) - 1
        gemm_block = (t.tx, t.ty, t.tz)
        gemm_grid = (t.bx, t.by, t.bz)
        stages = (
            Stage(ENTRY_INPUT, (ceil_div(op.c * op.tiles, TRANSFORM_THREADS), 1, 1),
                  (TRANSFORM_THREADS, 1, 1), (0, v_arg)),
            Stage(ENTRY_GEMM, gemm_grid, gemm_block, (1, v_arg, m_arg)),
            Stage(ENTRY_OUTPUT, (ceil_div(op.co * op.tiles, TRANSFORM_THREADS), 1, 1),
                  (TRANSFORM_THREADS, 1, 1),
                  (m_arg, *range(2, 2 + len(extra)), out_arg)),
        )
        source = "\n".join([*_input_transform(op), "", *_batched_gemm(op, t, knobs), "",
                            *_output_transform(op, extra, epilogue)]) + "\n"
        return Kernel(
            source=source,
            entry=ENTRY_GEMM,
            grid=gemm_grid,
            block=gemm_block,
            buffers=buffers,
            dialect="",
            meta={"shared_bytes": t.shared_bytes, "threads": t.threads, "tile_size": op.m},
            stages=stages,
            scratch=scratch,
        )


def _tile_coordinates(op: WinogradOp) -> list[str]:
    return [
        f"  const int n = p / {op.n_h * op.n_w};",
        f"  const int th = (p / {op.n_w}) % {op.n_h}, tw = p % {op.n_w};",
    ]


def _input_transform(op: WinogradOp) -> list[str]:
    """Stage 1: one work-item per (ci, p); p varies fastest, so the V stores coalesce."""
    _, b_mat, _ = transform_matrices(op.m)
    alpha, total = op.alpha, op.c * op.tiles
    lines = [
        signature(ENTRY_INPUT, ["data"], "V") + " {",
        f"  const int idx = BLOCK_X * {TRANSFORM_THREADS} + THREAD_X;",
        f"  if (idx >= {total}) return;",
        f"  const int ci = idx / {op.tiles}, p = idx % {op.tiles};",
        *_tile_coordinates(op),
        f"  const int h0 = th * {op.m} - {op.pad[0]}, w0 = tw * {op.m} - {op.pad[1]};",
        f"  GLOBAL const float* src = data + (n * {op.c} + ci) * {op.h * op.w};",
    ]
    for i in range(alpha):
        lines.append(f"  const int okh{i} = h0 + {i} >= 0 && h0 + {i} < {op.h};")
    for j in range(alpha):
        lines.append(f"  const int okw{j} = w0 + {j} >= 0 && w0 + {j} < {op.w};")
    for i in range(alpha):
        for j in range(alpha):
            lines.append(f"  const float d{i}_{j} = (okh{i} && okw{j}) ? "
                         f"src[(h0 + {i}) * {op.w} + w0 + {j}] : 0.0f;")
    lines += indent(_transform_2d(b_mat.T, "d", "t", "v"))
    for i in range(alpha):
        for j in range(alpha):
            lines.append(f"  V[{(i * alpha + j) * total} + idx] = v{i}_{j};")
    lines.append("}")
    return lines


def _batched_gemm(op: WinogradOp, t: _Tiles, knobs: dict[str, Any]) -> list[str]:
    """Stage 2, AutoTVM's bgemm schedule: M[b][co][p] = sum_ci U[b][ci][co] V[b][ci][p]."""
    unroll = Unroll(knobs["auto_unroll_max_step"], bool(knobs["unroll_explicit"]))
    acc_loops, compute_loops = _gemm_loops(t)
    acc_index = f"(vy * {t.yi} + yi) * {t.vx * t.xi} + vx * {t.xi} + xi"
    local_y = f"((vy * {t.ty} + ty) * {t.yi} + yi)"
    local_x = f"((vx * {t.tx} + tx) * {t.xi} + xi)"
    body = [
        signature(ENTRY_GEMM, ["U", "V"], "M") + " {",
        f"  LOCAL float AA[{t.aa_size}];",
        f"  LOCAL float BB[{t.bb_size}];",
        f"  float acc[{t.acc_size}];",
        "  const int tx = THREAD_X, ty = THREAD_Y;",
        f"  const int tid = ty * {t.tx} + tx;",
        # tile_b is [alpha^2, 1, 1, 1]: one (eps, nu) point per block in z
        "  const int b = BLOCK_Z;",
        f"  const int y0 = BLOCK_Y * {t.block_y};",
        f"  const int x0 = BLOCK_X * {t.block_x};",
        f"  GLOBAL const float* Ub = U + b * {op.c * op.co};",
        f"  GLOBAL const float* Vb = V + b * {op.c * op.tiles};",
    ]
    body += indent(loop_nest(acc_loops, [f"acc[{acc_index}] = 0.0f;"], unroll))
    fetch = [
        "BARRIER();",
        f"for (int i = tid; i < {t.aa_size}; i += {t.threads}) {{",
        f"  AA[i] = Ub[(rco * {t.rci} + i / {t.block_y}) * {op.co} + y0 + i % {t.block_y}];",
        "}",
        f"for (int i = tid; i < {t.bb_size}; i += {t.threads}) {{",
        f"  BB[i] = Vb[(rco * {t.rci} + i / {t.block_x}) * {op.tiles} + x0 + i % {t.block_x}];",
        "}",
        "BARRIER();",
    ]
    inner = [f"acc[{acc_index}] += AA[rci * {t.block_y} + {local_y}]"
             f" * BB[rci * {t.block_x} + {local_x}];"]
    compute = loop_nest(compute_loops, inner, unroll)
    body += indent(loop_nest([("rco", t.rco, AUTO)], fetch + compute, Unroll()))
    store = [f"M[(b * {op.co} + y0 + {local_y}) * {op.tiles} + x0 + {local_x}]"
             f" = acc[{acc_index}];"]
    body += indent(loop_nest(acc_loops, store, unroll))
    body.append("}")
    return body


def _gemm_loops(t: _Tiles) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """The GEMM's loop nests the unroll knobs act on: over the register tile (zeroing
    and storing the accumulators), and the inner reduction step around it."""
    acc_loops = [("vy", t.vy, VTHREAD), ("yi", t.yi, AUTO),
                 ("vx", t.vx, VTHREAD), ("xi", t.xi, AUTO)]
    return acc_loops, [("rci", t.rci, AUTO), *acc_loops]


def _with_knob(config: Config, name: str, value: Any) -> Config:
    entity = [e.model_copy(update={"value": value}) if e.name == name else e
              for e in config.entity]
    return config.model_copy(update={"entity": tuple(entity)})


def _output_transform(op: WinogradOp, extra: list[Buffer], epilogue: Epilogue) -> list[str]:
    """Stage 3: one work-item per (co, p): Y = A^T M A, cropped, through the epilogue."""
    a_mat, _, _ = transform_matrices(op.m)
    alpha, m, total = op.alpha, op.m, op.co * op.tiles
    lines = [
        signature(ENTRY_OUTPUT, ["M", *[b.name for b in extra]], "out") + " {",
        f"  const int idx = BLOCK_X * {TRANSFORM_THREADS} + THREAD_X;",
        f"  if (idx >= {total}) return;",
        f"  const int co = idx / {op.tiles}, p = idx % {op.tiles};",
        *_tile_coordinates(op),
    ]
    for i in range(alpha):
        for j in range(alpha):
            lines.append(f"  const float m{i}_{j} = M[{(i * alpha + j) * total} + idx];")
    lines += indent(_transform_2d(a_mat.T, "m", "t", "y"))
    lines.append(f"  const int base = ((n * {op.co} + co) * {op.oh} + th * {m}) * {op.ow}"
                 f" + tw * {m};")
    crop_h, crop_w = op.oh % m != 0, op.ow % m != 0
    for i in range(m):
        for j in range(m):
            conds = ([f"th * {m} + {i} < {op.oh}"] if crop_h and i else []) + \
                    ([f"tw * {m} + {j} < {op.ow}"] if crop_w and j else [])
            value = epilogue.c_expr(f"y{i}_{j}", "bias[co]", "residual[o]")
            store = [f"const int o = base + {i * op.ow + j};", f"out[o] = {value};"]
            if conds:
                lines += [f"  if ({' && '.join(conds)}) {{", *indent(indent(store)), "  }"]
            else:
                lines += ["  {", *indent(indent(store)), "  }"]
    lines.append("}")
    return lines


class _Tiles:
    """The GEMM's tile extents a config implies, named as the schedule binds them: ints
    for one config's knobs (codegen), arrays [n] for ``ConfigSpace.columns``."""

    def __init__(self, op: WinogradOp, k: dict[str, Any]) -> None:
        self.bz, self.vz, self.tz, self.zi = factors(k["tile_b"])
        self.by, self.vy, self.ty, self.yi = factors(k["tile_y"])
        self.bx, self.vx, self.tx, self.xi = factors(k["tile_x"])
        self.rco, self.rci = factors(k["tile_rc"])
        self.block_y = self.vy * self.ty * self.yi
        self.block_x = self.vx * self.tx * self.xi
        self.threads = self.tz * self.ty * self.tx
        self.acc_size = self.vy * self.yi * self.vx * self.xi
        self.aa_size = self.rci * self.block_y
        self.bb_size = self.rci * self.block_x
        self.shared_bytes = 4 * (self.aa_size + self.bb_size)


TEMPLATE = Conv2dWinograd()

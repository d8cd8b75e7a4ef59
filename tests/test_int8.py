"""``conv2d_nchw_int8.cuda``: int8 conv2d with dp4a computes exactly what numpy computes.

Random valid configs (fixed seeds, drawn under GPU limits: 1024 threads, z <= 64, 48 KB
of shared memory, <= 64 accumulators a thread) on ResNet-50's int8 layer shapes give
numpy's int32 result exactly on PoCL through the measurer, the weight packed as the
measurer packs it; the requantize epilogues (bias + shift + relu to int8, with an int8
residual too) on a few configs; the CUDA source of the same configs compiles with nvcc
and its PTX uses dp4a. Unit tests: the weight packing, DP4A's semantics on OpenCL, and
workloads the template refuses.
A failure prints the ``tuner measure`` command line that reruns the trial.
"""

from __future__ import annotations

import random
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    GPU_LIMITS,
    NVCC,
    MeasurePool,
    assert_measured_ok,
    cuda_sources,
    describe_failures,
    draw_valid_configs,
    needs_nvcc,
    nvcc_batches,
)

from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest
from compiler.templates import Buffer, Epilogue, Kernel, WorkloadError, get_template
from compiler.templates.conv2d_nchw_int8 import pack_int8_weight
from compiler.templates.prelude import with_prelude
from schemas import Config, MeasureOptions, Workload

INT8 = "conv2d_nchw_int8.cuda"
OPTIONS = MeasureOptions(number=1, repeat=1, timeout_s=90)
CONFIGS_PER_WORKLOAD = 6


def int8_workload(c: int, hw: int, co: int, k: int, stride: int, pad: int,
                  data_dtype: str = "int8", kernel_dtype: str = "int8",
                  out_dtype: str = "int32") -> Workload:
    """A square int8 NCHW conv2d at batch 1, as TVM's int8 conv2d task writes it."""
    return Workload(template=INT8, args=[
        ["TENSOR", [1, c, hw, hw], data_dtype], ["TENSOR", [co, c, k, k], kernel_dtype],
        [stride, stride], [pad, pad, pad, pad], [1, 1], out_dtype])


# ResNet-50's layers in int8: a 3x3 of stage 2, its 1x1 expansion, a 3x3 of stage 3,
# and the stride-2 projection into stage 3
WORKLOADS: dict[str, Workload] = {
    "resnet50.res2.3x3": int8_workload(64, 56, 64, 3, 1, 1),
    "resnet50.res2.1x1.expand": int8_workload(64, 56, 256, 1, 1, 0),
    "resnet50.res3.3x3": int8_workload(128, 28, 128, 3, 1, 1),
    "resnet50.res3a.1x1s2.proj": int8_workload(256, 56, 512, 1, 2, 0),
}
# the requantize step of an int8 network: shift 10 brings the accumulators (std ~1e5
# on these layers) to int8's range with a fraction clipped, half zeroed by relu
REQUANTIZE = (
    Epilogue(("bias", "shift", "relu"), shift=10, out_dtype="int8"),
    Epilogue(("bias", "shift", "add", "relu"), shift=10, out_dtype="int8",
             residual_dtype="int8"),
    Epilogue(("bias", "add", "relu")),  # int32 output, int32 residual
)
EPILOGUE_CASE = "resnet50.res3.3x3"


@lru_cache(maxsize=None)
def draw_configs(name: str, count: int = CONFIGS_PER_WORKLOAD) -> tuple[Config, ...]:
    """Distinct configs that fit GPU_LIMITS, drawn with a seed fixed per layer."""
    return draw_valid_configs(get_template(INT8), WORKLOADS[name], name, count)


# ---- the template without a device ----

def test_registered_under_both_names() -> None:
    tmpl = get_template(INT8)
    assert tmpl.name == INT8
    assert get_template("conv2d_nchw_int8") is tmpl
    assert tmpl.packs_weight


def test_space_has_the_int8_knobs_in_order() -> None:
    tmpl = get_template(INT8)
    space = tmpl.space(WORKLOADS["resnet50.res3.3x3"])
    assert [(k.name, k.kind) for k in space.knobs] == [
        ("tile_f", "sp"), ("tile_y", "sp"), ("tile_x", "sp"), ("tile_rc", "sp"),
        ("tile_ry", "sp"), ("tile_rx", "sp"), ("auto_unroll_max_step", "ot"),
        ("unroll_explicit", "ot")]
    splits = {k.name: (k.extent, k.num_outputs) for k in space.knobs if k.kind == "sp"}
    # tile_rc splits the packed chunks of 4 input channels: 128 / 4
    assert splits == {"tile_f": (128, 4), "tile_y": (28, 4), "tile_x": (28, 4),
                      "tile_rc": (32, 2), "tile_ry": (3, 2), "tile_rx": (3, 2)}


def test_operator_shapes_flops_and_reference() -> None:
    tmpl = get_template(INT8)
    wl = WORKLOADS["resnet50.res3a.1x1s2.proj"]
    assert tmpl.input_shapes(wl) == [(1, 256, 56, 56), (512, 256, 1, 1)]
    assert tmpl.output_shape(wl) == (1, 512, 28, 28)
    assert tmpl.flops(wl) == 2 * 512 * 28 * 28 * 256
    # the reference is the exact integer convolution
    small = int8_workload(8, 5, 4, 3, 2, 1)
    arrays = tmpl.make_inputs(small, Epilogue(), np.random.default_rng(0))
    assert [a.dtype for a in arrays] == [np.int8, np.int8]
    data, weight = (a.astype(np.int64) for a in arrays)
    padded = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 4, 3, 3), dtype=np.int64)
    for y in range(3):
        for x in range(3):
            window = padded[0, :, 2 * y:2 * y + 3, 2 * x:2 * x + 3]
            want[0, :, y, x] = np.einsum("chw,ochw->o", window, weight)
    got = tmpl.reference(small, arrays)
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_requantize_reference_and_operands() -> None:
    tmpl = get_template(INT8)
    wl = int8_workload(8, 6, 4, 3, 1, 1)
    ep = REQUANTIZE[1]
    data, weight, bias, residual = tmpl.make_inputs(wl, ep, np.random.default_rng(1))
    assert (bias.dtype, bias.shape) == (np.int32, (4,))
    assert (residual.dtype, residual.shape) == (np.int8, (1, 4, 6, 6))
    acc = tmpl.reference(wl, [data, weight]).astype(np.int64) + bias.reshape(1, -1, 1, 1)
    want = np.clip(np.maximum(((acc + 512) >> 10) + residual, 0), -127, 127).astype(np.int8)
    got = tmpl.reference(wl, [data, weight, bias, residual], ep)
    assert got.dtype == np.int8 and np.array_equal(got, want)


def test_pack_weight_round_trips_bytes() -> None:
    """Word k of [o, :, y, x] holds input channels 4k..4k+3 in bytes 0..3 (little-endian)."""
    tmpl = get_template(INT8)
    wl = int8_workload(12, 8, 5, 3, 1, 1)
    weight = np.random.default_rng(2).integers(-128, 128, size=(5, 12, 3, 3), dtype=np.int8)
    packed = tmpl.pack_weight(wl, tmpl.default_config(wl), weight)
    assert packed.dtype == np.int32 and packed.shape == (5, 3, 3, 3)
    lanes = packed.astype("<i4").view(np.int8).reshape(5, 3, 3, 3, 4)
    assert np.array_equal(np.moveaxis(lanes, -1, 2).reshape(5, 12, 3, 3), weight)
    # one word by hand: channels (1, -1, 127, -128) -> bytes 01 ff 7f 80
    one = np.array([1, -1, 127, -128], dtype=np.int8).reshape(1, 4, 1, 1)
    assert int(pack_int8_weight(one)[0, 0, 0, 0]) == np.array(0x807FFF01, np.uint32).view(
        np.int32)
    # the kernel's weight buffer is the packed one
    kernel = tmpl.codegen(wl, tmpl.default_config(wl), "opencl")
    assert kernel.buffers[1] == Buffer("weight", (5, 3, 3, 3), "int32")
    assert np.array_equal(tmpl.kernel_inputs(wl, tmpl.default_config(wl),
                                             [np.zeros((1, 12, 8, 8), np.int8), weight])[1],
                          packed)


@pytest.mark.parametrize(("args", "where", "words"), [
    (int8_workload(64, 56, 64, 3, 1, 1, data_dtype="float32").args, "args[0] (data)",
     "float32"),
    (int8_workload(64, 56, 64, 3, 1, 1, kernel_dtype="float32").args, "args[1] (kernel)",
     "float32"),
    (int8_workload(3, 224, 64, 7, 2, 3).args, "args[0] (data)", "multiple of 4"),
    (int8_workload(64, 56, 64, 3, 1, 1, out_dtype="float32").args, "args[5] (out_dtype)",
     "int32"),
    (int8_workload(64, 2, 64, 5, 1, 0).args, "conv2d output", "does not fit"),
])
def test_bad_workloads_name_the_argument(args: list, where: str, words: str) -> None:
    with pytest.raises(WorkloadError) as err:
        get_template(INT8).parse(Workload(template=INT8, args=args))
    assert where in str(err.value) and words in str(err.value), str(err.value)


def test_float_stores_are_refused() -> None:
    tmpl = get_template(INT8)
    wl = WORKLOADS["resnet50.res3.3x3"]
    with pytest.raises(WorkloadError, match="float"):
        tmpl.codegen(wl, tmpl.default_config(wl), "opencl", Epilogue(out_dtype="float32"))


def test_signature_types_follow_the_epilogue() -> None:
    tmpl = get_template(INT8)
    wl = WORKLOADS["resnet50.res3.3x3"]
    k = tmpl.codegen(wl, tmpl.default_config(wl), "cuda", REQUANTIZE[1])
    head = next(line for line in k.source.splitlines() if "KERNEL void" in line)
    for param in ("const INT8_T* RESTRICT data", "const int* RESTRICT weight",
                  "const int* RESTRICT bias", "const INT8_T* RESTRICT residual",
                  "INT8_T* RESTRICT out"):
        assert param in head, head
    assert [(b.name, b.dtype) for b in k.buffers] == [
        ("data", "int8"), ("weight", "int32"), ("bias", "int32"), ("residual", "int8"),
        ("out", "int8")]
    plain = tmpl.codegen(wl, tmpl.default_config(wl), "cuda")
    assert plain.buffers[-1].dtype == "int32" and "int* RESTRICT out" in plain.source


def test_limits_features_and_default_config() -> None:
    """valid_mask agrees with check_limits; the feature names are the same on every
    workload and one row equals ``features``; the default config is in the space."""
    tmpl = get_template(INT8)
    names = None
    for name, wl in WORKLOADS.items():
        space = tmpl.space(wl)
        rows = np.array(random.Random(name).sample(range(len(space)), 200))
        mask = tmpl.valid_mask(wl, rows, GPU_LIMITS)
        assert 0 < mask.sum() < len(rows), name
        for i in rows[:40]:
            assert mask[list(rows).index(i)] == (not tmpl.check_limits(wl, space.get(int(i)),
                                                                       GPU_LIMITS))
        matrix = tmpl.feature_matrix(wl, rows)
        assert np.isfinite(matrix).all(), name
        config = space.get(int(rows[0]))
        assert np.allclose(list(tmpl.features(wl, config).values()), matrix[0])
        assert names in (None, tmpl.feature_names(wl)), name
        names = tmpl.feature_names(wl)
        default = tmpl.default_config(wl)
        tmpl.decode(wl, default)
    assert "log_inner_dp4a" in names and "flops_per_global_load" in names


# ---- DP4A on OpenCL ----

def test_dp4a_sign_extends_every_byte_on_opencl(device: Device) -> None:
    """DP4A(a, b, c) = c + sum_j int8(byte j of a) * int8(byte j of b), edge bytes
    included; INT8_T is signed."""
    rng = np.random.default_rng(3)
    edge = np.array([-128, -127, -1, 0, 1, 127], dtype=np.int8)
    lanes_a = np.concatenate([np.repeat(edge, 6 * 4)[:144].reshape(36, 4),
                              rng.integers(-128, 128, size=(220, 4), dtype=np.int8)])
    lanes_b = np.concatenate([np.tile(edge, 6 * 4)[:144].reshape(36, 4),
                              rng.integers(-128, 128, size=(220, 4), dtype=np.int8)])
    a = np.ascontiguousarray(lanes_a).view("<i4").reshape(-1).astype(np.int32)
    b = np.ascontiguousarray(lanes_b).view("<i4").reshape(-1).astype(np.int32)
    c = rng.integers(-2**30, 2**30, size=a.size, dtype=np.int32)
    bytes_ = lanes_a[:, 0].copy()
    body = ("KERNEL void dp4a_check(GLOBAL const int* RESTRICT a, GLOBAL const int* RESTRICT b,"
            " GLOBAL const int* RESTRICT c, GLOBAL const INT8_T* RESTRICT s,"
            " GLOBAL int* RESTRICT out) {\n"
            "  const int i = BLOCK_X * 64 + THREAD_X;\n"
            "  out[i] = DP4A(a[i], b[i], c[i]);\n"
            "  out[256 + i] = (int)s[i];\n"
            "}\n")
    n = a.size
    kernel = Kernel(source=with_prelude(body, "opencl"), entry="dp4a_check", grid=(n // 64, 1, 1),
                    block=(64, 1, 1), dialect="opencl",
                    buffers=(Buffer("a", (n,), "int32"), Buffer("b", (n,), "int32"),
                             Buffer("c", (n,), "int32"), Buffer("s", (n,), "int8"),
                             Buffer("out", (2 * n,), "int32", role="out")))
    program = device.build(kernel)
    bufs = [device.upload(x) for x in (a, b, c, bytes_)]
    out_buf = device.alloc((2 * n,), "int32")
    device.run(program, kernel, [*bufs, out_buf])
    got = device.download(out_buf, (2 * n,), "int32")
    want = c.astype(np.int64) + (lanes_a.astype(np.int64) * lanes_b.astype(np.int64)).sum(1)
    assert np.array_equal(got[:n], want.astype(np.int32))
    assert np.array_equal(got[n:], bytes_.astype(np.int32))


# ---- PoCL: random configs and requantize epilogues match numpy exactly ----

@pytest.mark.slow
def test_random_configs_match_numpy_exactly(measure_pool: MeasurePool) -> None:
    """24 configs over 4 layers (6 each), in one batch so both measurers stay busy."""
    requests = [MeasureRequest(INT8, WORKLOADS[name], c, OPTIONS)
                for name in WORKLOADS for c in draw_configs(name)]
    assert len(requests) >= 20
    assert_measured_ok(measure_pool, requests, "int8 configs")


@pytest.mark.slow
def test_requantize_epilogues_match_numpy_exactly(measure_pool: MeasurePool) -> None:
    """bias + shift + relu stored as int8, the same with an int8 residual added, and an
    int32 output with bias, residual and relu: three configs each."""
    wl = WORKLOADS[EPILOGUE_CASE]
    requests = [MeasureRequest(INT8, wl, c, OPTIONS, ep)
                for c in draw_configs(EPILOGUE_CASE)[:3] for ep in REQUANTIZE]
    results = measure_pool.map(requests)
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, (f"{len(failed)} of {len(results)} requantize trials failed:\n"
                        f"{describe_failures(failed)}\nepilogues, in order: "
                        f"{[req.epilogue for req, _ in failed]}")


# ---- CUDA: the sources compile with nvcc, and dp4a is in the PTX ----

def _nvcc_archs() -> set[str]:
    assert NVCC is not None
    proc = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True, timeout=60)
    return {m.replace("compute_", "sm_") for m in re.findall(r"compute_\d+", proc.stdout)}


@lru_cache(maxsize=None)
def _oldest_dp4a_arch() -> str:
    """sm_61 (the first with dp4a) where this nvcc still compiles for it; CUDA 13 dropped
    everything before sm_75, so the oldest it has stands in."""
    archs = _nvcc_archs()
    if "sm_61" in archs:
        return "sm_61"
    return min((a for a in archs if int(a[3:]) >= 61), key=lambda a: int(a[3:]))


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", ["oldest", "sm_80"])
def test_cuda_sources_compile_and_use_dp4a(tmp_path: Path, arch: str) -> None:
    """Every config of the PoCL tests (and the epilogue cases) in one .cu file, entries
    renamed _0, _1, ...: ``nvcc -ptx -arch=ARCH`` accepts it, each entry is in the PTX,
    and the PTX multiplies with dp4a (not byte arithmetic). ``oldest`` is sm_61 or, with
    an nvcc that no longer has it, the oldest arch it has."""
    arch = _oldest_dp4a_arch() if arch == "oldest" else arch
    tmpl = get_template(INT8)
    trials = [(WORKLOADS[name], c, Epilogue()) for name in WORKLOADS for c in draw_configs(name)]
    trials += [(WORKLOADS[EPILOGUE_CASE], c, ep)
               for c in draw_configs(EPILOGUE_CASE)[:3] for ep in REQUANTIZE]
    entry = "conv2d_nchw_int8_kernel"
    sources = cuda_sources(tmpl, trials, [entry])

    def nvcc(src: Path) -> subprocess.CompletedProcess[str]:
        assert NVCC is not None
        return subprocess.run([NVCC, "-ptx", f"-arch={arch}", str(src), "-o",
                               str(src.with_suffix(".ptx"))],
                              capture_output=True, text=True, timeout=600)

    problems = nvcc_batches(tmp_path, {f"int8_{arch}": sources}, [entry], nvcc)
    if problems:
        pytest.fail(f"nvcc -arch={arch} rejected:\n" + "\n".join(problems))
    ptx = (tmp_path / f"int8_{arch}.ptx").read_text()
    bodies = re.split(r"\.entry\s+", ptx)[1:]
    assert all("dp4a.s32.s32" in body for body in bodies), \
        [b.split("(")[0] for b in bodies if "dp4a.s32.s32" not in b]


def test_cuda_prelude_falls_back_below_sm_61() -> None:
    """The CUDA DP4A uses the instruction only where it exists (a guard on __CUDA_ARCH__)."""
    src = with_prelude("", "cuda")
    assert "__CUDA_ARCH__ >= 610" in src and "__dp4a(a, b, c)" in src
    assert "#define INT8_T signed char" in src

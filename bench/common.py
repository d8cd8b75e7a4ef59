"""What the benchmarks share: onnxruntime's Conv on a layer's shape, timed by the
measurer's rule, a template's default configs offered to a build as records, and the
header lines that say where the figures came from."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from compiler.templates import Epilogue, Prologue, get_template
from compiler.templates.ops import Conv2dOp
from schemas import MeasureErrorNo, MeasureResult, Record

ROOT = Path(__file__).resolve().parents[1]


# onnxruntime's intra-op threads spin on for tens of ms after a run (~40 ms of this
# process's CPU, bench/winograd.py): a kernel or model timed right after one competes with
# them for the cores, by as much as 1.5x on a whole model here
SPIN_SETTLE_S = 0.1


def empty_kernel(entry: str) -> Any:
    """A kernel that does next to nothing: what PoCL spends on any kernel (and, built
    first in a process, its library load)."""
    from compiler.templates.base import Buffer, Kernel

    return Kernel(source=f"__kernel void {entry}(__global float* o) "
                         "{ o[get_global_id(0)] = 1.0f; }",
                  entry=entry, grid=(64, 1, 1), block=(1, 1, 1),
                  buffers=(Buffer("o", (64,), role="out"),), dialect="opencl")


# independent FMA chains per work-item in ``fma_peak``: more than the FMA latency times
# the FMA ports (4 x 2 on Zen 4 and Intel's AVX-512 cores), so the ports are never idle,
# and with the multiplier within AVX2's 16 vector registers
PEAK_CHAINS = 12
PEAK_ITERS = 20000


def fma_peak(device: Any) -> float:
    """The device's float32 multiply-add rate, FLOP/s: every work-item runs
    ``PEAK_CHAINS`` independent chains of vector FMAs (the device's SIMD lanes wide) on
    registers, nothing read or written inside the loop; best of ten launches. The
    ceiling any conv kernel's direct-equivalent FLOPs can reach without doing fewer
    multiplies (Winograd does)."""
    from compiler.templates.base import Buffer, Kernel

    lanes = device.limits.simd_lanes
    if not lanes:
        raise SystemExit("the device does not say its SIMD lanes: no FMA peak to compare with")
    vtype = "float" if lanes == 1 else f"float{lanes}"
    groups = 64 * (os.cpu_count() or 1)
    source = f"""
__kernel void fma_peak(__global {vtype}* out) {{
  {vtype} acc[{PEAK_CHAINS}];
  const {vtype} a = ({vtype})(0.999f), b = ({vtype})(0.001f);
  for (int i = 0; i < {PEAK_CHAINS}; ++i) acc[i] = ({vtype})((float)(get_global_id(0) + i));
  for (int it = 0; it < {PEAK_ITERS}; ++it) {{
    #pragma unroll
    for (int i = 0; i < {PEAK_CHAINS}; ++i) acc[i] = fma(acc[i], a, b);
  }}
  {vtype} s = acc[0];
  for (int i = 1; i < {PEAK_CHAINS}; ++i) s += acc[i];
  out[get_global_id(0)] = s;
}}"""
    kernel = Kernel(source=source, entry="fma_peak", grid=(groups, 1, 1), block=(1, 1, 1),
                    buffers=(Buffer("out", (groups * lanes,), role="out"),),
                    dialect="opencl")
    program = device.build(kernel)
    buffers = [device.alloc((groups * lanes,), "float32")]
    seconds = min(device.time(program, kernel, buffers, 1) for _ in range(10))
    return groups * PEAK_CHAINS * lanes * 2 * PEAK_ITERS / seconds


# a weight this large is read from memory on every run: no cache of these VMs holds it
STREAMED_BYTES = 64 << 20
STREAM_FLOATS = 64 << 20  # 256 MB read by ``stream_bandwidth``


def stream_bandwidth(device: Any) -> float:
    """The device's read rate from memory, bytes/s: each work-item sums its contiguous
    slice of a 256 MB buffer in vectors of the device's SIMD lanes; best of five
    launches. What a layer whose weight no cache holds (``STREAMED_BYTES``) reads at most."""
    from compiler.templates.base import Buffer, Kernel

    lanes = max(1, device.limits.simd_lanes)
    vtype = "float" if lanes == 1 else f"float{lanes}"
    groups = 64 * (os.cpu_count() or 1)
    per_item = STREAM_FLOATS // lanes // groups // 4 * 4  # vectors, 4 a step
    source = f"""
__kernel void stream(__global const {vtype}* in, __global {vtype}* out) {{
  const __global {vtype}* p = in + get_global_id(0) * {per_item};
  {vtype} s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int i = 0; i < {per_item}; i += 4) {{
    s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3];
  }}
  out[get_global_id(0)] = s0 + s1 + s2 + s3;
}}"""
    kernel = Kernel(source=source, entry="stream", grid=(groups, 1, 1), block=(1, 1, 1),
                    buffers=(Buffer("in", (STREAM_FLOATS,)),
                             Buffer("out", (groups * lanes,), role="out")),
                    dialect="opencl")
    program = device.build(kernel)
    buffers = [device.upload(np.ones(STREAM_FLOATS, dtype=np.float32)),
               device.alloc((groups * lanes,), "float32")]
    seconds = min(device.time(program, kernel, buffers, 1) for _ in range(5))
    return groups * per_item * lanes * 4 / seconds


def settle() -> None:
    """Let the previous entry's threads park before the next entry's clock starts: call
    it before each timed entry of an alternating round."""
    time.sleep(SPIN_SETTLE_S)


def step_minima(modules: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Per build (a ``Module``), each step's minimum device seconds over ``rounds``
    profiles, the builds profiled in turn: in ``program.steps`` order."""
    best: dict[str, list[float]] = {label: [] for label in modules}
    for _ in range(rounds):
        for label, module in modules.items():
            seconds = [step.seconds for step in module.profile(number=1)]
            best[label] = [min(a, b) for a, b in zip(best[label], seconds)] or seconds
    return best


def onnxruntime_conv(op: Conv2dOp, weight: np.ndarray, threads: int,
                     spin: bool = True) -> Callable[[np.ndarray], Any]:
    """onnxruntime's Conv of ``op`` (weight a constant, CPUExecutionProvider, ``threads``
    intra-op threads) as a function of the data. ``spin`` False: its idle threads block
    instead of spinning, so this process's CPU seconds count only its work."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[op.kh, op.kw],
                            pads=list(op.pad), strides=list(op.stride),
                            dilations=list(op.dilation))
    graph = helper.make_graph(
        [node], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(op.input_shapes[0]))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(op.output_shape))],
        initializer=[numpy_helper.from_array(weight, name="w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return lambda data: sess.run(None, {"x": data})[0]


def offered_defaults(tasks: Iterable[Any], device: Any, templates: Iterable[str]
                     ) -> list[Record]:
    """The default config (for ``device``'s lanes) of each task of ``templates`` as a
    record of ``device`` measured fastest, so that a build reading them takes it."""
    wanted = set(templates)
    return [Record(target=device.target, workload=t.workload,
                   config=get_template(t.template).default_config(t.workload, device.limits),
                   result=MeasureResult(costs=(1e-9,), error_no=MeasureErrorNo.NO_ERROR))
            for t in tasks if t.template in wanted]


def host_seconds(call: Callable[[], Any], number: int, repeat: int,
                 min_repeat_ms: float) -> float:
    """Seconds per ``call`` by the measurer's rule: three warm-up calls, ``number`` raised
    until one repeat lasts ``min_repeat_ms``, ``repeat`` repeats, the fastest and slowest
    dropped when there are more than two, the mean of the rest."""
    for _ in range(3):
        call()
    if min_repeat_ms > 0:
        t0 = time.perf_counter()
        call()
        once = time.perf_counter() - t0
        number = max(number, math.ceil(min_repeat_ms / 1e3 / max(once, 1e-9)))
    costs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            call()
        costs.append((time.perf_counter() - t0) / number)
    if len(costs) > 2:
        costs = sorted(costs)[1:-1]
    return statistics.fmean(costs)


def git_revision() -> str:
    """The commit measured, marked when compiler/ or schemas/ differ from it."""
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "compiler", "schemas"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"git {rev}" + (" (compiler/ or schemas/ modified)" if dirty else "")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def light_model(name: str) -> Any:
    """The onnx package's light model ``name`` with its seeded random weights (the same
    weights every bench and test draws for it)."""
    import onnx

    from compiler.frontend.samples import LIGHT_MODELS, light_path, with_random_weights
    return with_random_weights(onnx.load(light_path(name)), seed=LIGHT_MODELS.index(name))


def print_header(script: str, device_name: str, extra: str = "") -> None:
    """The lines every bench's output starts with: when, the command, the host, the
    device and the commit measured (``extra`` appended to the host line)."""
    print(f"# {script}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"# command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# host: {cpu_model()}, {os.cpu_count()} CPUs | device {device_name} | "
          f"{git_revision()}{extra}")


def checked_launch(device: Any, workload: Any, config: Any, io: Any) -> Callable[[], Any]:
    """``checked_kernel``'s kernel as one launch of it, not waited on."""
    program, kernel, args = checked_kernel(device, workload, config, io)
    return lambda: device.launch(program, kernel, args)


def checked_kernel(device: Any, workload: Any, config: Any, io: Any,
                   prologue: Prologue | None = None, epilogue: Epilogue | None = None
                   ) -> tuple[Any, Any, list[Any]]:
    """``config``'s kernel built on ``device`` with activations in ``io``'s layout (and
    ``prologue`` on its data load: scales in [0.5, 1.5), shifts in [-0.5, 0.5); and
    ``epilogue`` at its store, a residual in ``io.residual_block``), run once on seeded
    operands and its output checked against numpy (SystemExit if it differs): (program,
    kernel, its buffers), for ``device.launch`` or ``device.time``."""
    from compiler.runtime.measure import max_abs_error_ok
    from compiler.templates.base import from_blocked, to_blocked
    from schemas import MeasureOptions

    template = get_template(workload.template)
    rng = np.random.default_rng(0)
    epilogue = epilogue or Epilogue()
    arrays = template.make_inputs(workload, epilogue, rng)
    prologue = prologue or Prologue()
    vectors = {op: rng.uniform(*((0.5, 1.5) if op == "scale" else (-0.5, 0.5)),
                               arrays[0].shape[1]).astype(np.float32)
               for op in prologue.vector_ops}
    kernel = template.codegen(workload, config, device.dialect, epilogue, io, prologue)
    program = device.build(kernel)
    fused = [*(arrays[2:3] if "bias" in epilogue.ops else []),
             *([to_blocked(arrays[-1], io.residual_block)] if "add" in epilogue.ops else [])]
    args = [device.upload(np.ascontiguousarray(to_blocked(arrays[0], io.data_block))),
            device.upload(template.pack_weight(workload, config, arrays[1])),
            *(device.upload(np.ascontiguousarray(a)) for a in fused),
            *(device.upload(v) for v in vectors.values()),
            device.alloc(kernel.buffers[-1].shape)]
    device.run(program, kernel, args)
    got = from_blocked(device.download(args[-1], kernel.buffers[-1].shape), io.out_block)
    want = template.reference(workload, [prologue.apply(arrays[0], vectors), *arrays[1:]],
                              epilogue)
    ok, why = max_abs_error_ok(got, want, MeasureOptions(number=1, repeat=1, min_repeat_ms=0))
    if not ok:
        raise SystemExit(f"{workload.template} {workload.args[:3]} config {config.index}: "
                         f"differs from numpy: {why}")
    return program, kernel, args


def alternating_medians(ort_seconds: Callable[[int], float], modules: dict[str, Any],
                        rounds: int) -> dict[str, float]:
    """Median seconds per run of onnxruntime (``"onnxruntime"``) and of each built module,
    timed in ``rounds`` alternating rounds of 2 runs each, each entry after ``settle``."""
    costs: dict[str, list[float]] = {"onnxruntime": [], **{k: [] for k in modules}}
    for _ in range(rounds):
        settle()
        costs["onnxruntime"].append(ort_seconds(2))
        for label, module in modules.items():
            settle()
            costs[label] += module.benchmark(number=2, repeat=1).costs
    return {k: statistics.median(v) for k, v in costs.items()}

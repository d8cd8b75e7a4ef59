"""Errors a user can cause, each with its AutoTVM error number or a message naming the field.

Acceptance: malformed or unknown input -> exit code != 0 and a message naming the field;
a config over the device limits -> error_no 1 without building; a compile failure -> 3;
a wrong result -> 5; a kernel past its time limit -> 7 (deliberately broken kernels from
``broken_templates`` show each).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # so that this process and the measuring child find the helper
    sys.path.insert(0, str(HERE))

import broken_templates  # noqa: E402
from broken_templates import TINY_DENSE_ARGS  # noqa: E402

from cli.main import app  # noqa: E402
from compiler.runtime.device import BuildError, Device, DeviceInfo  # noqa: E402
from compiler.runtime.isolate import IsolatedMeasurer  # noqa: E402
from compiler.runtime.measure import MeasureRequest, measure  # noqa: E402
from compiler.templates import Kernel  # noqa: E402
from schemas import (  # noqa: E402
    Config,
    DeviceLimits,
    MeasureErrorNo,
    MeasureOptions,
    Record,
    Target,
    Workload,
)


def _has_opencl() -> bool:
    try:
        from compiler.runtime.opencl import list_opencl_devices

        return bool(list_opencl_devices())
    except Exception:
        return False


HAS_OPENCL = _has_opencl()
needs_opencl = pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL device (PoCL) here")

FAST = MeasureOptions(number=1, repeat=1, timeout_s=60)
DENSE = "dense_small_batch.gpu"

# A small real conv2d (TopHub cuda_v0.10.log line 520: 48 -> 16 channels, 1x1, 14x14).
SMALL_CONV_ARGS: list[Any] = [
    ["TENSOR", [1, 48, 14, 14], "float32"], ["TENSOR", [16, 48, 1, 1], "float32"],
    [1, 1], [0, 0, 0, 0], [1, 1], "float32",
]
# Every output in one thread's registers: 16 * 14 * 14 = 3136 accumulators (> 1024).
HUGE_TILE_CONFIG: dict[str, Any] = {
    "index": 0, "code_hash": None,
    "entity": [
        ["tile_f", "sp", [-1, 1, 1, 16]], ["tile_y", "sp", [-1, 1, 1, 14]],
        ["tile_x", "sp", [-1, 1, 1, 14]], ["tile_rc", "sp", [-1, 1]],
        ["tile_ry", "sp", [-1, 1]], ["tile_rx", "sp", [-1, 1]],
        ["auto_unroll_max_step", "ot", 0], ["unroll_explicit", "ot", 0],
    ],
}


def dense_workload(template: str = DENSE) -> Workload:
    return Workload(template=template, args=TINY_DENSE_ARGS)


def tile_k(inner: int) -> Config:
    return Config.model_validate({"index": 0, "entity": [["tile_k", "sp", [-1, inner]]]})


class RecordingDevice(Device):
    """A device that records every build; delegates to ``inner`` or refuses to build."""

    def __init__(self, limits: DeviceLimits, inner: Device | None = None) -> None:
        self.inner = inner
        self.builds: list[Kernel] = []
        self.dialect = inner.dialect if inner else "opencl"
        self.info = DeviceInfo(spec="fake:0", name="recording device", platform="test",
                               target=Target.parse("opencl -model=fake"), limits=limits)

    def build(self, kernel: Kernel) -> Any:
        self.builds.append(kernel)
        return super().build(kernel)

    def _compile(self, source: str) -> Any:
        if self.inner is None:
            raise BuildError("fake device: no compiler")
        return self.inner._compile(source)

    def _function(self, module: Any, entry: str) -> Any:
        assert self.inner is not None
        return self.inner._function(module, entry)

    def upload(self, array: np.ndarray) -> Any:
        assert self.inner is not None
        return self.inner.upload(array)

    def alloc_bytes(self, nbytes: int) -> Any:
        assert self.inner is not None
        return self.inner.alloc_bytes(nbytes)

    def write(self, buffer: Any, array: np.ndarray) -> None:
        assert self.inner is not None
        self.inner.write(buffer, array)

    def download(self, buffer: Any, shape: tuple[int, ...],
                 dtype: str = "float32") -> np.ndarray:
        assert self.inner is not None
        return self.inner.download(buffer, shape, dtype)

    def _enqueue(self, function: Any, grid: tuple[int, int, int],
                 block: tuple[int, int, int], buffers: list[Any], timed: bool) -> Any:
        assert self.inner is not None
        return self.inner._enqueue(function, grid, block, buffers, timed)

    def synchronize(self) -> None:
        assert self.inner is not None
        self.inner.synchronize()

    def _elapsed(self, first: Any, last: Any) -> float:
        assert self.inner is not None
        return self.inner._elapsed(first, last)


@pytest.fixture(scope="module")
def opencl() -> Iterator[Device]:
    if not HAS_OPENCL:
        pytest.skip("no OpenCL device (PoCL) here")
    from compiler.runtime import open_device

    yield open_device("opencl:0")


# --- error 1: over the device limits, never built --------------------------------------


def test_over_limits_is_error_1_without_building() -> None:
    """64 threads on a device allowing 32: error 1, and build() is never called."""
    device = RecordingDevice(DeviceLimits(max_threads_per_block=32, max_thread_x=32))
    result = measure(device, MeasureRequest(DENSE, dense_workload(), tile_k(64), FAST))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert "64 threads per block > 32" in (result.error_msg or "")
    assert device.builds == []


def test_within_limits_reaches_build() -> None:
    """The same device does build a config that fits (so the spy above can see builds)."""
    device = RecordingDevice(DeviceLimits(max_threads_per_block=32, max_thread_x=32))
    result = measure(device, MeasureRequest(DENSE, dense_workload(), tile_k(16), FAST))
    assert len(device.builds) == 1
    assert result.error_no == MeasureErrorNo.COMPILE_DEVICE  # the fake has no compiler


def test_shared_memory_limit_is_error_1_without_building() -> None:
    device = RecordingDevice(DeviceLimits(max_shared_memory_per_block=64))
    result = measure(device, MeasureRequest(DENSE, dense_workload(), tile_k(32), FAST))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert "128 bytes of local memory > 64" in (result.error_msg or "")
    assert device.builds == []


@needs_opencl
def test_conv_over_real_device_limits_is_error_1_without_building(opencl: Device) -> None:
    """A TopHub-shaped conv config with 3136 accumulators per thread, on the real PoCL limits."""
    device = RecordingDevice(opencl.limits, inner=opencl)
    config = Config.model_validate(HUGE_TILE_CONFIG)
    workload = Workload(template="conv2d_nchw.cuda", args=SMALL_CONV_ARGS)
    result = measure(device, MeasureRequest("conv2d_nchw.cuda", workload, config, FAST))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert "3136 accumulators" in (result.error_msg or "")
    assert device.builds == []


@pytest.mark.parametrize(
    ("template", "args", "config", "names"),
    [
        ("no_such.template", TINY_DENSE_ARGS, tile_k(8), "no_such.template"),
        (DENSE, TINY_DENSE_ARGS, tile_k(3), "tile_k"),
        (DENSE, [["TENSOR", [1, 64], "float32"], ["TENSOR", [8, 32], "float32"], None,
                 "float32"], tile_k(8), "args[1]"),
    ],
)
def test_unknown_template_bad_config_bad_workload_are_error_1(
        template: str, args: list[Any], config: Config, names: str) -> None:
    device = RecordingDevice(DeviceLimits())
    workload = Workload(template=template, args=args)
    result = measure(device, MeasureRequest(template, workload, config, FAST))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert names in (result.error_msg or "")
    assert device.builds == []


# --- errors 3 and 5, in process ----------------------------------------------------------


@needs_opencl
def test_reference_dense_is_correct(opencl: Device) -> None:
    """The unbroken template with the same config passes: the breakage is what fails below."""
    result = measure(opencl, MeasureRequest(DENSE, dense_workload(), tile_k(8), FAST))
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg


@needs_opencl
def test_compile_failure_is_error_3(opencl: Device) -> None:
    name = broken_templates.BROKEN_COMPILE.name
    result = measure(opencl, MeasureRequest(name, dense_workload(name), tile_k(8), FAST))
    assert result.error_no == MeasureErrorNo.COMPILE_DEVICE
    assert "device compiler failed" in (result.error_msg or "")
    assert not result.ok and result.mean_cost >= 1e9


@needs_opencl
def test_wrong_answer_is_error_5(opencl: Device) -> None:
    name = broken_templates.BROKEN_WRONG.name
    result = measure(opencl, MeasureRequest(name, dense_workload(name), tile_k(8), FAST))
    assert result.error_no == MeasureErrorNo.WRONG_ANSWER
    assert "8 of 8 outputs differ" in (result.error_msg or "")


@needs_opencl
def test_wrong_answer_unchecked_is_timed(opencl: Device) -> None:
    """With check_correctness off the same kernel times fine: error 5 comes from the check."""
    name = broken_templates.BROKEN_WRONG.name
    options = MeasureOptions(number=1, repeat=1, check_correctness=False)
    result = measure(opencl, MeasureRequest(name, dense_workload(name), tile_k(8), options))
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg


# --- errors 3, 5 and 7 through the isolated measurer -----------------------------------


@needs_opencl
def test_isolated_measurer_reports_3_5_7_and_keeps_working() -> None:
    """In a child process: compile 3, wrong 5, hang 7 (child killed), then a good trial 0."""
    options = MeasureOptions(number=1, repeat=1, timeout_s=5)

    def request(name: str) -> MeasureRequest:
        return MeasureRequest(name, dense_workload(name), tile_k(8), options)

    with IsolatedMeasurer("opencl:0", extra_modules=(broken_templates.__name__,)) as m:
        warm = m.measure(request(DENSE))
        assert warm.error_no == MeasureErrorNo.NO_ERROR, warm.error_msg
        compile_err = m.measure(request(broken_templates.BROKEN_COMPILE.name))
        assert compile_err.error_no == MeasureErrorNo.COMPILE_DEVICE, compile_err.error_msg
        wrong = m.measure(request(broken_templates.BROKEN_WRONG.name))
        assert wrong.error_no == MeasureErrorNo.WRONG_ANSWER, wrong.error_msg

        hang = m.measure(request(broken_templates.BROKEN_HANG.name))
        assert hang.error_no == MeasureErrorNo.RUN_TIMEOUT, hang.error_msg
        assert "run did not finish within 5 s" in (hang.error_msg or "")
        assert 5 <= hang.all_cost < 30

        after = m.measure(request(DENSE))
        assert after.error_no == MeasureErrorNo.NO_ERROR, after.error_msg
        # The child that hung was replaced, and the fresh one still knows the test templates.
        again = m.measure(request(broken_templates.BROKEN_WRONG.name))
        assert again.error_no == MeasureErrorNo.WRONG_ANSWER, again.error_msg


# --- the CLI: malformed or unknown input, exit != 0 and a message naming the field -------

runner = CliRunner()
CONV = "conv2d_nchw.cuda"
CONV_WL = json.dumps(SMALL_CONV_ARGS)


def _entity(**override: list[int]) -> str:
    """A conv2d config object (JSON) for SMALL_CONV_ARGS with some knobs replaced."""
    config = json.loads(json.dumps(HUGE_TILE_CONFIG))
    config["entity"] = [[n, k, override.get(n, [-1, 1, 1, 1] if len(v) == 4 else [-1, 1])]
                        if k == "sp" else [n, k, v] for n, k, v in config["entity"]]
    return json.dumps(config)


CLI_ERRORS: list[tuple[str, list[str], str, str]] = [
    ("unknown template", ["space", "nope.cuda", "--workload", CONV_WL], "TEMPLATE", "nope.cuda"),
    ("unknown template (measure)", ["measure", "nope.cuda", "--workload", CONV_WL,
                                    "--index", "0"], "TEMPLATE", "nope.cuda"),
    ("workload not JSON", ["space", CONV, "--workload", '[["TENSOR", [1, 48'], "--workload",
     "not valid JSON"),
    ("workload not a list", ["space", CONV, "--workload", '{"data": 1}'], "--workload",
     "JSON list"),
    ("workload too short", ["space", CONV, "--workload", json.dumps(SMALL_CONV_ARGS[:3])],
     "--workload", "got 3 items"),
    ("workload bad dtype", ["codegen", CONV, "--workload",
                            CONV_WL.replace('"float32"]', '"float16"]', 1), "--index", "0"],
     "--workload", "float16"),
    ("kernel bigger than padded input", ["space", CONV, "--workload", json.dumps(
        [["TENSOR", [1, 8, 2, 2], "float32"], ["TENSOR", [4, 8, 5, 5], "float32"],
         [1, 1], [1, 1, 1, 1], [1, 1], "float32"])], "--workload", "does not fit"),
    ("config not JSON", ["codegen", CONV, "--workload", CONV_WL, "--config", '{"index": 0'],
     "--config", "not valid JSON"),
    ("config negative index", ["codegen", CONV, "--workload", CONV_WL, "--config",
                               '{"index": -3, "entity": []}'], "--config", "index"),
    ("config wrong knob name", ["codegen", CONV, "--workload", CONV_WL, "--config",
                                _entity().replace("tile_rc", "tile_q")], "--config", "tile_q"),
    ("config split not dividing", ["codegen", CONV, "--workload", CONV_WL, "--config",
                                   _entity(tile_f=[-1, 1, 1, 3])], "--config", "tile_f"),
    ("measure: config wrong knob name", ["measure", CONV, "--workload", CONV_WL, "--config",
                                         _entity().replace("tile_rc", "tile_q")],
     "--config", "tile_q"),
    ("measure: config split not dividing", ["measure", CONV, "--workload", CONV_WL,
                                            "--config", _entity(tile_x=[-1, 1, 1, 5])],
     "--config", "tile_x"),
    ("index out of range (codegen)", ["codegen", CONV, "--workload", CONV_WL, "--index",
                                      "999999999"], "--index", "outside the space"),
    ("index out of range (measure)", ["measure", CONV, "--workload", CONV_WL, "--index",
                                      "-1"], "--index", "outside the space"),
    ("both config and index", ["codegen", CONV, "--workload", CONV_WL, "--index", "0",
                               "--config", _entity()], "--config", "--index"),
    ("neither config nor index", ["codegen", CONV, "--workload", CONV_WL], "--config",
     "--index"),
    ("bad dialect", ["codegen", CONV, "--workload", CONV_WL, "--index", "0", "--dialect",
                     "metal"], "--dialect", "metal"),
    ("bad target", ["measure", CONV, "--workload", CONV_WL, "--index", "0", "--target",
                    "cuda model=h200"], "--target", "model=h200"),
    ("bad epilogue", ["measure", CONV, "--workload", CONV_WL, "--index", "0", "--epilogue",
                      "bias,gelu"], "--epilogue", "gelu"),
]


@pytest.mark.parametrize(("what", "argv", "field", "detail"), CLI_ERRORS,
                         ids=[c[0] for c in CLI_ERRORS])
def test_cli_rejects_bad_input_naming_the_field(what: str, argv: list[str], field: str,
                                                detail: str) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code != 0, f"{what}: exit 0 with output {result.output!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{what}: crashed with {result.exception!r}")
    assert field in result.output, f"{what}: {result.output!r}"
    assert detail in result.output, f"{what}: {result.output!r}"
    # Rejected input never reaches a device, so no record line is printed.
    assert '"input"' not in result.output


@needs_opencl
def test_cli_measure_over_device_limits_prints_error_1_record() -> None:
    """A valid config that the device cannot run: exit 1, a record with error_no 1."""
    result = runner.invoke(app, ["measure", CONV, "--workload", CONV_WL,
                                 "--config", json.dumps(HUGE_TILE_CONFIG)])
    assert result.exit_code == 1, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("{"))
    record = Record.from_line(line)
    assert record.result.error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert "3136 accumulators" in (record.result.error_msg or "")
    assert "error_no 1 (INSTANTIATION_ERROR)" in result.output


def test_console_script_reports_on_stderr() -> None:
    """The installed ``tuner`` script: exit 2, the message on stderr, nothing on stdout."""
    import subprocess

    script = Path(sys.executable).parent / "tuner"
    if not script.exists():
        pytest.skip(f"console script not installed at {script}")
    proc = subprocess.run([str(script), "space", CONV, "--workload", "[1, 2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: --workload: not valid JSON")

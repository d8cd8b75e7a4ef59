"""`tuner tasks`, `tuner compile`, `tuner run` and `tuner tune MODEL` on a small ONNX
model (conv + bn + relu, a residual block, pooling, gemm, softmax)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from cli.main import app  # noqa: E402
from schemas import Target  # noqa: E402

runner = CliRunner()
TUNER = Path(sys.executable).with_name("tuner")
RNG = np.random.default_rng(3)


def _target() -> str | None:
    try:
        from compiler.runtime.opencl import list_opencl_devices

        devices = list_opencl_devices()
    except Exception:  # noqa: BLE001 - no pyopencl / ICD: skip
        return None
    return str(devices[0].target) if devices else None


TARGET = _target()
pytestmark = pytest.mark.skipif(TARGET is None, reason="no OpenCL device here")


def const(name: str, *shape: int, low: float = -0.5, high: float = 0.5) -> Any:
    return numpy_helper.from_array(RNG.uniform(low, high, size=shape).astype(np.float32), name)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn1"], "bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], "relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "p1"], ["a2"], "res2"),
        helper.make_node("Relu", ["a2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], "gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], "flatten"),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"], "fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], "softmax", axis=1),
    ]
    inits = [const("w1", 8, 3, 3, 3), const("g", 8, low=0.5, high=1.5), const("b", 8),
             const("m", 8), const("v", 8, low=0.5, high=1.5), const("w2", 8, 8, 3, 3),
             const("b2", 8), const("fw", 10, 8), const("fb", 10)]
    graph = helper.make_graph(
        nodes, "small_resnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path_factory.mktemp("model") / "small_resnet.onnx"
    onnx.save(model, path)
    return path


def invoke(argv: list[str]) -> Any:
    result = runner.invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def test_tasks_lists_every_conv_and_dense_with_its_workload(model_file: Path) -> None:
    result = invoke(["tasks", str(model_file), "--target", TARGET])
    assert result.exit_code == 0, result.output
    keys = [line.split(": ", 1)[1] for line in result.output.splitlines()
            if line[:1].isdigit() and ": [" in line]
    # both 3x3 stride-1 convs also get a Winograd task (the device class's) and on a CPU
    # an implicit-GEMM one: tuning covers direct, Winograd and GEMM
    cpu = Target.parse(TARGET).device_class == "cpu"
    winograd = "conv2d_NCHWc_winograd.x86" if cpu else "conv2d_nchw_winograd.cuda"
    assert len(keys) == (7 if cpu else 5)
    assert sum(f'"{winograd}"' in k for k in keys) == 2
    assert sum('"conv2d_NCHWc_gemm.x86"' in k for k in keys) == (2 if cpu else 0)
    assert (" a CPU device, so CPU templates first" if cpu else
            " a GPU device, so GPU templates first") in result.output
    conv, dense = ("conv2d_NCHWc.x86", "dense_pack.x86") if cpu else (
        "conv2d_nchw.cuda", "dense_small_batch.gpu")
    layout = ',"NCHW","NCHW"' if cpu else ""
    assert keys[0] == (f'["{conv}",[["TENSOR",[1,3,16,16],"float32"],'
                       f'["TENSOR",[8,3,3,3],"float32"],[1,1],[1,1,1,1],[1,1]{layout},'
                       '"float32"]]')
    assert keys[-1] == (f'["{dense}",[["TENSOR",[1,8],"float32"],'
                       '["TENSOR",[10,8],"float32"],null,"float32"]]')


def test_compile_prints_ir_before_and_after_and_the_report(model_file: Path) -> None:
    result = invoke(["compile", str(model_file), "--target", TARGET, "--records", "none",
                     "--print-ir"])
    assert result.exit_code == 0, result.output
    before, after = result.output.split("// after passes")
    assert "nn.batch_norm(" in before and "fused.conv2d" not in before
    assert "nn.batch_norm" not in after
    assert 'fused.conv2d(%x, %w1, %bn1.bias, epilogue=["bias", "relu"]' in after
    assert 'epilogue=["bias", "add", "relu"]' in after
    assert "3 tasks: this device 0, other device 0, default 3" in after


def test_run_writes_the_output_of_onnxruntime(model_file: Path, tmp_path: Path) -> None:
    x = RNG.uniform(0, 1, size=(1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke(["run", str(model_file), "--target", TARGET, "--records", "none",
                     "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")])
    assert result.exit_code == 0, result.output
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-6)


def test_run_rejects_an_input_of_the_wrong_shape(model_file: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    result = invoke(["run", str(model_file), "--target", TARGET, "--records", "none",
                     "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")])
    assert result.exit_code == 2
    assert "shape [1, 3, 8, 8], expected [1, 3, 16, 16]" in result.output


def test_unsupported_op_names_op_and_node(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], "squash")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "tanh.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    result = invoke(["compile", str(path), "--target", TARGET, "--records", "none"])
    assert result.exit_code == 1
    assert "Hardmax" in result.output and "squash" in result.output


@pytest.mark.skipif(not TUNER.exists(), reason="the tuner script is not installed")
def test_tune_model_then_compile_uses_this_devices_records(model_file: Path,
                                                           tmp_path: Path) -> None:
    """`tuner tune MODEL` stores records of every task; `tuner compile` then takes each
    task's config from this device, and the benchmark runs."""
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    common = ["--target", TARGET, "--database-url", url]
    proc = subprocess.run(
        [str(TUNER), "tune", str(model_file), *common, "--trials", "2", "--number", "1",
         "--repeat", "1", "--min-repeat-ms", "0", "--device", "opencl:0",
         "--verify-top", "0"],  # not about verification: tests/test_verify.py is
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 2 convs x (direct, Winograd, GEMM), dense
    assert "small_resnet.onnx: 7 tasks" in proc.stdout
    assert "job 1 done: 14 trials" in proc.stdout  # each task's default and one more
    proc = subprocess.run(
        [str(TUNER), "compile", str(model_file), *common, "--benchmark", "--number", "2",
         "--repeat", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 tasks: this device 3, other device 0, default 0" in proc.stdout
    assert "latency: mean" in proc.stdout


def test_python_api_compiler_build(model_file: Path) -> None:
    """``compiler.build(model, target, records=...)``, as the README shows it."""
    import compiler
    from compiler.records import MemorySource

    module = compiler.build(str(model_file), TARGET, records=MemorySource([]))
    x = RNG.uniform(0, 1, size=(1, 3, 16, 16)).astype(np.float32)
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(module.run({"x": x})[0], session.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-6)
    assert module.benchmark(number=2, repeat=2).mean > 0
    assert "3 tasks: this device 0, other device 0, default 3" in module.report()


def test_compile_quantize_prints_the_realized_int8_ir_and_runs(model_file: Path) -> None:
    """`tuner compile --quantize --qconfig ... --print-ir`: the rewrite (multiply, round,
    clip, cast, right_shift around an int8 conv with int32 output), then the fused int8
    kernel, then a build that runs."""
    result = invoke(["compile", str(model_file), "--target", TARGET, "--records", "none",
                     "--print-ir", "--quantize", "--qconfig", "global_scale=4",
                     "--benchmark", "--number", "1", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    _before, rest = result.output.split("// after quantize")
    realized, fused = rest.split("// after passes")
    for op in ("multiply(", "round(", "clip(", 'cast(', "right_shift("):
        assert op in realized, op
    assert 'out_dtype="int32"' in realized and "int8]" in realized and "int32]" in realized
    # global_scale 4 -> inputs scaled by 128 / 4 = 32 before rounding
    assert "multiply(%" in realized and "32f)" in realized
    assert 'store_dtype="int8"' in fused or 'epilogue=["bias", "shift"' in fused
    assert "conv2d_nchw_int8.cuda" in result.output  # the report names the int8 template
    assert "latency: mean" in result.output


def test_qconfig_without_quantize_or_with_a_bad_key_is_refused(model_file: Path) -> None:
    result = invoke(["compile", str(model_file), "--target", TARGET, "--records", "none",
                     "--qconfig", "global_scale=4"])
    assert result.exit_code == 2 and "--qconfig: needs --quantize" in result.output
    result = invoke(["compile", str(model_file), "--target", TARGET, "--records", "none",
                     "--quantize", "--qconfig", "nbit=4"])
    assert result.exit_code == 2 and "nbit" in result.output and "nbit_input" in result.output

"""Models written by today's PyTorch exporters (TorchScript at opset 17, dynamo at its
default opset) through the CLI: `tuner run` matches onnxruntime and `tuner tasks` finds
the conv2d and depthwise tasks. The fixtures and how to regenerate them:
tests/fixtures/exports/make_exports.py (torch is not a project dependency)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from cli.main import app  # noqa: E402
from compiler.runtime.device import Device  # noqa: E402
from compiler.tasks import DEPTHWISE  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "exports"
NETS = ("mobilenet_v2", "shufflenet", "efficientnet", "unet")
EXPORTERS = ("torchscript", "dynamo")
MODELS = [f"{net}.{exporter}.onnx" for net in NETS for exporter in EXPORTERS]
WITH_DEPTHWISE = {"mobilenet_v2", "shufflenet", "efficientnet"}

runner = CliRunner()


def invoke(argv: list[str]) -> Any:
    result = runner.invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


@pytest.mark.parametrize("name", MODELS)
def test_fixture_is_one_small_checked_file(name: str) -> None:
    """Self-contained (no external data) and small, as make_exports.py writes them."""
    path = FIXTURES / name
    assert path.stat().st_size < 2 * 1024 * 1024
    model = onnx.load(str(path), load_external_data=False)
    assert not any(init.data_location == onnx.TensorProto.EXTERNAL
                   for init in model.graph.initializer)
    onnx.checker.check_model(model)


@pytest.mark.parametrize("name", MODELS)
def test_run_matches_onnxruntime(name: str, device: Device, tmp_path: Path) -> None:
    path = FIXTURES / name
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    x = np.random.default_rng(7).standard_normal(inp.shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke(["run", str(path), "--target", str(device.target), "--device",
                     device.info.spec, "--records", "none", "--input", str(tmp_path / "x.npy"),
                     "--output", str(tmp_path / "y.npy")])
    assert result.exit_code == 0, result.output
    want = session.run(None, {inp.name: x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_tasks_lists_conv2d_and_depthwise(name: str, device: Device) -> None:
    result = invoke(["tasks", str(FIXTURES / name), "--target", str(device.target)])
    assert result.exit_code == 0, result.output
    keys = [line.split(": ", 1)[1] for line in result.output.splitlines()
            if line[:1].isdigit() and ": [" in line]
    templates = {key.split('"')[1] for key in keys}
    assert any("conv2d" in t and t != DEPTHWISE for t in templates), templates
    if name.split(".")[0] in WITH_DEPTHWISE:
        assert DEPTHWISE in templates, templates


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_activations_fuse_into_conv_epilogues(exporter: str) -> None:
    """ReLU6 (Clip 0..6), SiLU (x * sigmoid(x)) and HardSwish, as both exporters write
    them, end up inside the conv kernels: no activation runs as a kernel of its own."""
    from compiler.frontend import import_onnx
    from compiler.passes import optimize

    def epilogues(net: str) -> tuple[set[str], set[str]]:
        graph = optimize(import_onnx(FIXTURES / f"{net}.{exporter}.onnx"))
        ops = {n.op for n in graph.ops()}
        return ops, {op for n in graph.ops() for op in n.attrs.get("epilogue", ())}

    ops, fused = epilogues("mobilenet_v2")
    assert "clip:0.0:6.0" in fused and "clip" not in ops
    ops, fused = epilogues("efficientnet")
    assert {"silu", "hard_swish"} <= fused and "hard_swish" not in ops

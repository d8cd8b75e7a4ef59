"""Issue 15, points 7 and 8: a bare worker serves a GPU before a CPU, and
bench/gpu_check.sh runs here in its dry mode and installs nothing from the network."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.worker import default_device
from compiler.runtime.device import DeviceInfo, preferred_device
from schemas import DeviceLimits, Target

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
HELPER = ROOT / "bench" / "gpu_check.py"


def info(spec: str, target: str) -> DeviceInfo:
    return DeviceInfo(spec=spec, name=spec, platform="fake", target=Target.parse(target),
                      limits=DeviceLimits.model_validate({}))


CPU = info("opencl:0", "opencl -model=pocl-cpu")
CPU2 = info("opencl:1", "opencl -model=intel-xeon-cpu")
OPENCL_GPU = info("opencl:2", "opencl -model=nvidia-h200")
ROCM = info("opencl:3", "rocm -model=gfx90a")
CUDA = info("cuda:0", "cuda -model=h200 -arch=sm_90")
CUDA1 = info("cuda:1", "cuda -model=h100 -arch=sm_90")


@pytest.mark.parametrize(("devices", "chosen"), [
    ([CPU, OPENCL_GPU, CUDA], CUDA),  # PoCL listed first must not win
    ([CPU, CUDA1, CUDA], CUDA1),  # among CUDA devices, the first listed
    ([CPU, CPU2, OPENCL_GPU], OPENCL_GPU),  # no pycuda: an OpenCL GPU
    ([CPU, ROCM], ROCM),
    ([CPU2, CPU], CPU2),  # CPUs only: the first
    ([], None),
])
def test_preferred_device(devices: list[DeviceInfo], chosen: DeviceInfo | None) -> None:
    assert preferred_device(devices) == chosen


def test_bare_worker_serves_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import compiler.runtime

    monkeypatch.setattr(compiler.runtime, "list_devices", lambda: [CPU, OPENCL_GPU, CUDA])
    assert default_device() == "cuda:0"
    monkeypatch.setattr(compiler.runtime, "list_devices", list)
    assert default_device() is None  # opening the default device then says why

    def broken() -> list[DeviceInfo]:
        raise RuntimeError("driver crashed")

    monkeypatch.setattr(compiler.runtime, "list_devices", broken)
    assert default_device() is None


def test_dry_run_stops_at_the_first_gpu_step(tmp_path: Path) -> None:
    env = dict(os.environ, GPU_CHECK_OUT=str(tmp_path), PYTHON=sys.executable)
    env.pop("DRY_RUN", None)
    result = subprocess.run([str(SCRIPT), "--dry-run"], cwd=tmp_path, env=env,
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DRY RUN: stopping at step 'cuda', the first that needs a GPU" in result.stdout
    table = (tmp_path / "table.md").read_text()
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    assert [(s.strip(), r.strip()) for s, r in rows] == [
        ("devices", "ok"), ("plan", "ok"), ("cuda", "dry run")]
    assert (tmp_path / "resnet50.onnx").stat().st_size > 0  # the build step's model
    for step in ("limits", "recovery", "tune", "compile"):
        assert f"== {step}" not in result.stdout


def test_env_dry_run_budget_and_bad_argument(tmp_path: Path) -> None:
    env = dict(os.environ, GPU_CHECK_OUT=str(tmp_path), PYTHON=sys.executable, DRY_RUN="1")
    result = subprocess.run([str(SCRIPT)], env=env, check=False, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "DRY RUN: stopping" in result.stdout
    spent = subprocess.run([str(SCRIPT)], env=dict(env, BUDGET_S="0"), check=False, capture_output=True,
                           text=True, timeout=60)  # no time left: steps skipped, not run
    assert spent.returncode == 1 and "DRY RUN" not in spent.stdout
    assert "| devices | SKIPPED |" in (tmp_path / "table.md").read_text()
    bad = subprocess.run([str(SCRIPT), "--wet"], env=env, check=False, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 64 and "usage" in bad.stderr


def test_installs_nothing_from_the_network() -> None:
    for path in (SCRIPT, HELPER):
        text = path.read_text()
        assert not re.search(r"\b(curl|wget|git clone|apt-get|conda install)\b", text), path
        assert "pip download" not in text, path
        for line in text.splitlines():
            if re.search(r"pip3?\s+install", line):
                assert "--no-index" in line, f"{path}: {line}"

"""End to end on real models (the onnx package's light ResNet-50, VGG-19, DenseNet-121):
import, optimize, build with template default configs, run on the OpenCL device, and
compare with the shipped reference output and with onnxruntime; then again with random
weights, where a wrong fold, fusion or kernel cannot hide behind constant 0.02 weights."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_nvcc, nvcc_ptx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from compiler.build_module import Module, build  # noqa: E402
from compiler.frontend.samples import (  # noqa: E402
    LIGHT_MODELS,
    light_path,
    runner_input,
    shipped_output,
    with_random_weights,
)
from compiler.runtime import open_device  # noqa: E402
from schemas import DeviceLimits, Target  # noqa: E402

MODELS = LIGHT_MODELS
RTOL, ATOL = 1e-3, 1e-5


def model_path(name: str) -> str:
    try:
        return light_path(name)
    except FileNotFoundError as err:
        pytest.skip(str(err))


def onnxruntime_output(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    ort.set_default_logger_severity(3)  # the light models carry unused shape initializers
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@cache
def device():  # type: ignore[no-untyped-def]
    try:
        return open_device("opencl:0")
    except RuntimeError as err:
        pytest.skip(f"no OpenCL device: {err}")


def built(model: onnx.ModelProto) -> Module:
    return build(model, device=device())


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_matches_shipped_output_and_onnxruntime(name: str) -> None:
    model = onnx.load(model_path(name))
    x = runner_input(model)
    module = built(model)
    (got,) = module.run([x])
    np.testing.assert_allclose(got, shipped_output(name), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, onnxruntime_output(model, x), rtol=RTOL, atol=ATOL)
    # the passes did their work: batch-norm folded away, convs carry their epilogues
    ops = [n.op for n in module.graph.ops()]
    assert "nn.batch_norm" not in ops and "fused.conv2d" in ops
    assert all(c.source == "default" for c in module.choices)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_with_random_weights_matches_onnxruntime(name: str) -> None:
    model = with_logits(with_random_weights(onnx.load(model_path(name)),
                                            seed=MODELS.index(name)))
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, size=runner_input(model).shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})
    got = built(model).run([x])
    assert len(got) == len(want)
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)
    # Random weights without training give large logits and a near one-hot softmax,
    # which would hide small errors: the logits themselves are compared too, with the
    # absolute term scaled to their magnitude.
    for ours, theirs in zip(got[1:], want[1:]):
        assert theirs.std() > 0
        np.testing.assert_allclose(ours, theirs, rtol=RTOL,
                                   atol=ATOL * max(1.0, float(np.abs(theirs).max())))


def with_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the input of its final Softmax (the logits) as a second output."""
    from onnx import helper

    last = model.graph.node[-1]
    if last.op_type == "Softmax":
        model.graph.output.append(helper.make_tensor_value_info(last.input[0],
                                                                onnx.TensorProto.FLOAT, None))
    return model


@pytest.mark.slow
def test_resnet50_with_tophub_records_uses_the_valid_ones_and_stays_correct() -> None:
    """TVM's pretuned opencl (1080ti) and cuda logs as records on PoCL. Selected as for a
    GPU-class device (``-device=gpu``: GPU templates first), the configs valid here are
    used (as "other device"), the rest fall back, and the output still equals
    onnxruntime's. Built for PoCL as the CPU it is, none is taken: on a CPU only another
    device's record of the preferred (CPU) template counts, and these GPU configs ran
    5-100x slower here than the CPU templates' defaults (bench/default_choice.py)."""
    from compiler.build_module import lower, select_layers
    from compiler.records import OTHER_DEVICE, TOPHUB_DIR, build_report, open_source
    from compiler.runtime.executor import GraphExecutor

    if device().target.device_class != "cpu":
        pytest.skip("opencl:0 is not a CPU")
    logs = [str(TOPHUB_DIR / name) for name in ("opencl_v0.04.log", "cuda_v0.10.log")]
    model = with_random_weights(onnx.load(model_path("resnet50")), seed=11)
    x = np.random.default_rng(2).uniform(0, 1, size=runner_input(model).shape).astype(
        np.float32)
    want = onnxruntime_output(model, x)
    module = build(model, records=open_source(logs), device=device())
    assert {c.source for c in module.choices} == {"default"}
    (got,) = module.run([x])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)

    gpu = Target.parse(f"{device().target} -device=gpu")
    graph = module.graph  # optimized
    plan, tasks, choices = select_layers(graph, gpu, open_source(logs), device().limits)
    served = {c.source for c in choices}
    other = [c for c in choices if c.source == OTHER_DEVICE]
    assert other, "no TopHub record applied"
    assert {c.key for c in other} <= {"opencl", "gpu"}
    assert served <= {OTHER_DEVICE, "default"}
    for choice in other:  # every applied record is a config of the space that fits here
        template = tasks[choices.index(choice)].template
        assert choice.record is not None and choice.record.workload == choice.workload
        assert choice.template == template
    report = build_report(choices, [t.total_flops for t in tasks], gpu)
    n_other = len(other)
    n_default = len(choices) - n_other
    assert (f"{len(choices)} tasks: this device 0, other device {n_other}, "
            f"default {n_default}") in report
    (got,) = GraphExecutor(lower(graph, plan, device().dialect), device()).run([x])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@needs_nvcc
@pytest.mark.parametrize("name", MODELS)
def test_whole_model_lowers_to_cuda_that_nvcc_compiles(name: str, tmp_path: Path) -> None:
    """The program a GPU machine would run: every kernel of the model, as CUDA C."""
    from compiler.build_module import load_graph, lower, select_layers
    from compiler.passes import optimize

    target = Target.parse("cuda -model=h200 -arch=sm_90")
    graph = optimize(load_graph(model_path(name)))
    plan, _tasks, _choices = select_layers(graph, target, None, DeviceLimits())
    program = lower(graph, plan, "cuda")
    sources: dict[str, str] = {}
    for step in program.steps:
        entry = f"{step.kernel.entry}_{len(sources)}"
        sources.setdefault(step.kernel.source,
                           re.sub(rf"\b{step.kernel.entry}\b", entry, step.kernel.source))
    path = tmp_path / f"{name}.cu"
    path.write_text("\n".join(sources.values()))
    proc = nvcc_ptx(path, timeout=600)
    assert proc.returncode == 0, proc.stderr[:4000]
    entries = set(re.findall(r"\.entry\s+(\w+)", path.with_suffix(".ptx").read_text()))
    assert len(entries) == len(sources)

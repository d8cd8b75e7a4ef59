"""Every template computes what numpy computes, for random configs on real layer shapes.

Acceptance: for each template, >= 20 random valid configs on >= 5 workloads from
ResNet-50 and VGG-16 give the numpy result on PoCL (rtol 1e-4, the check inside
``measure``); fused epilogues (bias, relu, add) too; and the CUDA source of the same
configs compiles with ``nvcc -ptx -arch=sm_80``.

Configs are drawn with fixed seeds under GPU limits (1024 threads, z <= 64, 48 KB of
shared memory), so each one is a config a CUDA tuner would also try, and with at most 64
accumulators per thread: 578 of TopHub's 600 tuned conv2d configs stay within that (none
exceeds 128; test_tophub_mapping runs a larger one). Larger register tiles, up to the 1024
the default limits allow, are valid too, but PoCL took 5-60 s to compile many of them,
which would blow the time budget of this file.
A failure prints the ``tuner measure`` command line that reruns the trial.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import (
    CONV,
    DENSE_LARGE,
    DENSE_LARGE_WORKLOADS,
    DENSE_SMALL,
    DENSE_SMALL_WORKLOADS,
    NVCC_ARGS,
    RESNET50_CONV,
    VGG16_CONV,
    MeasurePool,
    describe_failures,
    needs_nvcc,
    nvcc_ptx,
)

from compiler.runtime.measure import MeasureRequest
from compiler.templates import Epilogue, get_template
from schemas import Config, DeviceLimits, MeasureOptions, Workload

CONFIGS_PER_WORKLOAD = 20
OPTIONS = MeasureOptions(number=1, repeat=1, timeout_s=90)
GPU_LIMITS = DeviceLimits(max_threads_per_block=1024, max_thread_x=1024, max_thread_y=1024,
                          max_thread_z=64, max_shared_memory_per_block=48 * 1024,
                          max_local_elements=64)

# template -> {layer name: workload}. conv: 7x7/1x1/3x3 kernels, strides 1 and 2, C from 3
# to 512, outputs 7x7 to 112x112. dense_large: only fc7 at batch 64 has AutoTVM's pruned
# space; a batch of 32 or 1000 outputs leave a knob empty, so the unpruned one is used.
SWEEP: dict[str, dict[str, Workload]] = {
    CONV: {name: {**RESNET50_CONV, **VGG16_CONV}[name]
           for name in ("resnet50.conv1.7x7s2", "resnet50.res2.1x1", "resnet50.res3a.3x3s2",
                        "resnet50.res5.3x3", "vgg16.conv5.3x3")},
    DENSE_SMALL: DENSE_SMALL_WORKLOADS,
    DENSE_LARGE: DENSE_LARGE_WORKLOADS,
}
# VGG-16 fc6 moves 400 MB of weights per trial: a sample of its 30 configs is enough.
# fc7 at batch 64 is 2 GFLOP a run (80 s for 20 configs on two cores): 8 of them.
FEWER = {(DENSE_SMALL, "vgg16.fc6.b1"): 6, (DENSE_LARGE, "vgg16.fc7.b64"): 8}

EPILOGUES = (Epilogue(("bias", "relu")), Epilogue(("bias", "add", "relu")),
             Epilogue(("relu", "add")))
EPILOGUE_CASES = {CONV: "resnet50.res4.1x1", DENSE_SMALL: "resnet50.fc.b8+bias",
                  DENSE_LARGE: "resnet50.fc.b32"}


def _workload(template: str, name: str) -> Workload:
    return {**SWEEP[template], **RESNET50_CONV, **VGG16_CONV}[name]


def _wanted(template: str, name: str) -> int:
    return FEWER.get((template, name), CONFIGS_PER_WORKLOAD)


def _valid_configs(template: str, wl: Workload) -> list[Config]:
    tmpl = get_template(template)
    space = tmpl.space(wl)
    return [c for c in map(space.get, range(len(space)))
            if not tmpl.check_limits(wl, c, GPU_LIMITS)]


@lru_cache(maxsize=None)
def draw_configs(template: str, name: str) -> tuple[Config, ...]:
    """Distinct valid configs drawn with a seed fixed per (template, layer); a space with
    no more valid configs than wanted (dense_small_batch: 11-30) is taken whole."""
    tmpl, wl, count = get_template(template), _workload(template, name), _wanted(template, name)
    if len(tmpl.space(wl)) <= 4 * count:
        valid = _valid_configs(template, wl)
        if len(valid) <= count:
            return tuple(valid)
    rng = random.Random(zlib.crc32(f"{template}/{name}".encode()))
    found: dict[int, Config] = {}
    while len(found) < count:
        config = tmpl.random_config(wl, rng, GPU_LIMITS)
        found.setdefault(config.index, config)
    return tuple(found.values())


def _sweep_cases() -> list[tuple[str, str]]:
    return [(t, name) for t, layers in SWEEP.items() for name in layers]


def test_sweep_meets_the_acceptance_bar() -> None:
    """>= 5 layers per template from both networks, each with its wanted number of
    distinct configs (or its whole valid space): guards the acceptance against edits."""
    for template, layers in SWEEP.items():
        assert len(layers) >= 5, template
        assert {n.split(".")[0] for n in layers} == {"resnet50", "vgg16"}, template
        total = 0
        for name, wl in layers.items():
            configs = draw_configs(template, name)
            assert len({c.index for c in configs}) == len(configs), (template, name)
            if len(configs) < _wanted(template, name):
                assert len(configs) == len(_valid_configs(template, wl)), (template, name)
            total += len(configs)
        assert total >= 50, (template, total)


@pytest.mark.slow
@pytest.mark.parametrize(("template", "name"), _sweep_cases())
def test_random_configs_match_numpy(measure_pool: MeasurePool, template: str, name: str) -> None:
    """Build, run and compare against numpy: one wrong index in a tile shows up here."""
    wl = _workload(template, name)
    configs = draw_configs(template, name)
    results = measure_pool.map([MeasureRequest(template, wl, c, OPTIONS) for c in configs])
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, (f"{len(failed)} of {len(results)} configs of {template} on {name} "
                        f"failed:\n{describe_failures(failed)}")


@pytest.mark.slow
@pytest.mark.parametrize("template", list(EPILOGUE_CASES))
def test_fused_epilogues_match_numpy(measure_pool: MeasurePool, template: str) -> None:
    """bias/relu/add fused in the store, in the order given (relu-then-add differs from
    add-then-relu), on three configs of each template."""
    name = EPILOGUE_CASES[template]
    wl = _workload(template, name)
    configs = draw_configs(template, name)[:3]
    requests = [MeasureRequest(template, wl, c, OPTIONS, ep) for c in configs for ep in EPILOGUES]
    results = measure_pool.map(requests)
    failed = [(req, res) for req, res in results if not res.ok]
    assert not failed, (f"{len(failed)} of {len(results)} fused trials of {template} on {name} "
                        f"failed:\n{describe_failures(failed)}")


# ---- CUDA: the same configs' sources compile with nvcc ----

@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("template", list(SWEEP))
def test_cuda_sources_compile_with_nvcc(tmp_path: Path, template: str) -> None:
    """One .cu file per workload holding all its kernels (entries renamed _0, _1, ...):
    nvcc's start-up dominates, so batching makes 100 compiles cost ~15. A failing file is
    recompiled kernel by kernel to name the configs at fault."""
    tmpl = get_template(template)
    cases: dict[str, list[tuple[Config, Epilogue]]] = {
        name: [(c, Epilogue()) for c in draw_configs(template, name)] for name in SWEEP[template]}
    fused = EPILOGUE_CASES[template]
    cases.setdefault(fused, []).extend(
        (c, ep) for c in draw_configs(template, fused)[:3] for ep in EPILOGUES)
    files: list[tuple[Path, str, Workload, list[tuple[Config, Epilogue, str]]]] = []
    for name, trials in cases.items():
        wl = _workload(template, name)
        kernels = []
        for config, ep in trials:
            k = tmpl.codegen(wl, config, dialect="cuda", epilogue=ep)
            assert k.source.count(k.entry) == 1
            kernels.append((config, ep, k.source))
            entry = k.entry
        path = tmp_path / f"{re.sub(r'[^a-z0-9]+', '_', name)}.cu"
        path.write_text("\n".join(src.replace(entry, f"{entry}_{i}")
                                  for i, (_, _, src) in enumerate(kernels)))
        files.append((path, entry, wl, kernels))

    with ThreadPoolExecutor(2) as ex:
        done = list(ex.map(nvcc_ptx, [f[0] for f in files]))

    problems = []
    for (path, entry, wl, kernels), proc in zip(files, done):
        if proc.returncode == 0:
            ptx = path.with_suffix(".ptx").read_text()
            entries = set(re.findall(rf"\.entry\s+({entry}_\d+)", ptx))
            assert entries == {f"{entry}_{i}" for i in range(len(kernels))}, path.name
            continue
        before = len(problems)
        for i, (config, ep, src) in enumerate(kernels):
            one = tmp_path / f"{path.stem}_{i}.cu"
            one.write_text(src)
            single = nvcc_ptx(one)
            if single.returncode != 0:
                problems.append(f"{template} workload {json.dumps(wl.args_json())} "
                                f"epilogue {ep.ops} config {json.dumps(config.to_json())}:\n"
                                f"{single.stderr.strip()[:2000]}")
        if len(problems) == before:
            problems.append(f"{path.name} failed but every kernel compiles alone:\n"
                            f"{proc.stderr.strip()[:2000]}")
    assert not problems, "nvcc " + " ".join(NVCC_ARGS) + " rejected:\n" + "\n".join(problems)

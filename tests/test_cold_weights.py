"""Cold weights (``MeasureOptions.enable_cpu_cache_flush``): on a CPU device a trial's
launches take copies of its weight in turn, so none finds its weight in a cache, as a
layer inside a model does not; the check and the result are as without."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compiler.runtime import measure as measuring
from compiler.runtime.device import Device, is_cpu
from compiler.runtime.measure import (
    COLD_BYTES,
    MAX_COLD_COPIES,
    MeasureRequest,
    measure,
    measure_group,
    ready_trial,
)
from compiler.templates import get_template
from schemas import MeasureOptions, Workload

DIRECT = "conv2d_NCHWc.x86"
WORKLOAD = Workload(template=DIRECT, args=[
    ["TENSOR", [1, 16, 12, 12], "float32"], ["TENSOR", [32, 16, 3, 3], "float32"], [1, 1],
    [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"])
COLD = MeasureOptions(number=5, repeat=3, min_repeat_ms=0, enable_cpu_cache_flush=True)


def request(options: MeasureOptions) -> MeasureRequest:
    config = get_template(DIRECT).default_config(WORKLOAD)
    return MeasureRequest(DIRECT, WORKLOAD, config, options)


def test_the_option_is_off_unless_asked_and_tune_asks() -> None:
    import tuner

    assert MeasureOptions().enable_cpu_cache_flush is False  # AutoTVM's default
    assert tuner.DEFAULT_MEASURE.enable_cpu_cache_flush is True


@pytest.fixture
def cpu(device: Device) -> Iterator[Device]:
    if not is_cpu(device.info):
        pytest.skip(f"{device.info.name} is not a CPU device: it times warm")
    yield device
    device.unload()


def recorded(device: Device, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The weight buffer of every launch ``device.time`` makes from now on."""
    launched: list[int] = []
    prepare = device.prepare

    def recording(program: Any, kernel: Any, buffers: list[Any]) -> Any:
        launch = prepare(program, kernel, buffers)

        def run(timed: bool = False) -> Any:
            launched.append(id(buffers[1]))
            return launch(timed)
        return run
    monkeypatch.setattr(device, "prepare", recording)
    return launched


def test_each_launch_reads_another_copy_of_the_weight(cpu: Device,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    device = cpu
    ready = ready_trial(device, request(COLD))
    weight_bytes = ready.kernel.buffers[1].nbytes
    assert len(ready.kernel.buffers) == 3  # data, weight, output: no other input
    copies = min(MAX_COLD_COPIES, math.ceil(COLD_BYTES / weight_bytes))
    assert len(ready.rotation) == copies - 1
    # the data and the output are shared; each copy's weight is a buffer of its own
    assert all(s[0] is ready.buffers[0] and s[2] is ready.buffers[2] for s in ready.rotation)
    assert len({id(s[1]) for s in [ready.buffers, *ready.rotation]}) == copies
    launched = recorded(device, monkeypatch)
    for _ in range(3):
        ready.repeat()
    # 15 launches, each on the next copy, the first on one the check did not warm
    order = [id(s[1]) for s in [ready.buffers, *ready.rotation]]
    assert launched == [order[(1 + i) % copies] for i in range(15)]
    assert max(Counter(launched).values()) == 1


def test_sizing_and_batches_go_on_round_the_copies(cpu: Device,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch that sizes ``number`` (min_repeat_ms) takes a copy of its own, and a
    repeat timed in several batches goes on round the copies from batch to batch."""
    monkeypatch.setattr(measuring, "MAX_TIMED_LAUNCHES", 2)
    launched = recorded(cpu, monkeypatch)
    ready = ready_trial(cpu, request(COLD.model_copy(update={"min_repeat_ms": 1e-6})))
    assert ready.number == 5
    ready.repeat()
    order = [id(s[1]) for s in [ready.buffers, *ready.rotation]]
    assert launched == order[1:7]  # the sizing launch, then 5 launches in 3 batches


@pytest.mark.parametrize("copies", [2, 3])
def test_few_copies_go_round_and_round(cpu: Device, monkeypatch: pytest.MonkeyPatch,
                                       copies: int) -> None:
    """With few copies the launches cycle through them (the original set among them),
    each after the set used longest ago: the sizing launch after the check's, then on
    round, across repeats and timing batches."""
    monkeypatch.setattr(measuring, "MAX_COLD_COPIES", copies)
    monkeypatch.setattr(measuring, "MAX_TIMED_LAUNCHES", 2)
    launched = recorded(cpu, monkeypatch)
    ready = ready_trial(cpu, request(COLD.model_copy(update={"min_repeat_ms": 1e-6})))
    assert len(ready.rotation) == copies - 1
    ready.repeat()
    ready.repeat()
    order = [id(s[1]) for s in [ready.buffers, *ready.rotation]]
    assert launched == [order[(1 + i) % copies] for i in range(11)]


def test_inputs_past_the_cold_bytes_get_no_copies(cpu: Device,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs of ``COLD_BYTES`` or more stay in no cache: timed on themselves alone."""
    monkeypatch.setattr(measuring, "COLD_BYTES", 1024)
    assert ready_trial(cpu, request(COLD)).rotation == []


def test_a_cold_trial_is_checked_and_timed_as_a_warm_one(cpu: Device) -> None:
    device = cpu
    cold = measure(device, request(COLD))
    warm = measure(device, request(COLD.model_copy(update={"enable_cpu_cache_flush": False})))
    assert cold.ok and warm.ok, (cold.error_msg, warm.error_msg)
    assert len(cold.costs) == len(warm.costs) == 1  # 3 repeats less the fastest and slowest
    assert ready_trial(device, request(COLD.model_copy(
        update={"enable_cpu_cache_flush": False}))).rotation == []


def test_a_records_info_says_its_weight_was_cold(cpu: Device, tmp_path: Path) -> None:
    """A record timed cold says so (``cpu_cache_flush``): what it was timed as stays
    known; one timed warm says nothing."""
    import tuner

    infos = {}
    for cold in (True, False):
        options = COLD.model_copy(update={"enable_cpu_cache_flush": cold})
        result = tuner.tune(WORKLOAD, "opencl -model=pocl-cpu", n_trial=1, tuner="random",
                            measure=options, verify_top=0,
                            database_url=f"sqlite:///{tmp_path / f'{cold}.db'}")
        assert result.best and result.best[0] is not None
        infos[cold] = result.best[0].info or {}
    assert infos[True].get("cpu_cache_flush") is True
    assert "cpu_cache_flush" not in infos[False]


def test_a_group_shares_its_copies_bytes(cpu: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members timed side by side hold ``GROUP_COLD_BYTES`` of copies between them, not
    ``COLD_BYTES`` each (16 members of a batch would hold 2 GiB): here room for two weight
    sets a member, each launched in turn."""
    weight_bytes = ready_trial(cpu, request(COLD)).kernel.buffers[1].nbytes
    members = 3
    monkeypatch.setattr(measuring, "GROUP_COLD_BYTES", members * 2 * weight_bytes)
    launched = recorded(cpu, monkeypatch)
    results = measure_group(cpu, [request(COLD)] * members)
    assert all(r is not None and r.ok for r in results), results
    assert len(launched) == members * COLD.number * COLD.repeat
    weights = Counter(launched)
    assert len(weights) == members * 2
    # each member's two sets in turn: every weight launched alike (15 launches: 8 and 7)
    assert set(weights.values()) == {8, 7}
    # alone, a trial keeps its COLD_BYTES
    assert len(ready_trial(cpu, request(COLD)).rotation) == min(
        MAX_COLD_COPIES, math.ceil(COLD_BYTES / weight_bytes)) - 1

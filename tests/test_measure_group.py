"""Verification trials timed side by side (issue 17, point 5).

A worker times a leased batch's verification trials as one group: each built and
checked against numpy, then their repeats interleaved, so a drift in the device's speed
falls on every config alike. A member that fails before it is timed reports its own
error; a group that hangs, crashes or hits a device error leaves the members it did not
finish to be measured alone, where the blame lands on the trial that caused it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # so that this process and the measuring child find the helper
    sys.path.insert(0, str(HERE))

import broken_templates
from test_errors import DENSE, dense_workload, needs_opencl, tile_k

from compiler.runtime.device import Device
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest, measure_group
from schemas import MeasureErrorNo, MeasureOptions, MeasureResult
from schemas.api import LeaseAnswer, LeasedTrial
from workers.agent import WorkerAgent

OPTIONS = MeasureOptions(number=1, repeat=3, timeout_s=5)


def request(name: str = DENSE, inner: int = 8, repeat: int = 3) -> MeasureRequest:
    return MeasureRequest(name, dense_workload(name), tile_k(inner),
                          OPTIONS.model_copy(update={"repeat": repeat}))


@needs_opencl
def test_members_are_checked_then_their_repeats_interleave_in_turned_order(
        device: Device) -> None:
    stages: list[tuple[int, str]] = []
    group = [request(inner=8), request(broken_templates.BROKEN_WRONG.name),
             request(inner=16, repeat=4), request(broken_templates.BROKEN_COMPILE.name),
             request(inner=4)]
    results = measure_group(device, group, stages.append)
    ok = [r for r in results if r is not None and r.ok]
    assert [r.error_no if r else None for r in results] == [0, 5, 0, 3, 0]
    assert [len(r.costs) for r in ok] == [1, 2, 1]  # AutoTVM drops the fastest and slowest
    assert all(r.all_cost > 0 for r in ok)
    # every member built and checked before any is timed; then a repeat of each timed
    # member a round, the round's order turned by one; the member with more repeats last
    checks = [(0, "build"), (0, "run"), (1, "build"), (1, "run"), (2, "build"), (2, "run"),
              (3, "build"), (4, "build"), (4, "run")]
    assert stages[:len(checks)] == checks
    assert stages[len(checks):] == [(0, "run"), (2, "run"), (4, "run"),
                                    (2, "run"), (4, "run"), (0, "run"),
                                    (4, "run"), (0, "run"), (2, "run"),
                                    (2, "run")]


@needs_opencl
def test_a_device_error_leaves_every_member_without_a_failure_to_measure_alone(
        device: Device) -> None:
    """The device may be unusable, and the error the group's (every member's buffers are
    alive at once): the culprit is measured again alone, where its error is its own."""
    results = measure_group(device, [request(), request(broken_templates.BROKEN_WRONG.name),
                                     request(broken_templates.BROKEN_LAUNCH.name), request()])
    assert [r.error_no if r else None for r in results] == [None, 5, None, None]


@needs_opencl
def test_isolated_group_that_hangs_is_left_to_measure_alone_and_the_child_replaced() -> None:
    with IsolatedMeasurer("opencl:0", extra_modules=(broken_templates.__name__,)) as m:
        good = m.measure_group([request(), request(inner=16)])
        assert [r.error_no if r else None for r in good] == [0, 0]
        first = m.pid
        hung = m.measure_group([request(), request(broken_templates.BROKEN_HANG.name),
                                request()])
        assert hung[0] is None and hung[2] is None  # measured alone next
        assert hung[1] is not None and hung[1].error_no == MeasureErrorNo.RUN_TIMEOUT
        assert "run did not finish within 5 s" in (hung[1].error_msg or "")
        assert m.pid is None  # killed with the hang
        refused = m.measure_group([request(), request(broken_templates.BROKEN_LAUNCH.name)])
        assert refused == [None, None]
        assert m.pid is None  # a device error replaces the child
        alone = m.measure(request(broken_templates.BROKEN_LAUNCH.name))
        assert alone.error_no == MeasureErrorNo.RUNTIME_DEVICE  # the blame, measured alone
        after = m.measure_group([request(), request(broken_templates.BROKEN_WRONG.name)])
        assert [r.error_no if r else None for r in after] == [0, 5]
        assert m.pid not in (None, first)


@needs_opencl
def test_a_members_deadline_runs_from_each_step_not_from_the_groups_start() -> None:
    """Three members whose code takes 0.8 s each to generate: ~2.4 s in all, past any
    one's 1.5 s deadline, and none is cut short: each step (a build, a check, a repeat)
    has its own."""
    slow = MeasureOptions(number=1, repeat=1, timeout_s=1.5)
    name = broken_templates.SLOW_CODEGEN.name
    group = [MeasureRequest(name, dense_workload(name), tile_k(inner), slow)
             for inner in (4, 8, 16)]
    with IsolatedMeasurer("opencl:0", extra_modules=(broken_templates.__name__,)) as m:
        m.start()
        began = time.time()
        results = m.measure_group(group)
        assert time.time() - began > 2.4
    assert [r.error_no if r else None for r in results] == [0, 0, 0]


# --- the worker: which trials go side by side ------------------------------------------


class FakeMeasurer:
    """Answers as its ``group_answer`` says and records what it was asked."""

    device_info = None

    def __init__(self, group_answer: list[int | None]) -> None:
        self.group_answer = group_answer
        self.groups: list[list[int]] = []
        self.alone: list[int] = []

    @staticmethod
    def _result(inner: int) -> MeasureResult:
        return MeasureResult(costs=(inner * 1e-3,), error_no=MeasureErrorNo.NO_ERROR,
                             all_cost=0.1)

    def prebuild(self, requests: Any, stop: Any = None) -> None:
        return None

    def measure_group(self, requests: list[MeasureRequest]) -> list[MeasureResult | None]:
        inner = [r.config.entity[0].value[1] for r in requests]
        self.groups.append(inner)
        return [self._result(i) if answer is not None else None
                for i, answer in zip(inner, self.group_answer, strict=True)]

    def measure(self, request: MeasureRequest) -> MeasureResult:
        inner = request.config.entity[0].value[1]
        self.alone.append(inner)
        return self._result(inner)

    def close(self) -> None:
        pass


class FakeApi:
    def __init__(self, trials: list[LeasedTrial]) -> None:
        self.batches = [trials]

    def lease(self, worker_id: int, batch: int, wait_s: float) -> LeaseAnswer:
        return LeaseAnswer(trials=self.batches.pop() if self.batches else [],
                           lease_seconds=60)

    def with_retries(self, *args: Any, **kwargs: Any) -> FakeApi:
        return self

    def release(self, worker_id: int, trial_ids: list[int]) -> None:
        pass


def trial(trial_id: int, inner: int, verify_round: int, config: Any = None) -> LeasedTrial:
    return LeasedTrial(trial_id=trial_id, task_id=1, template=DENSE,
                       args=list(dense_workload().args),
                       config=config or tile_k(inner).model_dump(mode="json"),
                       target="opencl", measure=OPTIONS.model_dump(mode="json"),
                       verify_round=verify_round, lease_deadline=None)


@pytest.mark.parametrize("group_answer", [[1, 1, 1], [1, None, 1]],
                         ids=["all-in-the-group", "one-left-to-measure-alone"])
def test_a_batchs_verification_trials_go_side_by_side_and_search_trials_alone(
        group_answer: list[int | None]) -> None:
    batch = [trial(1, 2, 0), trial(2, 4, 1), trial(3, 8, 1),
             trial(4, 16, 1, config={"index": -1}), trial(5, 32, 2), trial(6, 64, 0)]
    agent = WorkerAgent("http://127.0.0.1:9", None)
    fake = FakeMeasurer(group_answer)
    agent._measurer = fake  # type: ignore[assignment]
    agent._api = FakeApi(batch)  # type: ignore[assignment]
    agent.worker_id = 1
    reported: dict[int, MeasureResult] = {}

    def report(trial_id: int, result: MeasureResult, layout: str | None = None,
               cold: bool = False) -> None:
        reported[trial_id] = result

    agent._report = report  # type: ignore[method-assign]
    agent._serve(max_trials=None, idle_exit_s=0)
    # trial 4's config does not decode: reported as error 1, never measured
    assert fake.groups == [[4, 8, 32]]
    left = [inner for inner, answer in zip([4, 8, 32], group_answer, strict=True)
            if answer is None]
    assert fake.alone == [2, *left, 64]
    assert sorted(reported) == [1, 2, 3, 4, 5, 6]
    assert reported[4].error_no == MeasureErrorNo.INSTANTIATION_ERROR
    assert reported[3].costs == (8e-3,)
    assert agent.measured == 6


def test_a_worker_told_to_stop_measures_no_group() -> None:
    """Stopping (SIGTERM, Ctrl-C) before a batch's verification trials are timed: none
    is started (a group takes seconds a trial); the loop then gives the lease back."""
    agent = WorkerAgent("http://127.0.0.1:9", None)
    fake = FakeMeasurer([1, 1])
    agent._measurer = fake  # type: ignore[assignment]
    agent.stopping.set()
    requests: dict[int, MeasureRequest | MeasureResult] = {
        t.trial_id: agent._request(t) for t in (trial(1, 4, 1), trial(2, 8, 1))}
    assert agent._measure_side_by_side([trial(1, 4, 1), trial(2, 8, 1)], requests) == set()
    assert fake.groups == []


def test_a_heartbeat_that_drops_a_member_kills_the_groups_measurement() -> None:
    """The server says one of the group's trials is no longer ours: the measuring child
    is killed (the rest are then measured alone, the dropped one not at all)."""
    agent = WorkerAgent("http://127.0.0.1:9", None)
    closed: list[bool] = []
    fake = FakeMeasurer([1, 1])
    fake.close = lambda: closed.append(True)  # type: ignore[method-assign]
    agent._measurer = fake  # type: ignore[assignment]
    agent._held, agent._current = [1, 2, 3], {1, 2}
    agent._drop(3, RuntimeError("not in the group"))
    assert closed == []
    agent._drop(2, RuntimeError("requeued"))
    assert closed == [True] and agent._held == [1] and agent._no_longer_ours(2)

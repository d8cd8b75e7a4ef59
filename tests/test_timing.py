"""Device timing (issue 15, point 2), on PoCL: prepared launches bind the right buffers,
launches queued behind the hold kernel are timed, a GPU's min_repeat_ms floor raises the
launch count, and long counts are timed in batches of at most MAX_TIMED_LAUNCHES.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from test_errors import DENSE, RecordingDevice, dense_workload, needs_opencl, tile_k

from compiler.runtime import measure as measuring
from compiler.runtime.device import Device
from compiler.runtime.measure import MeasureRequest, measure, task_operands
from compiler.templates import Epilogue, get_template
from schemas import MeasureErrorNo, MeasureOptions

pytestmark = needs_opencl


@pytest.fixture(scope="module")
def device() -> Device:
    from compiler.runtime.opencl import OpenCLDevice

    return OpenCLDevice(0)


def _dense(device: Device) -> tuple[Any, Any, list[np.ndarray], Any]:
    template = get_template(DENSE)
    workload, config = dense_workload(DENSE), tile_k(8)
    kernel = template.codegen(workload, config, device.dialect)
    arrays, reference = task_operands(DENSE, workload, Epilogue(), 0)
    return kernel, device.build(kernel), template.kernel_inputs(workload, config, arrays), \
        reference()


def test_prepared_launches_rebind_other_buffers(device: Device) -> None:
    """One kernel object launched on (a1, out1), (a2, out2), then (a1, out2): each output
    holds its own inputs' result, though arguments are set only when they change."""
    kernel, program, inputs, reference = _dense(device)
    out = kernel.buffers[-1]
    first = [device.upload(a) for a in inputs]
    second = [device.upload(-a) for a in inputs[:1]] + first[1:]  # -x: -(x W^T)
    outs = [device.alloc(out.shape, out.dtype) for _ in range(2)]
    device.run(program, kernel, [*first, outs[0]])
    device.run(program, kernel, [*second, outs[1]])
    np.testing.assert_allclose(device.download(outs[0], out.shape), reference, rtol=1e-4)
    np.testing.assert_allclose(device.download(outs[1], out.shape), -reference, rtol=1e-4)
    device.run(program, kernel, [*first, outs[1]])
    np.testing.assert_allclose(device.download(outs[1], out.shape), reference, rtol=1e-4)


def test_launches_behind_the_hold_are_timed(device: Device) -> None:
    """With the hold forced on (a GPU's way), a timing is positive and finite, the hold's
    rate is learnt, and it only grows (the fastest a hold ran)."""
    kernel, program, inputs, _ = _dense(device)
    out = kernel.buffers[-1]
    buffers = [device.upload(a) for a in inputs] + [device.alloc(out.shape, out.dtype)]
    device.holds_queue = True
    try:
        rates = []
        for number in (1, 50, 200):
            cost = device.time(program, kernel, buffers, number)
            assert math.isfinite(cost) and cost > 0
            rates.append(device._hold_rate)
        assert rates[0] > 0 and rates == sorted(rates)
    finally:
        device.holds_queue = False


class Counting(RecordingDevice):
    """PoCL with a GPU's min_repeat_ms floor, recording each timing's launches and cost."""

    def __init__(self, inner: Device, floor_ms: float) -> None:
        super().__init__(inner.limits, inner)
        self.floor_ms = floor_ms
        self.timed: list[tuple[int, float]] = []

    @property
    def min_repeat_ms(self) -> float:
        return self.floor_ms

    def time(self, program: Any, kernel: Any, buffers: list[Any], number: int,
             rotate: Sequence[list[Any]] = ()) -> float:
        cost = super().time(program, kernel, buffers, number, rotate)
        self.timed.append((number, cost))
        return cost


def test_gpu_floor_raises_number_and_batches_it(device: Device,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor turns number=1 into enough launches to last it (from one timed launch),
    timed in batches of at most MAX_TIMED_LAUNCHES."""
    monkeypatch.setattr(measuring, "MAX_TIMED_LAUNCHES", 4)
    counting = Counting(device, floor_ms=20.0)
    options = MeasureOptions(number=1, repeat=2, min_repeat_ms=0)
    result = measure(counting, MeasureRequest(DENSE, dense_workload(DENSE), tile_k(8), options))
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg
    (once, once_cost), batches = counting.timed[0], [n for n, _ in counting.timed[1:]]
    assert once == 1
    expected = max(options.number, math.ceil(20e-3 / once_cost))
    assert expected > 4  # a kernel of microseconds: the floor asks for many launches
    assert sum(batches) == expected * options.repeat
    assert max(batches) <= 4 and len(batches) >= 2 * options.repeat


def test_no_floor_on_a_cpu_device(device: Device) -> None:
    assert device.min_repeat_ms == 0 and not device.holds_queue

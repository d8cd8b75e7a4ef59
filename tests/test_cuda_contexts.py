"""The CUDA backend's context discipline and build-time launch limits (issue 15, points
3 and 5), on a fake pycuda (tests/fake_pycuda.py) since no GPU exists here: it keeps
CUDA's rules (per-thread context stacks, nothing runs without a current context, a
detached context is gone) and records the context each call ran in. It never produces
a measured number: its events have no clock.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import fake_pycuda
import numpy as np
import pytest
from test_errors import DENSE, dense_workload, tile_k

from compiler.runtime.cuda import CUDADevice
from compiler.runtime.device import DeviceRuntimeError
from compiler.runtime.measure import MeasureRequest, measure
from compiler.templates import get_template
from schemas import MeasureErrorNo, MeasureOptions


@pytest.fixture
def driver() -> Iterator[fake_pycuda.Driver]:
    with fake_pycuda.installed() as drv:
        yield drv
    gc.collect()


def kernel_of(name: str = DENSE) -> tuple[object, object]:
    template = get_template(name)
    workload = dense_workload(name)
    return template.codegen(workload, tile_k(8), "cuda"), workload


def in_context(driver: fake_pycuda.Driver, name: str) -> set[str]:
    """The calls recorded so far that ran in context ``name``."""
    return {call for call, ctx in driver.calls if ctx == name}


def test_a_new_device_leaves_no_context_current(driver: fake_pycuda.Driver) -> None:
    CUDADevice(0)
    assert driver.stack() == []


def test_every_call_runs_in_the_devices_own_context(driver: fake_pycuda.Driver) -> None:
    device = CUDADevice(0)
    kernel, _ = kernel_of()
    program = device.build(kernel)
    buffers = [device.upload(np.zeros(4, np.float32)) for _ in range(len(kernel.buffers))]
    device.write(buffers[0], np.ones(4, np.float32))
    device.launch(program, kernel, buffers)
    device.synchronize()
    device.download(buffers[0], (4,))
    device.unload()
    del program  # a kernel keeps its module: it goes with the last one
    gc.collect()
    assert driver.stack() == []  # popped after each call
    calls = {call for call, _ in driver.calls}
    assert {"module_load", "get_function", "to_device", "memcpy_htod", "launch",
            "synchronize", "memcpy_dtoh", "module_unload"} <= calls
    assert {ctx for _, ctx in driver.calls} == {"cuda:0"}


def test_two_devices_each_keep_their_own_context(driver: fake_pycuda.Driver) -> None:
    first, second = CUDADevice(0), CUDADevice(1)
    kernel, _ = kernel_of()
    # interleaved, as heterogeneous placement uses them
    a = first.upload(np.zeros(4, np.float32))
    b = second.upload(np.zeros(4, np.float32))
    program_b = second.build(kernel)
    program_a = first.build(kernel)
    second.launch(program_b, kernel, [b] * len(kernel.buffers))
    first.launch(program_a, kernel, [a] * len(kernel.buffers))
    assert a.ctx.name == "cuda:0" and b.ctx.name == "cuda:1"
    launches = [ctx for call, ctx in driver.calls if call == "launch"]
    assert launches == ["cuda:1", "cuda:0"]
    assert in_context(driver, "cuda:0") >= {"to_device", "module_load", "launch"}
    assert in_context(driver, "cuda:1") >= {"to_device", "module_load", "launch"}


def test_builds_on_pool_threads_push_the_context(driver: fake_pycuda.Driver) -> None:
    """The executor builds distinct kernels on a thread pool: no context is current on
    those threads until the device pushes its own."""
    device = CUDADevice(0)
    kernel, _ = kernel_of()
    with ThreadPoolExecutor(max_workers=3) as pool:
        programs = list(pool.map(device.build, [kernel] * 3))
    assert len(programs) == 3
    assert {ctx for call, ctx in driver.calls if call == "module_load"} == {"cuda:0"}


def test_launches_are_prepared_once_per_kernel(driver: fake_pycuda.Driver) -> None:
    device = CUDADevice(0)
    kernel, _ = kernel_of()
    program = device.build(kernel)
    buffers = [device.alloc_bytes(16) for _ in kernel.buffers]
    for _ in range(3):
        device.launch(program, kernel, buffers)
    assert program.arg_format == "P" * len(buffers)
    assert [launch[:2] for launch in program.launches] == [(kernel.grid, kernel.block)] * 3
    assert all(args == tuple(int(b) for b in buffers) for *_, args in program.launches)


def test_close_drops_modules_in_context_and_detaches(driver: fake_pycuda.Driver) -> None:
    device = CUDADevice(0)
    kernel, _ = kernel_of()
    device.build(kernel)
    device.close()
    gc.collect()
    unloads = [ctx for call, ctx in driver.calls if call == "module_unload"]
    assert unloads == ["cuda:0"]  # before the context went, not after ("destroyed")
    assert device._ctx is None
    with pytest.raises(DeviceRuntimeError, match="closed"):
        device.upload(np.zeros(4, np.float32))
    device.close()  # twice is harmless


def test_context_manager_closes(driver: fake_pycuda.Driver) -> None:
    with CUDADevice(1) as device:
        device.alloc_bytes(64)
    assert device._ctx is None


@pytest.mark.parametrize(("call", "fails"), [
    (lambda d: d.alloc_bytes(1 << 40), "mem_alloc"),
    (lambda d: d.upload(np.zeros(4, np.float32)), "to_device"),
    (lambda d: d.write(d.alloc_bytes(16), np.zeros(4, np.float32)), "memcpy_htod"),
    (lambda d: d.download(d.alloc_bytes(16), (4,)), "memcpy_dtoh"),
    (lambda d: d.build(kernel_of()[0]), "get_function"),
    (lambda d: d.build(kernel_of()[0]), "module_load"),
    (lambda d: d.synchronize(), "synchronize"),
])
def test_driver_errors_are_device_runtime_errors(driver: fake_pycuda.Driver, call: object,
                                                 fails: str) -> None:
    """Allocation (out of memory), copies, module load and kernel lookup raise pycuda's
    Error on a GPU; the backend turns each into DeviceRuntimeError (error 4), and the
    context is popped even so."""
    device = CUDADevice(0)
    driver.fail.add(fails)
    with pytest.raises(DeviceRuntimeError, match="out of memory"):
        call(device)  # type: ignore[operator]
    assert driver.stack() == []


def test_registers_over_the_block_are_error_1_at_build(driver: fake_pycuda.Driver) -> None:
    """A kernel whose registers allow fewer threads than its block is refused when built
    (error 1, the config does not fit), not launched into a device error (4)."""
    kernel, workload = kernel_of()
    threads = kernel.block[0] * kernel.block[1] * kernel.block[2]
    driver.function_attributes.update(MAX_THREADS_PER_BLOCK=threads // 2, NUM_REGS=255)
    result = measure(CUDADevice(0), MeasureRequest(DENSE, workload, tile_k(8),
                                                   MeasureOptions(number=1, repeat=1)))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR, result.error_msg
    assert f"{threads} threads per block" in (result.error_msg or "")
    assert "255 registers" in (result.error_msg or "")
    assert not [c for c, _ in driver.calls if c == "launch"]


def test_static_shared_memory_over_the_device_is_error_1(driver: fake_pycuda.Driver) -> None:
    _, workload = kernel_of()
    driver.function_attributes.update(SHARED_SIZE_BYTES=49152 + 1)
    result = measure(CUDADevice(0), MeasureRequest(DENSE, workload, tile_k(8),
                                                   MeasureOptions(number=1, repeat=1)))
    assert result.error_no == MeasureErrorNo.INSTANTIATION_ERROR, result.error_msg
    assert "shared memory" in (result.error_msg or "")


def test_gpu_floor_under_min_repeat_ms() -> None:
    assert CUDADevice.min_repeat_ms.fget is not None  # a property: GPUs warm their clocks
    with fake_pycuda.installed():
        assert CUDADevice(0).min_repeat_ms >= 100


def test_timing_queues_the_launches_behind_the_hold(driver: fake_pycuda.Driver) -> None:
    """The hold kernel (prepared "Pi": its sink and an int32 step count) is launched
    first, then the start event, the kernel's launches and the end event, all in the
    device's context. Only the order and arguments are checked: the fake has no clock."""
    device = CUDADevice(0)
    kernel, _ = kernel_of()
    program = device.build(kernel)
    buffers = [device.alloc_bytes(16) for _ in kernel.buffers]
    driver.launches.clear()
    driver.stream.clear()
    device.time(program, kernel, buffers, 5)
    hold_args = [args for entry, args in driver.launches if entry == "tuner_hold"][-1]
    assert isinstance(hold_args[0], int) and isinstance(hold_args[1], np.int32)
    assert 1 <= int(hold_args[1]) <= 2**31 - 1
    after = driver.stream[len(driver.stream) - 1 - driver.stream[::-1].index("tuner_hold"):]
    k = kernel.entry
    assert after == ["tuner_hold", "event",  # the hold, its end event
                     "event", k, "event",  # the first launch between its events
                     k, k, k,  # back to back
                     "event", k, "event"]  # the last launch
    assert {ctx for _, ctx in driver.calls} == {"cuda:0"}
    assert driver.stack() == []


def test_nested_calls_across_devices_run_in_the_right_context(
        driver: fake_pycuda.Driver) -> None:
    """A's call inside B's context (B's call inside A's, as an executor of two devices
    might nest) still runs in A's context."""
    first, second = CUDADevice(0), CUDADevice(1)
    with first.current(), second.current():
        buffer = first.alloc_bytes(16)
    assert buffer.ctx.name == "cuda:0"
    assert driver.stack() == []

"""Per-launch overhead of device timing, before and after prepared, held launches.

For a few short kernels on the local OpenCL device, side by side in one run:

- ``own``: the kernel's own run time, the median of its launches' individual events
  (end - start of the same launch: no gap between launches in it);
- ``before``: seconds per launch as the measurer timed before (each launch through
  pyopencl's call, which sets every argument again; the first event recorded on an idle
  queue), first to last event over ``number`` launches;
- ``prepared``: ``Device.time`` as it runs on a CPU device (arguments set once per
  kernel, each launch one enqueue);
- ``held``: ``Device.time`` as it runs on a GPU (prepared, and the launches queued
  behind a hold kernel, so the device runs them back to back).

The overhead is per-launch time minus ``own``: what a timing adds that is not the kernel.
Usage: python bench/launch_overhead.py [--number 1000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

from compiler.runtime import Device, open_device
from compiler.runtime.measure import task_operands
from compiler.templates import Epilogue, get_template
from schemas import Workload

# Short kernels, where a launch costs as much as the work: batch-1 dense, a depthwise
# conv and a 1x1 conv of a late ResNet stage.
KERNELS: list[tuple[str, str, list[Any]]] = [
    ("dense 1x64 -> 16", "dense_small_batch.gpu",
     [["TENSOR", [1, 64], "float32"], ["TENSOR", [16, 64], "float32"], None, "float32"]),
    ("depthwise 3x3, 32 ch 14x14", "depthwise_conv2d_nchw.cuda",
     [["TENSOR", [1, 32, 14, 14], "float32"], ["TENSOR", [32, 1, 3, 3], "float32"],
      [1, 1], [1, 1, 1, 1], [1, 1], "float32"]),
    ("conv 1x1, 48 -> 16 ch 14x14", "conv2d_nchw.cuda",
     [["TENSOR", [1, 48, 14, 14], "float32"], ["TENSOR", [16, 48, 1, 1], "float32"],
      [1, 1], [0, 0, 0, 0], [1, 1], "float32"]),
]


@dataclass
class Row:
    name: str
    own: list[float]
    before: list[float]
    prepared: list[float]
    held: list[float]


def _unprepared(device: Any, program: Any, size: tuple[int, ...], block: tuple[int, ...],
                buffers: list[Any], number: int) -> tuple[float, float]:
    """The former timing: pyopencl's call per launch, nothing queued ahead. Returns
    (seconds per launch, median own time of one launch)."""
    events = [program(device.queue, size, block, *buffers) for _ in range(number)]
    events[-1].wait()
    own = statistics.median((e.profile.end - e.profile.start) * 1e-9 for e in events)
    return (events[-1].profile.end - events[0].profile.start) * 1e-9 / number, own


def measure_kernel(device: Device, name: str, template_name: str, args: list[Any],
                   number: int, rounds: int) -> Row:
    template = get_template(template_name)
    workload = Workload(template=template_name, args=args)
    config = template.default_config(workload)
    kernel = template.codegen(workload, config, device.dialect)
    program = device.build(kernel)
    arrays, _ = task_operands(template_name, workload, Epilogue(), 0)
    buffers = [device.upload(a) for a in template.kernel_inputs(workload, config, arrays)]
    out = kernel.buffers[-1]
    buffers.append(device.alloc(out.shape, out.dtype))
    size = tuple(g * b for g, b in zip(kernel.grid, kernel.block))
    row = Row(name, [], [], [], [])
    device.holds_queue = True
    device.time(program, kernel, buffers, number)  # warm: caches, the hold's calibration
    for _ in range(rounds):  # interleaved, so all three see the same machine
        before, own = _unprepared(device, program, size, kernel.block, buffers, number)
        row.before.append(before)
        row.own.append(own)
        for held, into in ((False, row.prepared), (True, row.held)):
            device.holds_queue = held
            into.append(device.time(program, kernel, buffers, number))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--number", type=int, default=1000, help="launches per timing")
    parser.add_argument("--rounds", type=int, default=7, help="timings per way, interleaved")
    opts = parser.parse_args()
    device = open_device(opts.device)
    if device.dialect != "opencl":
        raise SystemExit("the 'before' way is pyopencl's call: use an OpenCL device")
    print(f"device: {device.info.name} ({device.info.platform}); {opts.number} launches "
          f"per timing, median of {opts.rounds} interleaved rounds")
    print("per launch, us (overhead: per launch - own)")
    print(f"{'kernel':30} {'own':>7} {'before':>8} {'prepared':>9} {'held':>7} "
          f"{'overhead before':>16} {'prepared':>9} {'held':>7}")
    with device:
        for name, template_name, args in KERNELS:
            row = measure_kernel(device, name, template_name, args, opts.number, opts.rounds)
            own = statistics.median(row.own)
            times = [statistics.median(t) for t in (row.before, row.prepared, row.held)]
            over = [(t - own) * 1e6 for t in times]
            print(f"{name:30} {own * 1e6:7.2f} {times[0] * 1e6:8.2f} {times[1] * 1e6:9.2f} "
                  f"{times[2] * 1e6:7.2f} {over[0]:16.2f} {over[1]:9.2f} {over[2]:7.2f}")


if __name__ == "__main__":
    main()

"""The measured table the tuning benchmark replays: >= N distinct valid configs of each
of ResNet-50's 3x3 conv layers (the CPU template, on this machine's OpenCL device),
measured once each and kept as AutoTVM records in ``bench/data/tuning_cache.log``.

A rerun reads the file and measures only what is missing, so an interrupted campaign
resumes. Configs are drawn uniformly from the configs that fit the device; the next
kernel is compiled in a second thread while the current one is timed (PoCL's compile
takes longer than the run).

    .venv/bin/python bench/tuning_cache.py [--per-workload 1000]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from compiler.runtime import Device, open_device
from compiler.runtime.measure import MeasureRequest, measure, request_kernel
from compiler.tasks import CONV_CPU
from compiler.templates import get_template
from schemas import Config, MeasureOptions, Record, Workload
from schemas.record import read_lines

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "data" / "tuning_cache.log"
# ResNet-50's 3x3 stride-1 convolutions (channels, height = width), as the compiler
# extracts them for a CPU target.
LAYERS = ((64, 56), (128, 28), (256, 14))
# Each cost: >= 10 ms of runs, 3 repeats, the fastest and slowest dropped (the measurer).
OPTIONS = MeasureOptions(number=1, repeat=3, min_repeat_ms=10)


def workloads() -> list[Workload]:
    return [Workload(template=CONV_CPU, args=[
        ["TENSOR", [1, c, h, h], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "NCHW", "NCHW", "float32"]) for c, h in LAYERS]


def load(path: Path = CACHE) -> list[Record]:
    """Every record of the table (unreadable lines are skipped, with a message)."""
    if not path.exists():
        return []
    out: list[Record] = []
    for number, item in read_lines(path.read_text().splitlines()):
        if isinstance(item, Record):
            out.append(item)
        else:
            print(f"{path}:{number}: skipped: {item}", file=sys.stderr)
    return out


def _draws(workload: Workload, device: Device, seen: set[int], seed: int) -> Iterator[Config]:
    template = get_template(workload.template)
    space = template.space(workload)
    rng = random.Random(seed)
    order = list(range(len(space)))
    rng.shuffle(order)
    for index in order:
        if index in seen:
            continue
        config = space.get(index)
        if not template.check_limits(workload, config, device.limits):
            yield config


def fill(workload: Workload, device: Device, want: int, path: Path = CACHE) -> None:
    template = get_template(workload.template)
    have = [r for r in load(path) if r.workload == workload]
    seen = {r.config.index for r in have}
    valid = sum(r.result.ok for r in have)
    print(f"{workload.key}: {valid} valid of {len(have)} measured; want {want}", flush=True)
    if valid >= want:
        return
    draws = _draws(workload, device, seen, seed=len(seen))
    lock = threading.Lock()

    def prebuild(config: Config) -> None:
        try:
            with lock:
                _template, kernel = request_kernel(device, MeasureRequest(
                    template.name, workload, config))  # the kernel measure() builds
            device.build(kernel)
        except Exception:  # the measurer reports it with its error number
            pass

    start = time.time()
    with ThreadPoolExecutor(1) as pool, path.open("a") as out:
        pending: Future[None] | None = None
        current = next(draws, None)
        while current is not None and valid < want:
            upcoming = next(draws, None)
            if pending is not None:
                pending.result()
            pending = pool.submit(prebuild, upcoming) if upcoming is not None else None
            result = measure(device, MeasureRequest(workload.template, workload, current,
                                                    OPTIONS))
            record = Record(target=device.target, workload=workload, config=current,
                            result=result, info={"device": device.info.name})
            out.write(record.to_line() + "\n")
            out.flush()
            valid += result.ok
            seen.add(current.index)
            if len(seen) % 50 == 0:
                rate = (time.time() - start) / max(len(seen) - len(have), 1)
                print(f"  {valid} valid of {len(seen)} ({rate:.2f} s/config)", flush=True)
            current = upcoming


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-workload", type=int, default=1000)
    parser.add_argument("--device", default=None, help="opencl:0 (default: the first)")
    args = parser.parse_args(argv)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    device = open_device(args.device)
    for workload in workloads():
        fill(workload, device, args.per_workload)
    return 0


if __name__ == "__main__":
    sys.exit(main())

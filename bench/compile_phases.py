"""Where a trial's compile goes on PoCL, and what the prelude's VLOAD/VSTORE form costs.

For random configs of ResNet-50's 64x56x56 3x3 conv on ``conv2d_NCHWc.x86`` (the task of
bench/trial_overhead.py; seeded draws), each config in a process of its own with a fresh
PoCL kernel cache, prints per config and per VLOAD/VSTORE form (``vloadN``: OpenCL's
vloadN/vstoreN library calls, the prelude's form before; ``vector``: a vector type
aligned to one float, one unaligned load/store in the IR, the prelude's form now):

- src: the kernel source's size;
- build: ``Program.build`` (PoCL: clang's front end, OpenCL headers included, and the
  program's bitcode);
- launch1: the first launch (PoCL builds the work-group function for the local size,
  optimises it, generates and links the machine code);
- run: the kernel's time, min and median of 12 timings of 5 launches taken in
  alternation with the other form on the same operands; both outputs are checked
  against numpy first.

And, per process, an empty kernel's build and first launch: PoCL's fixed cost per kernel.
The two forms are built in alternating order. Every figure is under whatever else runs.

Usage: python bench/compile_phases.py [--configs 6] [--seed 2]
       CACHE=$(mktemp -d); POCL_CACHE_DIR=$CACHE TUNER_KERNEL_CACHE=$CACHE \
           POCL_DEBUG=timing,llvm python bench/compile_phases.py --seed 2 --one 3
           # PoCL's own phase timings; both variables name the fresh cache, since the
           # runtime points PoCL at $TUNER_KERNEL_CACHE when that is set
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from common import empty_kernel

ARGS = ('[["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],[1,1],'
        '[1,1,1,1],[1,1],"NCHW","NCHW","float32"]')
TEMPLATE = "conv2d_NCHWc.x86"
CLANG_GUARD = "#ifdef __clang__"  # the prelude's vector-type VLOAD/VSTORE branch


def _vloadn_form(source: str) -> str:
    """``source`` with the prelude's VLOAD/VSTORE taken from its non-clang branch
    (vloadN/vstoreN), as the prelude had them before."""
    if source.count(CLANG_GUARD) != 1:
        raise SystemExit(f"the OpenCL prelude has no {CLANG_GUARD!r} branch to compare")
    return source.replace(CLANG_GUARD, "#if 0  // the vloadN form")


def one(seed: int, index: int) -> dict[str, Any]:
    """In a fresh process: config ``index`` of the seeded draws, both forms."""
    import numpy as np

    from compiler.runtime import open_device
    from compiler.runtime.measure import (
        MeasureRequest,
        operand_buffers,
        plain_output,
        request_kernel,
        task_operands,
    )
    from compiler.templates import get_template
    from schemas import Workload

    device: Any = open_device("opencl:0")
    began = time.perf_counter()
    device.build(empty_kernel("warm"))  # the first build also loads PoCL's kernel library
    library = time.perf_counter() - began
    device.unload()
    template = get_template(TEMPLATE)
    workload = Workload(template=TEMPLATE, args=json.loads(ARGS))
    rng = random.Random(seed)
    configs = [template.random_config(workload, rng, device.info.limits)
               for _ in range(index + 1)]
    request = MeasureRequest(template=TEMPLATE, workload=workload, config=configs[index])
    _template, kernel = request_kernel(device, request)
    kernels = {"vector": kernel,
               "vloadN": dataclasses.replace(kernel, source=_vloadn_form(kernel.source))}
    out: dict[str, Any] = {"knobs": {k: v for k, v in template.decode(workload, configs[index])
                                     .items()}, "src": len(kernel.source)}
    # the fixed cost: an empty kernel's build and first launch (library already loaded)
    empty = empty_kernel("empty")
    start = time.perf_counter()
    program = device.build(empty)
    built = time.perf_counter()
    device.run(program, empty, [device.alloc((64,), "float32")])
    device.synchronize()
    out["empty"] = {"build": built - start, "launch1": time.perf_counter() - built,
                    "library": library}
    device.unload()
    order = ("vector", "vloadN") if index % 2 == 0 else ("vloadN", "vector")
    programs = {}
    buffers = operand_buffers(device, template, kernel, request)
    _arrays, reference = task_operands(TEMPLATE, workload, request.epilogue, request.seed)
    want = reference()
    for form in order:
        start = time.perf_counter()
        programs[form] = device.build(kernels[form])
        built = time.perf_counter()
        device.run(programs[form], kernels[form], buffers)
        device.synchronize()
        out[form] = {"build": built - start, "launch1": time.perf_counter() - built}
        got = plain_output(template, request,
                           device.download(buffers[-1], kernel.buffers[-1].shape))
        err = float(np.abs(got - want).max())
        if err > 1e-3 * max(1.0, float(np.abs(want).max())):
            raise SystemExit(f"{form}: max abs error {err} against numpy")
    times: dict[str, list[float]] = {form: [] for form in order}
    for r in range(12):
        for form in (order if r % 2 == 0 else order[::-1]):
            times[form].append(device.time(programs[form], kernels[form], buffers, 5))
    for form in order:
        out[form]["run_min"] = min(times[form])
        out[form]["run_median"] = statistics.median(times[form])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--one", type=int, metavar="N",
                        help="config N alone, in this process and its kernel cache, "
                             "as JSON (what each config's child runs; with "
                             "POCL_DEBUG=timing,llvm PoCL prints its phases)")
    opts = parser.parse_args()
    if opts.one is not None:
        print(json.dumps(one(opts.seed, opts.one)))
        return
    print("| config | src KB | form | build s | first launch s | total s | run ms min / median |")
    print("|---|---:|---|---:|---:|---:|---:|")
    empties = []
    for index in range(opts.configs):
        with tempfile.TemporaryDirectory() as cache:
            # both: the runtime points PoCL at TUNER_KERNEL_CACHE where that is set, and a
            # cold compile needs a cache nothing was compiled into
            env = dict(os.environ, POCL_CACHE_DIR=cache, TUNER_KERNEL_CACHE=cache)
            done = subprocess.run([sys.executable, __file__, "--seed", str(opts.seed),
                                   "--one", str(index)], env=env, check=True,
                                  capture_output=True, text=True)
        fig = json.loads(done.stdout.strip().splitlines()[-1])
        empties.append(fig["empty"])
        k = fig["knobs"]
        name = (f"{index}: vec {k['vec']} ow {tuple(k['tile_ow'])} oc {tuple(k['tile_oc'])} "
                f"ci {k['unroll_ci']} wg {k['wg']}")
        for form in ("vloadN", "vector"):
            f = fig[form]
            print(f"| {name} | {fig['src'] / 1e3:.0f} | {form} | {f['build']:.2f} | "
                  f"{f['launch1']:.2f} | {f['build'] + f['launch1']:.2f} | "
                  f"{f['run_min'] * 1e3:.2f} / {f['run_median'] * 1e3:.2f} |", flush=True)
    print("empty kernel, median over the processes: build "
          f"{statistics.median(e['build'] for e in empties):.3f} s, first launch "
          f"{statistics.median(e['launch1'] for e in empties):.3f} s (PoCL's library load "
          f"at a process's first build {statistics.median(e['library'] for e in empties):.2f} s)")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

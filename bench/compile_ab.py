"""A change to the CPU templates' code generation, before against after, config by config.

For each CPU conv template (a ResNet-50 workload each) its default config and ``--configs``
seeded random ones: the kernel source of another source tree (``--before TREE``, written
by a child process with PYTHONPATH=TREE) and of this one, both built in this process (one
fresh PoCL kernel cache for the run, so nothing is found compiled), both checked against
numpy, then timed in ``--rounds`` alternating rounds of 3 launches on the same operands.
Prints per config the source size, build + first launch (PoCL's whole compile; "same
source" where the change left the config's kernel as it was: it is built once) and the
median kernel time of each, and per template the compile totals of the changed kernels
and the geometric mean, min and max of the after / before run-time ratios (an unchanged
kernel's ratio shows the noise). Every figure is under whatever else
runs on the machine; the run-time ratios of single configs move by +-10-20% on a shared
2-core VM, so read the geometric means.

    git archive COMMIT_BEFORE_THE_CHANGE | tar -x -C /tmp/before
    .venv/bin/python bench/compile_ab.py --before /tmp/before --configs 11 \
        [--templates conv2d_NCHWc.x86]
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

import numpy as np
from common import empty_kernel

CASES = {
    "conv2d_NCHWc.x86": '[["TENSOR",[1,64,56,56],"float32"],["TENSOR",[64,64,3,3],"float32"],'
                        '[1,1],[1,1,1,1],[1,1],"NCHW","NCHW","float32"]',
    "conv2d_NCHWc_1x1.x86": '[["TENSOR",[1,256,14,14],"float32"],["TENSOR",[1024,256,1,1],'
                            '"float32"],[1,1],[0,0,0,0],[1,1],"NCHW","NCHW","float32"]',
    "conv2d_NCHWc_winograd.x86": '[["TENSOR",[1,128,28,28],"float32"],["TENSOR",[128,128,3,3],'
                                 '"float32"],[1,1],[1,1,1,1],[1,1],"NCHW","NCHW","float32"]',
}


def sources(configs: int, seed: int, templates: list[str]) -> list[dict[str, Any]]:
    """Per template: the default and ``configs`` seeded random configs, with this tree's
    kernel source of each (what ``--dump`` prints for the parent)."""
    from compiler.runtime import open_device
    from compiler.runtime.measure import MeasureRequest, request_kernel
    from compiler.templates import get_template
    from schemas import Workload

    device: Any = open_device("opencl:0")
    out = []
    for name in templates:
        args = CASES[name]
        template = get_template(name)
        workload = Workload(template=name, args=json.loads(args))
        rng = random.Random(seed)
        drawn = [template.default_config(workload, device.info.limits)]
        drawn += [template.random_config(workload, rng, device.info.limits)
                  for _ in range(configs)]
        for config in drawn:
            request = MeasureRequest(template=name, workload=workload, config=config)
            _template, kernel = request_kernel(device, request)
            out.append({"template": name, "config": config.model_dump(mode="json"),
                        "source": kernel.source, "launch": _launch(kernel)})
    return out


def _launch(kernel: Any) -> list[Any]:
    """What besides the source must agree for the two forms to run on the same operands."""
    return [list(kernel.grid), list(kernel.block),
            [[b.name, list(b.shape), b.role] for b in kernel.buffers]]


def compare(before: list[dict[str, Any]], rounds: int) -> None:
    """Both forms of each dumped config, built in alternating order (after a warm-up
    build: a process's first build also loads PoCL's library), each run on fresh
    operands and checked against numpy, then timed in alternating rounds."""
    from compiler.runtime import open_device
    from compiler.runtime.measure import (
        MeasureRequest,
        operand_buffers,
        plain_output,
        request_kernel,
        task_operands,
    )
    from compiler.templates import get_template
    from schemas import Config, Workload

    device: Any = open_device("opencl:0")
    device.build(empty_kernel("warm"))
    device.unload()
    totals: dict[str, dict[str, Any]] = {}
    number: dict[str, int] = {}
    print("| template | config | src KB before -> after | compile s before -> after "
          "| run ms before -> after | after / before |")
    print("|---|---:|---:|---:|---:|---:|")
    for index, item in enumerate(before):
        name = item["template"]
        template = get_template(name)
        workload = Workload(template=name, args=json.loads(CASES[name]))
        request = MeasureRequest(template=name, workload=workload,
                                 config=Config.model_validate(item["config"]))
        _template, kernel = request_kernel(device, request)
        if _launch(kernel) != item["launch"]:
            raise SystemExit(f"{name} config {index}: the trees launch it differently "
                             f"({item['launch']} against {_launch(kernel)})")
        kernels = {"before": dataclasses.replace(kernel, source=item["source"]),
                   "after": kernel}
        _arrays, reference = task_operands(name, workload, request.epilogue, request.seed)
        want = reference()
        programs, compile_s, runs = {}, {}, {}
        order = ("before", "after") if index % 2 == 0 else ("after", "before")
        for form in order:
            k = kernels[form]
            # fresh operands: the output as the measurer leaves it, nothing of the other form's
            buffers = operand_buffers(device, template, kernel, request)
            began = time.perf_counter()
            programs[form] = device.build(k)
            device.run(programs[form], k, buffers)
            device.synchronize()
            compile_s[form] = time.perf_counter() - began
            got = plain_output(template, request,
                               device.download(buffers[-1], k.buffers[-1].shape))
            err = float(np.abs(got - want).max())
            if err > 1e-3 * max(1.0, float(np.abs(want).max())):
                raise SystemExit(f"{name} config {index} {form}: max abs error {err}")
            runs[form] = []
        for r in range(rounds):
            for form in (("before", "after") if r % 2 == 0 else ("after", "before")):
                runs[form].append(device.time(programs[form], kernels[form], buffers, 3))
        med = {form: statistics.median(v) for form, v in runs.items()}
        ratio = med["after"] / med["before"]
        total = totals.setdefault(name, {"before": 0.0, "after": 0.0, "changed": [],
                                         "same": []})
        same = item["source"] == kernel.source  # built once: no compile to compare
        if same:
            total["same"].append(ratio)
            compiled = "same source"
        else:
            total["changed"].append(ratio)
            total["before"] += compile_s["before"]
            total["after"] += compile_s["after"]
            compiled = f"{compile_s['before']:.2f} -> {compile_s['after']:.2f}"
        number[name] = number.get(name, -1) + 1
        label = number[name] or "default"
        print(f"| {name} | {label} | {len(item['source']) / 1e3:.0f} -> "
              f"{len(kernel.source) / 1e3:.0f} | {compiled} | {med['before'] * 1e3:.3f} -> "
              f"{med['after'] * 1e3:.3f} | {ratio:.3f} |", flush=True)
        device.unload()
    print("\n| template | changed configs | compile s before -> after | run after / before: "
          "geomean (min-max) | unchanged configs: run after / before (the noise) |")
    print("|---|---:|---:|---:|---:|")
    for name, total in totals.items():
        speedup = total["before"] / total["after"] if total["after"] else float("nan")
        print(f"| {name} | {len(total['changed'])} | {total['before']:.1f} -> "
              f"{total['after']:.1f} ({speedup:.2f}x) | {_spread(total['changed'])} | "
              f"{len(total['same'])}: {_spread(total['same'])} |")
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


def _spread(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    geomean = float(np.exp(np.mean(np.log(ratios))))
    return f"{geomean:.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="the source tree to compare this one with")
    parser.add_argument("--configs", type=int, default=11, help="random configs per template")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--templates", default=",".join(CASES),
                        help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--dump", action="store_true",
                        help="print this tree's sources as JSON (what --before runs)")
    opts = parser.parse_args()
    templates = opts.templates.split(",")
    if unknown := sorted(set(templates) - set(CASES)):
        parser.error(f"--templates: {', '.join(unknown)} not among {', '.join(CASES)}")
    if opts.dump:
        print(json.dumps(sources(opts.configs, opts.seed, templates)))
        return
    if not opts.before:
        parser.error("--before TREE is required")
    tree = os.path.abspath(opts.before)
    if not os.path.isdir(os.path.join(tree, "compiler", "templates")):
        parser.error(f"--before {tree}: not a source tree of this project (no compiler/templates)")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=tree)
        # this script, importing the other tree's code (it need not have this script)
        dumped = subprocess.run([sys.executable, os.path.abspath(__file__), "--dump",
                                 "--configs", str(opts.configs), "--seed", str(opts.seed),
                                 "--templates", opts.templates],
                                check=False, env=env, capture_output=True, text=True,
                                cwd=tree)
        if dumped.returncode != 0:
            why = (dumped.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"--before {tree}: its kernels could not be written "
                             f"(exit {dumped.returncode}): {why}")
        os.environ["POCL_CACHE_DIR"] = os.environ["TUNER_KERNEL_CACHE"] = cache
        compare(json.loads(dumped.stdout.strip().splitlines()[-1]), opts.rounds)


if __name__ == "__main__":
    main()

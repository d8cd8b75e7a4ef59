"""A prologue on the 1x1 GEMM's data load, what it costs: DenseNet-121's 1x1 shapes (K
128; C and the image as its dense blocks have them) timed on the template's 16-lane
default config, alternating, each kernel checked against numpy first:

- blocked: data in NCHW16c, no prologue (what a build runs after a separate
  pre-activation kernel wrote the block);
- plain: data in NCHW as the concatenation lies, no prologue;
- shift+relu: plain with the prologue a build runs when every scale is positive (moved
  into the weight, ``build_module._scale_into_weight``);
- scale+shift+relu: plain with the whole pre-activation, on the broadcast vectors
  (``Prologue.c_vector``);
- scalar: the same on each float before its broadcast (``Prologue.c_expr``), the form
  ``Prologue.load`` replaced.

Times are each kernel's minimum over ``--rounds`` of ``device.time`` (``--number``
launches); ratios over plain.

    .venv/bin/python bench/prologue.py --rounds 7
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any
from unittest import mock

from common import checked_kernel, print_header

from compiler.runtime import open_device
from compiler.tasks import CONV1X1_CPU
from compiler.templates import IOLayout, Prologue, get_template
from schemas import DeviceLimits, Workload

# (C, image side): the first and last 1x1 layer of each dense block, and one between
SHAPES = ((64, 56), (160, 56), (256, 56), (128, 28), (320, 28), (512, 28),
          (256, 14), (640, 14), (1024, 14), (512, 7), (1024, 7))
PRE = ("scale", "shift", "relu")


def scalar(self: Prologue, value: str, channel: str, lanes: int, factor: str = "") -> str:
    """``Prologue.load`` on the float before its broadcast (``c_expr``)."""
    return f"VBCAST({lanes}, {self.c_expr(value, channel)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20)
    opts = parser.parse_args()
    device = open_device("opencl:0")
    print_header("bench/prologue.py", device.info.name)
    template = get_template(CONV1X1_CPU)
    kinds: dict[str, tuple[IOLayout, tuple[str, ...], bool]] = {
        "blocked": (IOLayout(16, 64), (), False), "plain": (IOLayout(0, 64), (), False),
        "shift+relu": (IOLayout(0, 64), ("shift", "relu"), False),
        "scale+shift+relu": (IOLayout(0, 64), PRE, False),
        "scalar": (IOLayout(0, 64), PRE, True)}
    print("\n| C x image | " + " | ".join(f"{k} ms" for k in kinds) + " | "
          + " | ".join(f"{k} / plain" for k in kinds if k != "plain") + " |")
    print("|---|" + "---:|" * (2 * len(kinds) - 1))
    for c, side in SHAPES:
        wl = Workload(template=CONV1X1_CPU, args=[
            ["TENSOR", [1, c, side, side], "float32"], ["TENSOR", [128, c, 1, 1], "float32"],
            [1, 1], [0, 0, 0, 0], [1, 1], "NCHW", "NCHW", "float32"])
        config = template.default_config(wl, DeviceLimits(simd_lanes=16))
        built: dict[str, Any] = {}
        for kind, (io, ops, as_floats) in kinds.items():
            with mock.patch.object(Prologue, "load", scalar) if as_floats else nullcontext():
                built[kind] = checked_kernel(device, wl, config, io, Prologue(ops))
        best = {kind: float("inf") for kind in kinds}
        for r in range(opts.rounds):
            for kind in list(kinds) if r % 2 == 0 else list(kinds)[::-1]:
                best[kind] = min(best[kind], device.time(*built[kind], opts.number))
        print(f"| {c} x {side}x{side} | " + " | ".join(f"{best[k] * 1e3:.3f}" for k in kinds)
              + " | " + " | ".join(f"{best[k] / best['plain']:.2f}x" for k in kinds
                                   if k != "plain") + " |")


if __name__ == "__main__":
    main()

"""Plain (untuned) kernels for every IR op that no tunable template computes.

``lower(node)`` turns one op node into a ``Kernel``: its buffers are the node's inputs in
order (constants included) followed by the output, and its source compiles as OpenCL C
or CUDA C through the templates' prelude. Conv2d and dense layers run their template
(tuned config or the template's default); only grouped and depthwise convolutions, which
no template covers yet, take the plain conv2d here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from compiler.ir import CONST, INPUT, Node
from compiler.ir.ops import ALIAS_OPS
from compiler.kernels import (
    conv2d,
    elementwise,
    image,
    lrn,
    matmul,
    movement,
    pool,
    reduce,
    softmax,
)
from compiler.kernels.common import NoKernelError, check_operands, describe
from compiler.templates.base import DIALECTS, Kernel, Prologue
from compiler.templates.prelude import with_prelude

# ops with a kernel that reads NCHW and writes NCHW[b]c: op -> (whether it can for a node
# and b, kernel)
BLOCKED_KERNELS = elementwise.BLOCKED_KERNELS
# ops with a kernel that reads and writes NCHW[b]c (the same b)
BLOCKED_POOLS = pool.BLOCKED_KERNELS
# ops with a kernel that applies a ``Prologue`` on the values it reads
PROLOGUE_KERNELS = pool.PROLOGUE_KERNELS

KERNELS: dict[str, Callable[[Node], Kernel]] = {
    **elementwise.KERNELS,
    **pool.KERNELS,
    **softmax.KERNELS,
    **lrn.KERNELS,
    **movement.KERNELS,
    **conv2d.KERNELS,
    **matmul.KERNELS,
    **reduce.KERNELS,
    **image.KERNELS,
}


def lower(node: Node, dialect: str = "opencl", out_block: int = 0,
          prologue: Prologue = Prologue()) -> Kernel:
    """The plain kernel computing ``node``; NoKernelError when there is none.
    ``out_block`` > 0: written in NCHW[out_block]c (ops of ``BLOCKED_KERNELS``, which read
    NCHW, and of ``BLOCKED_POOLS``, which read that block too). ``prologue``: applied on
    each value read (ops of ``PROLOGUE_KERNELS``, in NCHW)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect {dialect!r} is not one of {', '.join(DIALECTS)}")
    if node.op in (INPUT, CONST):
        raise NoKernelError(f"{describe(node)}: graph inputs and constants are data, "
                            "not kernels")
    if node.op in ALIAS_OPS:
        raise NoKernelError(f"{describe(node)}: an alias of its input's storage, run "
                            "without a kernel")
    make = KERNELS.get(node.op)
    if make is None:
        raise NoKernelError(f"{describe(node)}: no plain kernel for op {node.op!r}")
    check_operands(node)
    if prologue.ops:
        with_prologue = PROLOGUE_KERNELS.get(node.op)
        if with_prologue is None or out_block:
            raise NoKernelError(f"{describe(node)}: no kernel applies a prologue for it"
                                + (f" in NCHW[{out_block}]c" if out_block else ""))
        kernel = with_prologue(node, prologue)
    elif out_block:
        blocked = BLOCKED_KERNELS.get(node.op) or BLOCKED_POOLS.get(node.op)
        if blocked is None or not blocked[0](node, out_block):
            raise NoKernelError(f"{describe(node)}: no kernel writes {node.op!r} in "
                                f"NCHW[{out_block}]c")
        kernel = blocked[1](node, out_block)
    else:
        kernel = make(node)
    return dataclasses.replace(kernel, source=with_prelude(kernel.source, dialect),
                               dialect=dialect)


__all__ = [
    "BLOCKED_KERNELS",
    "BLOCKED_POOLS",
    "KERNELS",
    "PROLOGUE_KERNELS",
    "NoKernelError",
    "lower",
]

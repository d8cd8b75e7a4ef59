"""Shared pieces of the plain kernels: one work-item per output item, C literals, indexing."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from compiler.ir import Node
from compiler.templates.base import Buffer, Epilogue, Kernel
from compiler.templates.emit import (
    c_float as c_float,  # re-exported: the plain kernels take their helpers from here
)
from compiler.templates.emit import indent, signature

BLOCK = 128
# Indices are C ints: every tensor a kernel touches must stay below 2**31 elements.
MAX_ELEMENTS = 2**31 - 1


class NoKernelError(ValueError):
    """An op (or an operand of it) that no plain kernel computes; names the op and node."""


def describe(node: Node) -> str:
    return f"{node.op} {node.name or '(unnamed)'}"


# data movement copies elements whatever their type: quantized (int8 / int32) values and
# masks (bool) move through the same kernels as float32
MOVEMENT_OPS = frozenset({"concatenate", "transpose", "nn.pad", "strided_slice", "tile",
                          "broadcast_to", "take"})
# ops whose plain kernels also take the integer dtypes of quantized graphs (and
# image.resize's and take's int32 index tables)
INTEGER_OPS = frozenset({"add", "subtract", "multiply", "nn.relu", "nn.bias_add", "clip",
                         "cast", "right_shift", "fused.elementwise", "copy", "abs",
                         "negative", "maximum", "minimum", "power", "equal", "greater",
                         "less", "where", "image.resize"}) | MOVEMENT_OPS
# ops whose plain kernels also take bool tensors (comparisons' results, Where's condition)
BOOL_OPS = frozenset({"equal", "greater", "less", "where", "cast", "copy"}) | MOVEMENT_OPS


def check_operands(node: Node) -> None:
    """float32 (int8 / int32 too for ``INTEGER_OPS``, bool for ``BOOL_OPS``) and 32-bit
    indexable, or NoKernelError."""
    allowed = ("float32", *(("int32", "int8") if node.op in INTEGER_OPS else ()),
               *(("bool",) if node.op in BOOL_OPS else ()))
    for ty in (*(a.ty for a in node.inputs), node.ty):
        if ty.dtype not in allowed:
            raise NoKernelError(f"{describe(node)}: no kernel for dtype {ty.dtype} "
                                f"({', '.join(allowed)} only)")
        if ty.size > MAX_ELEMENTS:
            raise NoKernelError(f"{describe(node)}: {ty.size} elements exceed 32-bit indexing")


def epilogue_of(node: Node) -> tuple[Epilogue, list[str]]:
    """The node's fused epilogue (none for the plain op) and its extra buffers' names."""
    try:
        epilogue = Epilogue(tuple(node.attrs.get("epilogue", ())))
    except ValueError as err:
        raise NoKernelError(f"{describe(node)}: {err}") from None
    extra = [name for op, name in (("bias", "bias"), ("add", "residual")) if op in epilogue.ops]
    return epilogue, extra


def entry_name(node: Node) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", node.op) + "_kernel"


def strides(shape: Sequence[int]) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return list(reversed(out))


def around_axis(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    """(outer, axis length, inner) element counts of ``shape`` around ``axis``."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def unravel(index: str, shape: Sequence[int]) -> list[str]:
    """C lines defining ``c0 .. c{n-1}``, the row-major coordinates of ``index``."""
    lines = []
    for k, s in enumerate(strides(shape)):
        value = f"({index} / {s})" if s != 1 else index
        lines.append(f"const int c{k} = {value} % {shape[k]};" if k else
                     f"const int c0 = {value};")
    return lines


def linear(coords: Sequence[str], shape: Sequence[int]) -> str:
    """Row-major offset of ``coords`` in ``shape``, skipping size-1 (broadcast) dims."""
    terms = [f"{c} * {s}" if s != 1 else c
             for c, s, d in zip(coords, strides(shape), shape) if d != 1]
    return " + ".join(terms) or "0"


def per_item(node: Node, names: Sequence[str], total: int, body: Sequence[str],
             block: int = BLOCK, extra: Sequence[Buffer] = ()) -> Kernel:
    """A kernel with one work-item per item ``i`` in ``[0, total)``, in blocks of ``block``.

    ``names`` names every input buffer (in node order), ``extra`` more inputs after them
    (a prologue's vectors); the output is ``out``. The source has no prelude yet:
    ``lower`` adds the dialect's.
    """
    entry = entry_name(node)
    dtypes = {name: arg.ty.dtype for name, arg in zip(names, node.inputs)}
    dtypes |= {b.name: b.dtype for b in extra}
    dtypes["out"] = node.ty.dtype
    params = [*names, *(b.name for b in extra)]
    # no items (a zero-size tensor): an empty body, which never runs anyway; the body's
    # index arithmetic would divide by the zero-size dims (compilers warn on x / 0)
    lines = [signature(entry, params, "out", dtypes) + " {", "}"] if total == 0 else [
        signature(entry, params, "out", dtypes) + " {",
        f"  const int i = BLOCK_X * {block} + THREAD_X;",
        f"  if (i >= {total}) return;",
        *indent(list(body)),
        "}",
    ]
    buffers = (*(Buffer(name, arg.ty.shape, arg.ty.dtype)
                 for name, arg in zip(names, node.inputs)), *extra)
    return Kernel(
        source="\n".join(lines) + "\n",
        entry=entry,
        grid=(max(1, -(-total // block)), 1, 1),
        block=(block, 1, 1),
        buffers=(*buffers, Buffer("out", node.ty.shape, node.ty.dtype, role="out")),
        dialect="",
    )

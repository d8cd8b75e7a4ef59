"""Prefetch of the next output-channel block's weight, shared by the CPU conv templates
whose work-items of one channel block run one after another (channel blocks outermost).

In a model a layer's weight comes from memory: between two runs of a layer every other
layer's weight is read. The first work-item of each channel block then waits on that
read alone; ResNet-50's 512-channel 3x3 layers took ~1.15 ms with their weight cold
against ~0.8 with it in the caches (docs/BENCHMARKS.md, ``bench/in_model.py``). So every
work-item of a block but its first prefetches a slice of the next block's weight, a
few lines at a time while it computes from its own block (which the first work-item
brought into the caches). The first work-item, and every one of the last block, prefetch
the start of their own block instead: one code path, lines already cached.

The kernels say where they are in their own block's weight (an offset in floats from
the block's start); the slice maps that offset, over ``slices``, into its part of the
next block, so the slices together cover the whole next block and stay inside it.
``conv2d_NCHWc.x86`` prefetches a row of taps at a time, the GEMM templates a chunk of
channels (``paced_loop``). Winograd's batched GEMM, one work-item a group and its
transformed weight slice read over several passes, prefetches the next group's whole
slice instead, a share each pass (``wanted`` decides; no ``slices``).
"""

from __future__ import annotations

from compiler.templates.emit import indent

# floats in a cache line: one PREFETCH a line
LINE = 16
# the smallest weight (bytes) whose next block is prefetched: ResNet-50's layers of 1 MB
# and more ran 1.1-1.4x their warm time in the model, about what their weight's read
# from memory adds; below, the read is small against the work and a prefetch mostly work
MIN_WEIGHT = 1 << 20
# the fewest cache lines a work-item prefetches in one burst, between runs of its
# channel loop (templates whose channel loop has no rows of taps to pace it)
CHUNK_LINES = 4


def wanted(weight_bytes: int, blocks: int) -> bool:
    """Whether a kernel prefetches its next block's weight: one of ``MIN_WEIGHT`` bytes or
    more, in more than one block."""
    return weight_bytes >= MIN_WEIGHT and blocks > 1


def slices(weight_bytes: int, items: int, blocks: int, oc_inner: int) -> int:
    """How many work-items of a block share out the next block's weight (all but the
    first); 0: no prefetch (not ``wanted``, one work-item a block, or channel blocks
    innermost: a block's work-items are then not consecutive)."""
    if items < 2 or oc_inner or not wanted(weight_bytes, blocks):
        return 0
    return int(items - 1)


def chunk_channels(run: int, step: int, row: int, count: int) -> int:
    """Channels a loop over ``run`` channels (``step`` at a time, ``row`` weight floats a
    channel) walks between two bursts of prefetch: the fewest (whole steps dividing the
    run) whose share (over ``count``) is at least ``CHUNK_LINES`` lines; the whole run
    where none is."""
    return next((ch for ch in range(step, run, step)
                 if run % ch == 0 and ch * row >= CHUNK_LINES * LINE * count), run)


def slice_start(place: str, blocks: int, block: int, count: int) -> list[str]:
    """C lines setting ``wn``, the start of this work-item's slice: at (place - 1) /
    count of the next block's ``block`` floats (``place``: the work-item's index among
    its block's; ``kb`` the block, ``wk`` its weight). A long: block x count may pass
    2^31."""
    return [(f"GLOBAL const float* wn = {place} == 0 || kb + 1 == {blocks} ? wk : "
             f"wk + {block} + (int)((long)({place} - 1) * {block} / {count});")]


def chunk(offset: str, floats: int, count: int) -> list[str]:
    """C lines prefetching this work-item's share of the next block for the ``floats``
    of its own block at ``offset`` (an int expression: floats from ``wk``): the lines
    over ``[offset, offset + floats) / count`` of its slice, one PREFETCH a line. The
    offset is taken as a long: Winograd's pass index times a slice may pass 2^31."""
    lines = [f"GLOBAL const float* wf = wn + (int)((long)({offset}) / {count});"]
    return lines + [f"PREFETCH(wf + {LINE * k});" for k in range(-(-floats // (count * LINE)))]


def paced_loop(var: str, run: int, step: int, body: list[str], base: str, row: int,
               count: int) -> list[str]:
    """``for (var = 0; var < run; var += step) body`` over channels, ``row`` weight
    floats a channel, with this work-item's share (over ``count``) of the next block
    prefetched before each chunk of channels (``chunk_channels``); ``base``: where the
    run's first channel is in the own block's weight (floats from its start)."""
    ch = chunk_channels(run, step, row, count)
    if ch == run:
        return [*chunk(base, run * row, count),
                f"for (int {var} = 0; {var} < {run}; {var} += {step}) {{", *indent(body), "}"]
    return [f"for (int cq = 0; cq < {run}; cq += {ch}) {{",
            *indent(chunk(f"{base} + cq * {row}", ch * row, count)),
            f"  for (int {var} = cq; {var} < cq + {ch}; {var} += {step}) {{",
            *indent(indent(body)), "  }", "}"]

"""The build report: which config each task got, from where, and what it should cost.
It replaces TVM's bare "Cannot find config" warning with one table a person can read."""

from __future__ import annotations

import io
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

from compiler.records.choose import SOURCES, THIS_DEVICE, Choice
from compiler.templates import get_template
from schemas import Target, Workload

MEASURED = "measured"
ESTIMATED = "estimated"
FLOPS_SHARE = "FLOPs share"

# Rejected candidates spelled out per task; the "skipped" column counts them all.
_SHOWN_REJECTIONS = 3
# A console this wide never wraps a real report's rows.
_UNWRAPPED = 1000


@dataclass(frozen=True)
class TaskEstimate:
    """A task's predicted time (None when nothing was measured here) and latency share."""

    choice: Choice
    flops: float
    seconds: float | None
    share: float
    basis: str  # MEASURED, ESTIMATED or FLOPS_SHARE


@dataclass(frozen=True)
class Prediction:
    """Per-task estimates; ``gflops`` is the rate assumed for tasks not measured here."""

    rows: tuple[TaskEstimate, ...]
    gflops: float | None
    measured: int

    @property
    def total_s(self) -> float | None:
        if self.gflops is None:
            return None
        return sum(r.seconds or 0.0 for r in self.rows)


def predict(choices: Sequence[Choice], flops: Sequence[float] | None = None) -> Prediction:
    """Measured time where the record is from this device; elsewhere FLOPs at the median
    GFLOP/s of this device's measured tasks (another device's time says little about
    this one); with no measured task at all, only each task's share of the FLOPs.

    ``flops[i]`` is what task ``i`` stands for in the model (one run of its workload per
    layer that shares it); by default one run each.
    """
    once = [float(get_template(c.template).flops(c.workload)) for c in choices]
    total_flops = list(flops) if flops is not None else once
    if len(total_flops) != len(choices):
        raise ValueError(f"{len(choices)} choices but {len(total_flops)} FLOP counts")
    # A zero cost (a bogus record) would make an infinite rate: treated as unmeasured.
    rates = [f / c.cost for c, f in zip(choices, once) if c.cost]
    gflops = statistics.median(rates) / 1e9 if rates else None
    times: list[float | None] = []
    bases: list[str] = []
    for choice, one, f in zip(choices, once, total_flops):
        if choice.cost:
            times.append(choice.cost * f / one)
            bases.append(MEASURED)
        elif gflops is not None:
            times.append(f / (gflops * 1e9))
            bases.append(ESTIMATED)
        else:
            times.append(None)
            bases.append(FLOPS_SHARE)
    weights = [t or 0.0 for t in times] if gflops is not None else total_flops
    total = sum(weights) or 1.0
    rows = tuple(TaskEstimate(c, f, t, w / total, b)
                 for c, f, t, w, b in zip(choices, total_flops, times, weights, bases))
    return Prediction(rows, gflops, len(rates))


def shape_summary(workload: Workload) -> str:
    """``1x64x56x56, 64x64x3x3 -> 1x64x56x56``: inputs and output of the operator."""
    template = get_template(workload.template)
    dims = ["x".join(map(str, s)) for s in template.input_shapes(workload)]
    return f"{', '.join(dims)} -> {'x'.join(map(str, template.output_shape(workload)))}"


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _skipped(rows: Sequence[TaskEstimate]) -> list[str]:
    """One line per passed-over candidate (a few per task): why a record was not used."""
    lines = []
    for i, row in enumerate(rows, start=1):
        rejected = row.choice.rejected
        for r in rejected[:_SHOWN_REJECTIONS]:
            lines.append(f"task {i}: skipped a record for {r.target} from {r.origin}: "
                         f"{r.reason} ({r.detail})")
        if len(rejected) > _SHOWN_REJECTIONS:
            lines.append(f"task {i}: skipped {len(rejected) - _SHOWN_REJECTIONS} more record(s)")
    return lines


def report_table(prediction: Prediction, target: Target) -> Table:
    table = Table(title=f"Build report for {target}", box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (("#", "right"), ("template", "left"), ("workload", "left"),
                          ("source", "left"), ("origin target", "left"),
                          ("predicted", "right"), ("share", "right"), ("basis", "left"),
                          ("skipped", "right")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for i, row in enumerate(prediction.rows, start=1):
        c = row.choice
        source = f"{c.source} ({c.key})" if c.key else c.source
        table.add_row(
            str(i), c.template, shape_summary(c.workload), source,
            str(c.origin_target) if c.origin_target else "-",
            format_seconds(row.seconds) if row.seconds is not None else "-",
            f"{row.share:.1%}", row.basis, str(len(c.rejected)) if c.rejected else "",
        )
    return table


def footer(prediction: Prediction) -> list[str]:
    """Why candidates were skipped, what each source served, what the time column rests
    on, and the total."""
    counts = Counter(r.choice.source for r in prediction.rows)
    lines = _skipped(prediction.rows)
    lines.append(f"{len(prediction.rows)} tasks: "
                 + ", ".join(f"{s} {counts.get(s, 0)}" for s in SOURCES))
    total = prediction.total_s
    if prediction.gflops is not None and total is not None:
        lines.append(
            f"predicted: {MEASURED} = record's mean cost on this device; {ESTIMATED} = FLOPs at "
            f"{prediction.gflops:.1f} GFLOP/s, the median of this device's "
            f"{prediction.measured} measured task(s)")
        lines.append(f"predicted total: {format_seconds(total)}")
    else:
        lines.append(f"predicted: no task was measured on this device, so shares are of "
                     f"FLOPs ({FLOPS_SHARE}), not time")
    if counts.get(THIS_DEVICE, 0) < len(prediction.rows):
        lines.append("tasks not from this device run configs tuned elsewhere or none: "
                     "`tuner tune` them here for a faster build")
    return lines


def build_report(choices: Sequence[Choice], flops: Sequence[float] | None, target: Target,
                 width: int | None = None) -> str:
    """The report as plain text, for a terminal or a log file. ``flops`` as for
    ``predict``; ``width`` wraps the table (a terminal's width), None keeps rows whole."""
    prediction = predict(choices, flops)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width or _UNWRAPPED, color_system=None,
                      highlight=False, emoji=False, soft_wrap=width is None)
    console.print(report_table(prediction, target))
    for line in footer(prediction):
        console.print(line, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


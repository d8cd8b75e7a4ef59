"""AutoTVM's ApplyHistoryBest, written once: which stored record wins for a workload on a
target. Pure code over templates and plain values (no I/O): the server's records/best
and pretuned log, and the compiler's fallback chain, all rank and check through it.

The rule: records with error_no 0 and a finite positive cost only; first the records
of this device (same kind and ``-model``; a target without a model has none), then
those of other devices by each of the target's keys in order; in each tier the cheapest
first, of equal costs the first stored. The first candidate whose config decodes in the
template's current space and fits the device's limits, when they are known, wins.
On this device a measurement of the fleet outranks any imported record (an import
counts there only where nothing was measured); AutoTVM has no such distinction, and a
log file's records are all alike.

Verified records outrank both. When a task's search ends, the scheduler measures its
best configs and the template's default again, interleaved, several rounds: a search
record's cost may have been taken under noise, these are taken side by side. Where this
device has verified records of a workload, its verified configs come first, ranked by
the median of each config's verified costs (a failed round counts as infinitely slow;
of an even count the upper median, so a config that failed half its rounds cannot win),
ties to the first stored; each is tried as its median measurement. The device's other
records follow as before. A log line carries no such mark (AutoTVM's format has no room
for one): logs rank all their lines alike, and a log exported with ``--best`` holds
each workload's verified winner.

A device's records timed with cold weights (a CPU trial's ``cpu_cache_flush`` info: its
weight read from memory, as a layer in a model reads it) rank before those timed warm,
each kind in the order above: a warm cost is up to 1.2-1.4x too low where the weight is
large, so the two do not compare, and the cold one is what a build will see."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

from compiler.templates import UnknownTemplateError, get_template
from compiler.templates.base import ConfigError, Template, WorkloadError
from schemas import Config, DeviceLimits, Target, Workload
from schemas.measure import FAILED_COST, MeasureResult

THIS_DEVICE = "this device"
OTHER_DEVICE = "other device"

NOT_IN_SPACE = "not in config space"
OVER_LIMITS = "over device limits"

T = TypeVar("T")


class Stored(NamedTuple, Generic[T]):
    """One stored record as the rule ranks it, before its config is read; ``item`` is
    the caller's handle on it (a record, a database row id), handed back in ``Ranked``.
    A sequence of these is in storage order: that order breaks ties. A named tuple: a
    lookup of 10,000 workloads makes ~100,000 of them, 3x faster than a frozen
    dataclass."""

    item: T
    target: Target
    cost: float  # mean seconds
    error_no: int
    measured: bool = False  # the fleet's own measurement, not an imported line
    # the config (its identity: the config index) this record measured again in a
    # task's verification; None: a search trial's or an imported record
    verifies: Hashable | None = None
    cold: bool = False  # timed with cold weights (its info's ``cpu_cache_flush``)


@dataclass(frozen=True)
class Ranked(Generic[T]):
    """A candidate placed in its tier: ``source`` and, for other devices, the key matched."""

    source: str  # THIS_DEVICE or OTHER_DEVICE
    key: str | None
    item: T


@dataclass(frozen=True)
class Rejected(Generic[T]):
    """A candidate passed over, and why (NOT_IN_SPACE or OVER_LIMITS)."""

    ranked: Ranked[T]
    reason: str
    detail: str


@dataclass(frozen=True)
class Verdict(Generic[T]):
    """The winner of one workload (None: no stored record may be used) and the
    better-ranked candidates passed over on the way."""

    winner: Ranked[T] | None
    rejected: tuple[Rejected[T], ...]


def cost_of(result: MeasureResult) -> float:
    """The mean cost the rule ranks by: infinite (never usable) unless error_no is 0 and
    every cost is finite and positive, so a -1.0 or NaN never outranks a measurement."""
    if not result.ok or not result.costs or not all(
            math.isfinite(c) and c > 0 for c in result.costs):
        return math.inf
    return result.mean_cost


def usable(entry: Stored[T]) -> bool:
    """Whether the rule ranks the entry at all: error_no 0 and a finite positive cost."""
    return entry.error_no == 0 and math.isfinite(entry.cost) and 0 < entry.cost < FAILED_COST


def same_device(record: Target, target: Target) -> bool:
    """Same kind and ``-model``; a target without a model has no "this device" records."""
    return (target.model != "unknown" and record.kind == target.kind
            and record.model == target.model)


def order(entries: Sequence[Stored[T]], measured_first: bool = False) -> list[Stored[T]]:
    """The usable entries of one tier, best first: (measurements first, when asked)
    cheapest first, of equal costs the first stored."""
    indexed = [(i, e) for i, e in enumerate(entries) if usable(e)]
    indexed.sort(key=lambda p: (measured_first and not p[1].measured, p[1].cost, p[0]))
    return [e for _, e in indexed]


def verified_order(entries: Sequence[Stored[T]]) -> list[Stored[T]]:
    """One device's verified configs, best first, each as its median measurement: by
    the median of the config's verified costs (failures infinite; the upper median of an
    even count), ties to the config first stored; a config whose median failed is left
    out."""
    groups: dict[Hashable, list[tuple[int, Stored[T]]]] = {}
    for i, entry in enumerate(entries):
        if entry.verifies is not None:
            groups.setdefault(entry.verifies, []).append((i, entry))
    ranked: list[tuple[float, int, Stored[T]]] = []
    for members in groups.values():
        costs = sorted(members, key=lambda p: (p[1].cost if usable(p[1]) else math.inf, p[0]))
        _, median = costs[len(costs) // 2]
        if usable(median):
            ranked.append((median.cost, members[0][0], median))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [entry for _, _, entry in ranked]


def device_order(entries: Sequence[Stored[T]]) -> list[Stored[T]]:
    """One device's entries in the order the rule tries them: those timed with cold
    weights, then the others; of each, its verified configs (``verified_order``), then
    its other usable entries, measurements first, cheapest first (``order``)."""
    ordered: list[Stored[T]] = []
    for cold in (True, False):
        timed = [e for e in entries if bool(e.cold) is cold]
        ordered += verified_order(timed) + order([e for e in timed if e.verifies is None],
                                                 measured_first=True)
    return ordered


def rank(entries: Sequence[Stored[T]], target: Target) -> list[Ranked[T]]:
    """One workload's entries in the order ApplyHistoryBest tries them: this device
    (``device_order``: timed cold, then warm; of each verified configs, then measured,
    then imported), then each of ``target.keys`` in order; entries that failed or share
    no key with the target are left out."""
    # each distinct target placed once: a batch's entries share a few target objects
    places: dict[int, tuple[bool, tuple[str, ...]]] = {}
    here: list[Stored[T]] = []
    others: list[Stored[T]] = []
    for entry in entries:
        place = places.get(id(entry.target))
        if place is None:
            place = places[id(entry.target)] = (same_device(entry.target, target),
                                                entry.target.keys)
        (here if place[0] else others).append(entry)
    # this device's are ranked above the others or not at all (a batch of workloads
    # often has only one of the two: nothing to order for the other)
    ranked = ([Ranked(THIS_DEVICE, None, entry.item) for entry in device_order(here)]
              if here else [])
    for key in target.keys if others else ():
        tier: list[Stored[T]] = []
        rest: list[Stored[T]] = []
        for entry in others:
            (tier if key in places[id(entry.target)][1] else rest).append(entry)
        ranked += [Ranked(OTHER_DEVICE, key, entry.item) for entry in order(tier)]
        others = rest  # an entry is placed under the first key it shares (if usable)
    return ranked


def problem(workload: Workload, config: Config,
            limits: DeviceLimits | None) -> tuple[str, str] | None:
    """Why ``config`` may not be used for ``workload`` (reason, detail), or None: it must
    decode in the template's current space and fit ``limits`` when they are known. A
    template this library lacks cannot be checked: its records count as AutoTVM's do."""
    try:
        template = get_template(workload.template)
    except UnknownTemplateError:
        return None
    return _problem(template, workload, config, limits)


@lru_cache(maxsize=65536)
def _problem(template: Template, workload: Workload, config: Config,
             limits: DeviceLimits | None) -> tuple[str, str] | None:
    # Remembered: a pretuned log checks thousands of winners, most of them again on the
    # next fetch; the template object is in the key, so a re-registered one is asked anew.
    try:
        template.decode(workload, config)
    except (ConfigError, WorkloadError) as err:
        return NOT_IN_SPACE, str(err)
    if limits is not None:
        problems = template.check_limits(workload, config, limits)
        if problems:
            return OVER_LIMITS, "; ".join(problems)
    return None


def pick(workload: Workload, ranked: Iterable[Ranked[T]], config_of: Callable[[T], Config | None],
         limits: DeviceLimits | None = None) -> Verdict[T]:
    """The first of ``ranked`` whose config passes ``problem``; ``config_of`` reads a
    candidate's config (None: unreadable, skipped), so a caller may load configs lazily,
    in rank order, only as far as the winner."""
    rejected: list[Rejected[T]] = []
    for cand in ranked:
        config = config_of(cand.item)
        if config is None:
            continue
        why = problem(workload, config, limits)
        if why is None:
            return Verdict(cand, tuple(rejected))
        rejected.append(Rejected(cand, *why))
    return Verdict(None, tuple(rejected))

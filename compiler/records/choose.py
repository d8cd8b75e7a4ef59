"""The fallback chain: AutoTVM's ApplyHistoryBest (this device, then other devices by
target key, cheapest first) plus a validity check, then the template's default config."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.records.source import Candidate, RecordSource
from compiler.templates import ConfigError, get_template
from schemas import Config, DeviceLimits, Record, Target, Workload

THIS_DEVICE = "this device"
OTHER_DEVICE = "other device"
DEFAULT = "default"
SOURCES = (THIS_DEVICE, OTHER_DEVICE, DEFAULT)

NOT_IN_SPACE = "not in config space"
OVER_LIMITS = "over device limits"


@dataclass(frozen=True)
class Rejection:
    """A candidate passed over, and why: the report shows these instead of silence."""

    target: Target
    origin: str
    reason: str  # NOT_IN_SPACE or OVER_LIMITS
    detail: str


@dataclass(frozen=True)
class Choice:
    """The config one task will be built with and how it was decided."""

    workload: Workload
    template: str
    config: Config
    source: str  # one of SOURCES
    record: Record | None
    origin: str | None  # log path, server URL or cache file the record came from
    key: str | None  # the target key that matched, for "other device"
    rejected: tuple[Rejection, ...] = ()

    @property
    def origin_target(self) -> Target | None:
        return self.record.target if self.record is not None else None

    @property
    def cost(self) -> float | None:
        """Measured mean seconds, only when measured on this device (else not comparable)."""
        if self.source == THIS_DEVICE and self.record is not None:
            return self.record.result.mean_cost
        return None

    @property
    def rejected_counts(self) -> dict[str, int]:
        return dict(Counter(r.reason for r in self.rejected))


def _same_device(record: Target, target: Target) -> bool:
    """Same kind and -model; a target without a model has no "this device" records."""
    return record.kind == target.kind and target.model != "unknown" and (
        record.model == target.model)


@dataclass(frozen=True)
class Ranked:
    """A candidate placed in its tier: ``source`` and, for other devices, the key matched."""

    source: str
    key: str | None
    candidate: Candidate


def rank(candidates: Sequence[Candidate], target: Target) -> list[Ranked]:
    """Candidates in the order ApplyHistoryBest would try them: this device,
    then each of ``target.keys`` in order; cheapest first in each tier, ties keep the
    earlier candidate; failed measurements and records sharing no key are left out;
    a record offered twice (server answer and pretuned log) counts once."""
    seen: set[str] = set()
    usable: list[Candidate] = []
    for cand in candidates:
        line = cand.record.to_line()
        if cand.record.result.ok and line not in seen:
            seen.add(line)
            usable.append(cand)
    usable.sort(key=lambda c: c.record.result.mean_cost)
    ranked: list[Ranked] = []
    taken: set[int] = set()
    for i, cand in enumerate(usable):
        if _same_device(cand.record.target, target):
            ranked.append(Ranked(THIS_DEVICE, None, cand))
            taken.add(i)
    for key in target.keys:
        for i, cand in enumerate(usable):
            if i not in taken and key in cand.record.target.keys:
                ranked.append(Ranked(OTHER_DEVICE, key, cand))
                taken.add(i)
    return ranked


def choose_one(workload: Workload, candidates: Sequence[Candidate], target: Target,
               limits: DeviceLimits) -> Choice:
    """The first ranked candidate that decodes in the template's space and fits
    ``limits``; else the template's default config."""
    template = get_template(workload.template)
    rejected: list[Rejection] = []
    for ranked in rank(candidates, target):
        cand = ranked.candidate
        record = cand.record
        try:
            template.decode(workload, record.config)
        except ConfigError as err:
            rejected.append(Rejection(record.target, cand.origin, NOT_IN_SPACE, str(err)))
            continue
        problems = template.check_limits(workload, record.config, limits)
        if problems:
            rejected.append(Rejection(record.target, cand.origin, OVER_LIMITS,
                                      "; ".join(problems)))
            continue
        return Choice(workload, template.name, record.config, ranked.source, record,
                      cand.origin, ranked.key, tuple(rejected))
    return Choice(workload, template.name, template.default_config(workload), DEFAULT, None,
                  None, None, tuple(rejected))


def choose_configs(workloads: Sequence[Workload], source: RecordSource | None,
                   target: Target, limits: DeviceLimits) -> list[Choice]:
    """One Choice per workload, in order; the source is asked once for all of them."""
    by_key: dict[str, list[Candidate]] = {}
    if source is not None:
        for cand in source.candidates(workloads, target):
            by_key.setdefault(cand.record.workload.key, []).append(cand)
    decided: dict[str, Choice] = {}
    for workload in workloads:
        if workload.key not in decided:
            decided[workload.key] = choose_one(workload, by_key.get(workload.key, []), target,
                                               limits)
    return [decided[w.key] for w in workloads]

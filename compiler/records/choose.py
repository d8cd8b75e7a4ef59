"""The fallback chain: the one ApplyHistoryBest rule (``compiler.templates.history``:
this device, then other devices by target key, cheapest first, only configs that decode
and fit), then the template's default config."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.records.source import Candidate, RecordSource
from compiler.templates import get_template
from compiler.templates.history import (
    NOT_IN_SPACE,
    OTHER_DEVICE,
    OVER_LIMITS,
    THIS_DEVICE,
    Ranked,
    Stored,
    cost_of,
    pick,
)
from compiler.templates.history import rank as rank_stored
from schemas import Config, DeviceLimits, Record, Target, Workload
from schemas.record import timed_cold

DEFAULT = "default"
SOURCES = (THIS_DEVICE, OTHER_DEVICE, DEFAULT)

__all__ = ["DEFAULT", "NOT_IN_SPACE", "OTHER_DEVICE", "OVER_LIMITS", "SOURCES", "THIS_DEVICE",
           "Choice", "Rejection", "choose_configs", "choose_one", "rank"]


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


def rank(candidates: Sequence[Candidate], target: Target) -> list[Ranked[Candidate]]:
    """Candidates in the order ApplyHistoryBest tries them (``history.rank``: on this
    device the records timed cold first, of each kind verified configs by their median,
    then the fleet's measurements); a record offered twice (server answer and pretuned
    log) counts once, where first offered, as measured (verified) if either offer is.
    Verified records group by config index."""
    first: dict[str, Candidate] = {}
    measured: set[str] = set()
    verified: set[str] = set()
    for cand in candidates:
        line = cand.record.to_line()
        first.setdefault(line, cand)
        if cand.measured:
            measured.add(line)
        if cand.verified:
            verified.add(line)
    entries = [Stored(cand, cand.record.target, cost_of(cand.record.result),
                      int(cand.record.result.error_no), line in measured,
                      cand.record.config.index if line in verified else None,
                      timed_cold(cand.record.info))
               for line, cand in first.items()]
    return rank_stored(entries, target)


def choose_one(workload: Workload, candidates: Sequence[Candidate], target: Target,
               limits: DeviceLimits | None) -> Choice:
    """The rule's winner among ``candidates`` (``limits`` None: not checked, as the
    server's records/best does); else the template's default config."""
    template = get_template(workload.template)
    verdict = pick(workload, rank(candidates, target), lambda c: c.record.config, limits)
    rejected = tuple(Rejection(r.ranked.item.record.target, r.ranked.item.origin, r.reason,
                               r.detail) for r in verdict.rejected)
    if verdict.winner is None:
        return Choice(workload, template.name, template.default_config(workload, limits), DEFAULT,
                      None, None, None, rejected)
    won = verdict.winner
    return Choice(workload, template.name, won.item.record.config, won.source, won.item.record,
                  won.item.origin, won.key, rejected)


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

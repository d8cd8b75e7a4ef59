"""What a records source is: given workloads and the build target, candidate records."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schemas import Record, Target, Workload


class RecordsWarning(UserWarning):
    """Records were used with a caveat (stale cache, unreadable lines): the build goes on."""


class RecordsError(RuntimeError):
    """Records could not be had; the message says why and what to do (for the CLI)."""


class RecordsUnavailableError(RecordsError):
    """No records can be had at all (server unreachable and nothing cached)."""


@dataclass(frozen=True)
class Candidate:
    """A record and where it came from (log path, server URL, cache file), for the report;
    ``measured``: the fleet's own measurement as a database stores it, which on this
    device outranks imported lines (a log file's lines are all imported); ``verified``:
    a database's verification measurement of its config, which outranks both (ranked by
    the config's median: ``compiler.templates.history``). A log line is never verified:
    AutoTVM's format has no room for the mark."""

    record: Record
    origin: str
    measured: bool = False
    verified: bool = False


class RecordSource(ABC):
    """Anything that can offer records for a build: log files, memory, a server."""

    @abstractmethod
    def candidates(self, workloads: Sequence[Workload], target: Target) -> list[Candidate]:
        """Records for ``workloads`` a build on ``target`` may use, in the source's order.

        A source may return records of any target; choosing among them (this device,
        then other devices by target key, then validity) is the fallback chain's job.
        """


class ChainSource(RecordSource):
    """Several sources asked in turn; on equal cost the earlier source's record wins."""

    def __init__(self, sources: Sequence[RecordSource]) -> None:
        self.sources = tuple(sources)

    def candidates(self, workloads: Sequence[Workload], target: Target) -> list[Candidate]:
        return [c for source in self.sources for c in source.candidates(workloads, target)]

    def __repr__(self) -> str:
        return f"ChainSource({list(self.sources)!r})"

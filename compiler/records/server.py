"""Records from a tuner server: the best record per workload for this exact target,
plus the target's pretuned log, both cached locally (the log revalidated on every
build) so that a build with the server down chooses what it chose online."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from compiler.records.cache import CachedLog, LogCache, format_age
from compiler.records.memory import parse_log
from compiler.records.source import (
    Candidate,
    RecordsError,
    RecordSource,
    RecordsUnavailableError,
    RecordsWarning,
)
from schemas import Record, Target, Workload
from tuner_client import ApiError, BadAnswer, TunerClient, Unavailable

T = TypeVar("T")

# Workloads never cached named in the offline warning; the rest are only counted.
_SHOWN_MISSING = 5

LogState = Literal["downloaded", "not modified", "offline"]


class RecordsServerError(RecordsError):
    """The server answered but refused (bad token, bad request): a user error, not an outage."""


class _Unreachable(Exception):
    """Connection error, timeout or 5xx: the cached copy may stand in."""


@dataclass(frozen=True)
class LogFetch:
    """How the last build got its pretuned log: fresh, revalidated (304) or from cache;
    and, when the server's best-record answers were missing, how many workloads had a
    cached answer instead and which had none (those get no other device's record)."""

    target: Target
    state: LogState
    path: Path
    age_s: float
    records: int
    cached_answers: int = 0
    never_cached: tuple[Workload, ...] = ()


class ServerSource(RecordSource):
    """A tuner server over HTTP, through ``tuner_client`` (the compiler never imports the
    server's code)."""

    def __init__(self, url: str, token: str | None = None, cache_dir: Path | None = None,
                 timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.cache = LogCache(cache_dir)
        self.timeout = timeout
        self.last_fetch: LogFetch | None = None

    def __repr__(self) -> str:
        return f"ServerSource({self.url!r})"

    def candidates(self, workloads: Sequence[Workload], target: Target) -> list[Candidate]:
        unique = list({w.key: w for w in workloads}.values())
        # No retries: an outage falls back to the cache at once.
        with TunerClient(self.url, self.token, timeout=self.timeout, retries=0) as api:
            try:
                log, origin = self._pretuned_log(api, target)
            except _Unreachable as err:
                log, origin, outage = self._offline_log(target, str(err))
                fresh: dict[str, Record | None] = {}
                failure: str | None = outage
            else:
                fresh, failure = self._best(api, unique, target)
            online = api.url_of("records/best")
        if fresh:
            self.cache.save_answers(self.url, target, fresh)
        best = [Candidate(r, online) for r in fresh.values() if r is not None]
        if failure is not None:
            best += self._cached_best([w for w in unique if w.key not in fresh], target,
                                      failure)
        wanted = {w.key for w in unique}
        pretuned = [Candidate(r, origin) for r in parse_log(log.text.splitlines(), origin)
                    if r.workload.key in wanted]
        return best + pretuned

    def _best(self, api: TunerClient, unique: Sequence[Workload],
              target: Target) -> tuple[dict[str, Record | None], str | None]:
        """Server-side ApplyHistoryBest, by workload key (None: no record): it may offer
        another device's record the pretuned log (this model only) lacks. On an outage,
        no answers and why they are missing."""
        where = api.url_of("records/best")
        try:
            items = _checked(lambda: api.best(target, unique))
            return {item.workload.key: (None if item.record is None
                                        else Record.from_json(item.record))
                    for item in items}, None
        except _Unreachable as err:
            return {}, f"{where}: {err}"
        except (BadAnswer, ValueError, TypeError) as err:  # the body, the record format
            raise RecordsServerError(
                f"{where}: not a best-records answer ({type(err).__name__}: {err}); "
                "is this a tuner server?") from None

    def _cached_best(self, asked: Sequence[Workload], target: Target,
                     failure: str) -> list[Candidate]:
        """The cached answers for workloads the server did not answer now, with one
        warning that says how many were cached, how old, and which never were."""
        cached = self.cache.load_answers(self.url, target)
        hits = [cached[w.key] for w in asked if w.key in cached]
        missing = tuple(w for w in asked if w.key not in cached)
        path = self.cache.answers_path_for(self.url, target)
        note = f"{len(hits)} workload(s) from cached server answers"
        if hits:
            oldest = format_age(max(a.age() for a in hits))
            note += f", oldest {oldest} old ({path})"
        if missing:
            shown = "; ".join(w.key for w in missing[:_SHOWN_MISSING])
            more = (f" (and {len(missing) - _SHOWN_MISSING} more)"
                    if len(missing) > _SHOWN_MISSING else "")
            note += (f"; {len(missing)} never cached, so no other device's record for: "
                     f"{shown}{more}")
        warnings.warn(f"{failure}; {note}", RecordsWarning, stacklevel=3)
        if self.last_fetch is not None:
            self.last_fetch = replace(self.last_fetch, cached_answers=len(hits),
                                      never_cached=missing)
        return [Candidate(a.record, f"{path} (cached, {format_age(a.age())} old)")
                for a in hits if a.record is not None]

    def _pretuned_log(self, api: TunerClient, target: Target) -> tuple[CachedLog, str]:
        """The log and the origin to report, revalidated with its ETag; raises
        _Unreachable when the server cannot be reached."""
        cached = self.cache.load(self.url, target)
        fetched = _checked(lambda: api.pretuned_log(target, cached.etag if cached else None))
        state: LogState
        if fetched.text is None and cached is not None:
            cached, state = self.cache.confirm(cached), "not modified"
        else:
            cached, state = self.cache.save(self.url, target, fetched.text or "",
                                            fetched.etag), "downloaded"
        self._note(target, state, cached)
        return cached, api.url_of(f"logs/{target}")

    def _offline_log(self, target: Target, err: str) -> tuple[CachedLog, str, str]:
        """The cached log as is, its origin, and the outage to warn about."""
        cached = self.cache.load(self.url, target)
        if cached is None:
            raise RecordsUnavailableError(
                f"no records for {target}: tuner server {self.url} cannot be reached "
                f"({err}) and there is no cached pretuned log "
                f"({self.cache.path_for(self.url, target)}). Start or reach the server "
                "once, or pass a log file with --records."
            ) from None
        age = format_age(cached.age())
        self._note(target, "offline", cached)
        outage = (f"tuner server {self.url} cannot be reached ({err}); using the cached "
                  f"pretuned log for {target} as is, last confirmed {age} ago ({cached.path})")
        return cached, f"{cached.path} (cached, {age} old)", outage

    def _note(self, target: Target, state: LogState, cached: CachedLog) -> None:
        records = sum(1 for line in cached.text.splitlines()
                      if line.strip() and not line.lstrip().startswith("#"))
        self.last_fetch = LogFetch(target, state, cached.path, cached.age(), records)


def _checked(request: Callable[[], T]) -> T:
    """``request()``'s answer. An outage (no answer, any 5xx) raises :class:`_Unreachable`
    (the cache may stand in); any other refusal (a bad token, a bad request) raises
    :class:`RecordsServerError`: a user error, not an outage."""
    try:
        return request()
    except BadAnswer:
        raise
    except ApiError as err:
        if isinstance(err, Unavailable) or (err.status or 0) >= 500:
            raise _Unreachable(f"HTTP {err.status}" if err.status else err.detail) from None
        raise RecordsServerError(f"{err.method} {err.url}{err.path}: server answered "
                                 f"{err.status}: {err.detail}") from None

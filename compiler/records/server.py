"""Records from a tuner server: the best record per workload for this exact target,
plus the target's pretuned log, cached locally and revalidated on every build."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

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

# POST /api/v1/records/best takes at most this many workloads a request.
_BEST_BATCH = 10000

LogState = Literal["downloaded", "not modified", "offline"]


class RecordsServerError(RecordsError):
    """The server answered but refused (bad token, bad request): a user error, not an outage."""


class _Unreachable(Exception):
    """Connection error, timeout or 5xx: the cached copy may stand in."""


@dataclass(frozen=True)
class LogFetch:
    """How the last build got its pretuned log: fresh, revalidated (304) or from cache."""

    target: Target
    state: LogState
    path: Path
    age_s: float
    records: int


class ServerSource(RecordSource):
    """A tuner server over HTTP (the compiler never imports the server's code)."""

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
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        with httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout) as client:
            log, origin, state = self._pretuned_log(client, target)
            best = self._best(client, workloads, target) if state != "offline" else []
        wanted = {w.key for w in workloads}
        pretuned = [Candidate(r, origin) for r in parse_log(log.text.splitlines(), origin)
                    if r.workload.key in wanted]
        return best + pretuned

    def _best(self, client: httpx.Client, workloads: Sequence[Workload],
              target: Target) -> list[Candidate]:
        """Server-side ApplyHistoryBest: it may offer another device's record the
        pretuned log (this model only) lacks."""
        unique = list({w.key: w for w in workloads}.values())
        origin = f"{self.url}/api/v1/records/best"
        out: list[Candidate] = []
        for start in range(0, len(unique), _BEST_BATCH):
            body = {"target": str(target),
                    "workloads": [w.model_dump(mode="json")
                                  for w in unique[start:start + _BEST_BATCH]]}
            try:
                response = self._send(client, "POST", "/api/v1/records/best", json=body)
            except _Unreachable as err:
                warnings.warn(f"{origin}: {err}; using the pretuned log only", RecordsWarning,
                              stacklevel=3)
                return out
            for item in response.json()["items"]:
                if item["record"] is not None:
                    out.append(Candidate(Record.from_json(item["record"]), origin))
        return out

    def _pretuned_log(self, client: httpx.Client,
                      target: Target) -> tuple[CachedLog, str, LogState]:
        """The log, the origin to report and how it was had: revalidated with
        If-None-Match, or the cached copy as is when the server cannot be reached."""
        cached = self.cache.load(self.url, target)
        path = f"/api/v1/logs/{quote(str(target), safe='=,')}"
        headers = {"If-None-Match": cached.etag} if cached and cached.etag else {}
        try:
            response = self._send(client, "GET", path, headers=headers)
        except _Unreachable as err:
            if cached is None:
                raise RecordsUnavailableError(
                    f"no records for {target}: tuner server {self.url} cannot be reached "
                    f"({err}) and there is no cached pretuned log "
                    f"({self.cache.path_for(self.url, target)}). Start or reach the server "
                    "once, or pass a log file with --records."
                ) from None
            age = format_age(cached.age())
            warnings.warn(
                f"tuner server {self.url} cannot be reached ({err}); using the cached "
                f"pretuned log for {target} as is, last confirmed {age} ago ({cached.path})",
                RecordsWarning, stacklevel=3)
            self._note(target, "offline", cached)
            return cached, f"{cached.path} (cached, {age} old)", "offline"
        state: LogState
        if response.status_code == 304 and cached is not None:
            cached, state = self.cache.confirm(cached), "not modified"
        else:
            cached, state = self.cache.save(self.url, target, response.text,
                                            response.headers.get("ETag")), "downloaded"
        self._note(target, state, cached)
        return cached, f"{self.url}/api/v1/logs/{target}", state

    def _note(self, target: Target, state: LogState, cached: CachedLog) -> None:
        records = sum(1 for line in cached.text.splitlines()
                      if line.strip() and not line.lstrip().startswith("#"))
        self.last_fetch = LogFetch(target, state, cached.path, cached.age(), records)

    def _send(self, client: httpx.Client, method: str, path: str,
              headers: dict[str, str] | None = None, json: Any = None) -> httpx.Response:
        try:
            response = client.request(method, path, headers=headers, json=json)
        except httpx.TransportError as err:
            raise _Unreachable(f"{type(err).__name__}: {err}") from None
        if response.status_code >= 500:
            raise _Unreachable(f"HTTP {response.status_code}")
        if response.is_error:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise RecordsServerError(
                f"{method} {self.url}{path}: server answered {response.status_code}: {detail}")
        return response

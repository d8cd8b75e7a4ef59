"""The local copy of a server's pretuned log: one file per (server, target) and its ETag,
so a build revalidates cheaply, plus the server's best-record answers beside it, so a
build with the server down still chooses what it chose online."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.records.source import RecordsWarning
from schemas import Record, Target


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tuner/logs``, else ``~/.cache/tuner/logs`` (the XDG default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner" / "logs"


def format_age(seconds: float) -> str:
    """A human age: '40 s', '12 min', '3 h 5 min', '2 days'."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days"


@dataclass(frozen=True)
class CachedLog:
    """A cached pretuned log; ``confirmed_at`` is when the server last vouched for it."""

    path: Path
    text: str
    etag: str | None
    confirmed_at: float

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.confirmed_at


@dataclass(frozen=True)
class CachedAnswer:
    """The server's best record for one workload (None: it had none) and when it said so."""

    record: Record | None
    answered_at: float

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.answered_at


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text).strip("_")[:80]


class LogCache:
    """Pretuned logs and best-record answers on disk, keyed by server URL and target."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory if directory is not None else default_cache_dir()

    def path_for(self, server: str, target: Target) -> Path:
        # Readable names for people who look in the folder, a hash so that two servers
        # or targets slugging alike never share a file.
        digest = hashlib.sha256(f"{server}\n{target}".encode()).hexdigest()[:10]
        host = _slug(server.split("://", 1)[-1])
        return self.directory / f"{host}__{_slug(str(target))}__{digest}.log"

    def load(self, server: str, target: Target) -> CachedLog | None:
        path = self.path_for(server, target)
        try:
            text = path.read_text()
            confirmed_at = path.stat().st_mtime
        except FileNotFoundError:
            return None
        etag_path = path.with_suffix(".etag")
        etag = etag_path.read_text().strip() if etag_path.is_file() else ""
        return CachedLog(path, text, etag or None, confirmed_at)

    def save(self, server: str, target: Target, text: str, etag: str | None) -> CachedLog:
        """Write the log, then its ETag, each atomically: a crash between the two leaves
        an old ETag beside a new log, which only costs one extra download."""
        path = self.path_for(server, target)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, text)
        _write_atomic(path.with_suffix(".etag"), etag or "")
        return CachedLog(path, text, etag, path.stat().st_mtime)

    def confirm(self, cached: CachedLog) -> CachedLog:
        """The server answered 304: the copy is current as of now."""
        now = time.time()
        os.utime(cached.path, (now, now))
        return CachedLog(cached.path, cached.text, cached.etag, now)

    def answers_path_for(self, server: str, target: Target) -> Path:
        return self.path_for(server, target).with_suffix(".best.json")

    def load_answers(self, server: str, target: Target) -> dict[str, CachedAnswer]:
        """Cached answers by workload key; an unreadable file counts as none (with a
        warning): it is only a cache, and the next online build rewrites it."""
        path = self.answers_path_for(server, target)
        try:
            data = json.loads(path.read_text())
            return {key: CachedAnswer(None if item["record"] is None
                                      else Record.from_json(item["record"]),
                                      float(item["answered_at"]))
                    for key, item in data["answers"].items()}
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            warnings.warn(f"{path}: unreadable cached server answers ({type(err).__name__}: "
                          f"{err}); ignored", RecordsWarning, stacklevel=2)
            return {}

    def save_answers(self, server: str, target: Target,
                     fresh: Mapping[str, Record | None]) -> None:
        """Merge ``fresh`` into the cached answers and write them atomically: workloads
        another build asked about keep their answer, fresh answers replace old ones."""
        now = time.time()
        answers = {**self.load_answers(server, target),
                   **{key: CachedAnswer(record, now) for key, record in fresh.items()}}
        body: dict[str, Any] = {"server": server, "target": str(target), "answers": {
            key: {"record": None if a.record is None else a.record.to_json(),
                  "answered_at": a.answered_at}
            for key, a in answers.items()}}
        path = self.answers_path_for(server, target)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(body, indent=1) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

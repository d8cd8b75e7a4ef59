"""Turn a ``--records`` argument into a source: URL -> server, file -> log, several -> chain."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compiler.records.memory import LogSource
from compiler.records.server import ServerSource
from compiler.records.source import ChainSource, RecordSource

Spec = str | Path | RecordSource


def open_source(spec: Spec | Sequence[Spec], token: str | None = None,
                cache_dir: Path | None = None) -> RecordSource:
    """One source for ``spec``: ``http(s)://`` URL, an existing log file, a source
    object, or several of these (a comma-separated string or a list), asked in order."""
    items: list[Spec] = []
    for item in ([spec] if isinstance(spec, (str, Path, RecordSource)) else list(spec)):
        if isinstance(item, str):
            items += [part.strip() for part in item.split(",") if part.strip()]
        else:
            items.append(item)
    if not items:
        raise ValueError("--records: no source given (a server URL or a log file)")
    sources = [_one(item, token, cache_dir) for item in items]
    return sources[0] if len(sources) == 1 else ChainSource(sources)


def _one(item: Spec, token: str | None, cache_dir: Path | None) -> RecordSource:
    if isinstance(item, RecordSource):
        return item
    text = str(item)
    if text.startswith(("http://", "https://")):
        return ServerSource(text, token=token, cache_dir=cache_dir)
    if Path(text).is_file():
        return LogSource(Path(text))
    raise ValueError(f"--records {text!r}: neither an http(s):// server URL nor an existing "
                     "log file")

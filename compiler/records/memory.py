"""Records held in memory: a list of Records (the embedded database's export) or
AutoTVM ``.log`` files read once."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from compiler.records.source import Candidate, RecordSource, RecordsWarning
from schemas import Record, RecordFormatError, Target, Workload
from schemas.record import read_lines

# Bad lines named in a warning; the rest are only counted.
_SHOWN_ERRORS = 3


def parse_log(lines: Iterable[str], origin: str) -> list[Record]:
    """The valid records of AutoTVM log lines; bad lines are skipped with one warning,
    since one mangled line should not cost a build every other record."""
    records: list[Record] = []
    errors: list[str] = []
    for number, item in read_lines(lines):
        if isinstance(item, RecordFormatError):
            errors.append(f"line {number}: {item}")
        else:
            records.append(item)
    if errors:
        shown = "; ".join(errors[:_SHOWN_ERRORS])
        more = f" (and {len(errors) - _SHOWN_ERRORS} more)" if len(errors) > _SHOWN_ERRORS else ""
        warnings.warn(f"{origin}: skipped {len(errors)} unreadable line(s): {shown}{more}",
                      RecordsWarning, stacklevel=3)
    return records


class MemorySource(RecordSource):
    """Records indexed by workload key, kept in the order they were added."""

    def __init__(self, records: Iterable[Record] = (), origin: str = "in memory") -> None:
        self._by_key: dict[str, list[Candidate]] = {}
        self.add(records, origin)

    def add(self, records: Iterable[Record], origin: str) -> None:
        for record in records:
            self._by_key.setdefault(record.workload.key, []).append(Candidate(record, origin))

    def candidates(self, workloads: Sequence[Workload], target: Target) -> list[Candidate]:
        keys = dict.fromkeys(w.key for w in workloads)
        return [c for key in keys for c in self._by_key.get(key, ())]

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())


class LogSource(MemorySource):
    """AutoTVM log files (JSON lines, ``#`` comments), read when the source is made."""

    def __init__(self, paths: str | Path | Sequence[str | Path]) -> None:
        super().__init__()
        items = [paths] if isinstance(paths, (str, Path)) else list(paths)
        self.paths = tuple(Path(p) for p in items)
        for path in self.paths:
            try:
                text = path.read_text()
            except OSError as err:
                raise FileNotFoundError(f"records log {path}: {err.strerror or err}") from None
            self.add(parse_log(text.splitlines(), str(path)), str(path))

    def __repr__(self) -> str:
        return f"LogSource({[str(p) for p in self.paths]!r})"

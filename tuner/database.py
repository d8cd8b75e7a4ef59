"""``tuner.Database``: a tuning database's records, read and written directly (no server
running), with the record methods of :class:`tuner.Client`, so that code (and the
``tuner records`` command) works the same on either."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Self

from schemas import Record, Target, Workload
from schemas.api import BestItem, ImportResponse, RecordSummary
from tuner.client import TunerError
from tuner.embedded import default_database_url, sqlite_path

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session

PAGE = 10_000  # records read at a time by export


class NoDatabase(TunerError):
    """The database does not exist, or has no schema of this version: the message says
    which; ``Database(url, create=True)`` creates or migrates it."""


class Database:
    """The records of the tuning database at ``url`` (default: ``TUNER_DATABASE_URL``,
    else the embedded SQLite file ``tuner.tune`` writes). ``create``: create the schema
    (or migrate it to this version) on first use; otherwise a missing database or an
    older schema is a :class:`NoDatabase` error."""

    def __init__(self, url: str | None = None, create: bool = False) -> None:
        self.url = url or default_database_url()
        self.create = create
        self._engine: Engine | None = None

    def __repr__(self) -> str:
        return f"Database({self.url!r})"

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        """A session on the database (a transaction committed at the end if ``write``)."""
        from tuner_server.db.session import (
            SchemaError,
            check_schema,
            make_engine,
            session_factory,
            upgrade,
        )

        if self._engine is None:
            path = sqlite_path(self.url)
            if path is not None and not path.exists() and not self.create:
                raise NoDatabase(f"no database at {path}")  # connecting would create it
            engine = make_engine(self.url)
            try:
                if self.create:
                    upgrade(engine)
                check_schema(engine, self.url)
            except SchemaError as err:
                engine.dispose()
                raise NoDatabase(str(err)) from None
            self._engine = engine
        sessions = session_factory(self._engine)
        if write:
            with sessions.begin() as session:
                yield session
        else:
            with sessions() as session:
                yield session

    def records(self, target: str | Target | None = None,
                workload: Workload | None = None) -> list[Record]:
        """Every stored record (of a target's kind, or kind and model; of a workload),
        oldest first."""
        return list(self._records(target, workload))

    def _records(self, target: str | Target | None = None,
                 workload: Workload | None = None) -> Iterator[Record]:
        from tuner_server.services.records import query

        tgt = _target(target) if target is not None else None
        with self._session() as session:
            offset = 0
            while True:
                total, page = query(session, tgt, workload=workload, limit=PAGE,
                                    offset=offset)
                yield from page
                offset += PAGE
                if not page or offset >= total:
                    return

    def search(self, target: str | Target | None = None, template: str | None = None,
               workload: str | None = None, best: bool = True,
               limit: int = 100) -> list[RecordSummary]:
        """The dashboard's search (``workload``: a substring of the key, e.g. 1,64,56,56);
        ``best``: only the best record per device model and workload."""
        from tuner_server.services.records import search

        with self._session() as session:
            return search(session, _target(target) if target is not None else None,
                          template, workload, best, limit)[1]

    def best(self, target: str | Target, workloads: Sequence[Workload]) -> list[BestItem]:
        """The best record of each workload for ``target`` (AutoTVM's ApplyHistoryBest
        rule, as the server's ``records/best``), in the order asked."""
        from tuner_server.services.records import best

        with self._session() as session:
            return [a.item() for a in best(session, workloads, _target(target))]

    def import_log(self, path: str | Path) -> ImportResponse:
        """Store an AutoTVM log file as imported records (lines already stored count as
        duplicates)."""
        return self.import_lines(Path(path).read_text().splitlines())

    def import_lines(self, lines: str | Iterable[str]) -> ImportResponse:
        """Store AutoTVM log lines (a text, or its lines) as imported records; line
        numbers in the answer count from the first line given."""
        from tuner_server.services.records import import_lines

        given = lines.split("\n") if isinstance(lines, str) else lines
        with self._session(write=True) as session:
            report = import_lines(session, given)
        return report.answer()

    def export(self, target: str | Target | None = None) -> str:
        """Every stored record (of a target's kind, or kind and model) as AutoTVM lines."""
        return "".join(r.to_line() + "\n" for r in self._records(target))

    def pretuned_log(self, target: str | Target) -> str:
        """The target's pretuned log: its best record per workload, AutoTVM lines."""
        from tuner_server.services.records import pretuned_log

        with self._session() as session:
            lines, _etag = pretuned_log(session, _target(target))
        return "".join(line + "\n" for line in lines)


def _target(target: str | Target) -> Target:
    return target if isinstance(target, Target) else Target.parse(target)


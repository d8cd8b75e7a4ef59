"""Records sources for ``tuner.build`` and ``tuner.apply_history_best``, one per origin:
a server, AutoTVM log files, a database, the embedded database, the shipped pretuned
logs; ``chain`` asks several in turn (on equal cost the earlier one's record wins)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compiler.records import (
    TOPHUB_DIR,
    Candidate,
    ChainSource,
    LogSource,
    RecordsError,
    RecordSource,
    ServerSource,
    open_source,
)
from schemas import Target, Workload
from tuner.client import Client
from tuner.embedded import default_database_url, sqlite_path

__all__ = [
    "DatabaseSource",
    "RecordSource",
    "chain",
    "database",
    "embedded",
    "log",
    "pretuned",
    "server",
    "source",
]


class DatabaseSource(RecordSource):
    """A tuning database read directly (no server running): every target's records of
    the workloads a build asks about. A SQLite file that does not exist has none."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"DatabaseSource({self.url!r})"

    def candidates(self, workloads: Sequence[Workload], target: Target) -> list[Candidate]:
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            return []  # nothing tuned here yet; connecting would create the file
        from sqlalchemy.exc import SQLAlchemyError

        from tuner_server.db.session import (
            SchemaError,
            check_schema,
            make_engine,
            session_factory,
        )
        from tuner_server.services.records import stored_of

        origin = f"database {self.url}"
        engine = make_engine(self.url)
        try:
            check_schema(engine, self.url)
            with session_factory(engine)() as session:
                return [Candidate(record, origin, measured, verified)
                        for record, measured, verified in stored_of(session, workloads)]
        except SchemaError as err:
            raise RecordsError(str(err)) from None
        except SQLAlchemyError as err:
            raise RecordsError(f"{origin}: {type(err).__name__}: "
                               f"{str(err).splitlines()[0]}") from None
        finally:
            engine.dispose()


def server(url: str | Client | None = None, token: str | None = None,
           cache_dir: Path | None = None) -> ServerSource:
    """A tuning server's best records and pretuned log for the build's target, cached so
    that a build with the server down chooses what it chose online. ``url`` may be a
    :class:`tuner.Client` (its URL and token)."""
    if not isinstance(url, Client):
        with Client(url, token) as client:  # its defaults (TUNER_SERVER, TUNER_TOKEN), checks
            return ServerSource(client.url, token=client.token, cache_dir=cache_dir)
    return ServerSource(url.url, token=token or url.token, cache_dir=cache_dir)


def log(*paths: str | Path) -> LogSource:
    """AutoTVM log files (what ``tuner.callbacks.log_to_file`` and AutoTVM write)."""
    if not paths:
        raise ValueError("tuner.records.log: give at least one log file")
    return LogSource(list(paths))


def database(url: str | None = None) -> DatabaseSource:
    """A tuning database by SQLAlchemy URL (default: ``TUNER_DATABASE_URL``, else the
    embedded SQLite file)."""
    return DatabaseSource(url or default_database_url())


def embedded() -> DatabaseSource:
    """The embedded database: what ``tuner.tune`` without a server wrote."""
    return DatabaseSource(default_database_url())


def pretuned() -> LogSource:
    """TopHub's pretuned logs shipped with the package (CUDA, ROCm, OpenCL, LLVM):
    offline, for any target; the build's fallback chain picks this device's records."""
    return LogSource(sorted(TOPHUB_DIR.glob("*.log")))


def chain(*sources: RecordSource) -> ChainSource:
    """Several sources asked in turn; on equal cost the earlier source's record wins."""
    return ChainSource(sources)


def source(spec: str | Path | RecordSource | Sequence[str | Path | RecordSource],
           token: str | None = None) -> RecordSource:
    """What ``--records`` takes: a server URL, a log file, a source, or several of
    these (a comma-separated string or a list), asked in order."""
    return open_source(spec, token=token)

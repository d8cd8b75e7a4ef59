"""Engines, sessions and the schema check the server runs before it starts."""

from __future__ import annotations

import select
import sys
from pathlib import Path
from typing import Any

from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

import migrations


class SchemaError(RuntimeError):
    """The database's schema is not the one this code knows."""


def make_engine(url: str, pool_size: int | None = None) -> Engine:
    """An engine for ``url``; on PostgreSQL a pool of ``pool_size`` connections (default
    POOL_SIZE; a server process takes its share, ``connection_share``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record):  # type: ignore[no-untyped-def]
            conn.isolation_level = None  # we issue BEGIN ourselves, below
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")

        @event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            # Take the write lock up front: a read-then-write transaction that lost a
            # race would otherwise fail with SQLITE_BUSY_SNAPSHOT instead of waiting.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    # No pre-ping (a round trip on every checkout, i.e. every request): a connection the
    # server has dropped is found at checkout by a look at its socket instead, and one
    # that fails anyway is invalidated with the whole pool by SQLAlchemy's disconnect
    # handling (the request answers 503 and is retried). pool_recycle retires
    # connections before idle timeouts between here and the server end them silently.
    # All POOL_SIZE connections are kept once opened, none over it: a pool of 10 with 20
    # overflowing closed each connection past the tenth when it came back, so a loaded
    # server (requests in 40 threads) opened ~15 PostgreSQL connections a second, a
    # backend forked and its statements prepared anew each time.
    engine = create_engine(url, pool_pre_ping=False, pool_recycle=RECYCLE_S,
                           pool_size=pool_size or POOL_SIZE, max_overflow=0)
    event.listen(engine, "checkout", _drop_if_closed_by_server)
    return engine


# Seconds a pooled connection is kept before it is replaced (at its next checkout).
RECYCLE_S = 1800
# Connections a server process holds at most (records/best's reader has its own
# READER_CONNECTIONS): a request past them waits for one to come back (SQLAlchemy's
# pool timeout, then 503), as it did past 10 + 20 overflowing.
POOL_SIZE = 30
READER_CONNECTIONS = 10
# PostgreSQL connections the server processes leave to everything else: migrations, the
# CLI's commands, an operator's psql.
HEADROOM = 10
# The fewest a process works with: the scheduler's and a few requests', the reader's 2.
MIN_CONNECTIONS = 6


class ConnectionBudgetError(ValueError):
    """PostgreSQL allows too few connections for the server processes asked for."""


def connection_share(engine: Engine, processes: int, asked: int | None = None) -> int:
    """The connections one of ``processes`` server processes may hold on ``engine``'s
    PostgreSQL (its pool and its reader's together): ``asked`` (TUNER_DB_CONNECTIONS),
    else the server's ``max_connections`` less the slots reserved for superusers (and,
    from PostgreSQL 16, for ``pg_use_reserved_connections``) and HEADROOM, split
    evenly, at most the POOL_SIZE + READER_CONNECTIONS a process holds alone. Four
    processes of 40 each had 160 for PostgreSQL's default 100: under a fleet's load,
    requests failed with "too many clients already". Raises ConnectionBudgetError below
    MIN_CONNECTIONS, or where ``asked`` times ``processes`` is more than that budget
    (other hosts' servers, other databases and a role's own limit are not known here)."""
    with engine.connect() as conn:
        limit, superusers, reserved = conn.exec_driver_sql(
            "SELECT current_setting('max_connections')::int,"
            " current_setting('superuser_reserved_connections')::int,"
            " coalesce(current_setting('reserved_connections', true), '0')::int").one()
    usable = limit - superusers - reserved - HEADROOM
    budget = (f"PostgreSQL allows {limit} connections ({superusers + reserved} reserved, "
              f"{HEADROOM} left to other clients)")
    if asked is not None:
        if asked < MIN_CONNECTIONS or asked * processes > usable:
            raise ConnectionBudgetError(
                f"TUNER_DB_CONNECTIONS={asked}: a server process needs at least "
                f"{MIN_CONNECTIONS}, and {processes} of them may hold {max(usable, 0)} "
                f"together ({budget}); set it between {MIN_CONNECTIONS} and "
                f"{max(usable, 0) // processes}, or unset it")
        return asked
    share = min(POOL_SIZE + READER_CONNECTIONS, usable // max(processes, 1))
    if share < MIN_CONNECTIONS:
        raise ConnectionBudgetError(
            f"{budget}: {processes} server process(es) would get {max(share, 0)} each, "
            f"fewer than the {MIN_CONNECTIONS} one needs; raise max_connections or run "
            "fewer server processes (tuner serve --workers)")
    return share


def split_connections(total: int) -> tuple[int, int]:
    """(pool, reader) of a process's ``total`` connections (at least MIN_CONNECTIONS,
    ``connection_share``): a quarter to records/best's reader (2 to READER_CONNECTIONS),
    the rest to the pool (at most POOL_SIZE)."""
    if total < MIN_CONNECTIONS:
        raise ValueError(f"{total} connections: a server process needs {MIN_CONNECTIONS}")
    reader = max(2, min(READER_CONNECTIONS, total // 4))
    return min(POOL_SIZE, total - reader), reader


def _drop_if_closed_by_server(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """At checkout, refuse a connection whose socket has something to read: an idle
    PostgreSQL connection is sent nothing unless the server is ending it (a restart, a
    terminated backend: an error message, then EOF). Refusing raises DisconnectionError,
    on which the pool connects afresh; a poll of the socket costs microseconds, where a
    pre-ping costs a round trip."""
    fileno = getattr(dbapi_conn, "fileno", None)
    if fileno is None:
        return
    try:
        fd = fileno()
    except Exception as err:  # noqa: BLE001 - the driver says it is closed already
        raise DisconnectionError(f"connection unusable: {err}") from err
    if fd < 0:
        raise DisconnectionError("connection closed")
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        readable = bool(poller.poll(0))
    else:  # Windows: no poll(); select() takes sockets there
        readable = bool(select.select([fd], [], [], 0)[0])
    if readable:
        raise DisconnectionError("the server closed the connection while it was pooled")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def reader_engine(engine: Engine, connections: int = READER_CONNECTIONS) -> Engine:
    """An engine for the route that only reads records (records/best), beside
    ``engine``: on PostgreSQL its own small pool of connections in autocommit, so a
    lookup's statements run without BEGIN and ROLLBACK, two of a single lookup's four
    round trips (in-process p50/p99 4.6/9.8 -> 3.7/6.0 ms, 100,000 records). Under READ
    COMMITTED each statement took its own snapshot anyway, so the answers are the same.
    Its plans take no parallel workers: a batch's tier is one scan a Gather would split,
    and its workers took 100-170 ms to start and hand back 15,000 rows where the scan
    alone took ~100 ms (10,000 workloads, 100,000 records, 2 cores). Its sorts get 64 MB
    before they spill to disk: a batch's ranking of other devices' candidates sorts ~75,000
    rows (20 MB), which PostgreSQL's default 4 MB sent through temporary files. A
    statement is prepared only where the code says so (psycopg's automatic preparing,
    after 5 runs on a connection, is off): a batch's tier query, prepared automatically,
    had been switched by PostgreSQL to a generic plan, made for a few workloads, that
    took 17 s for 10,000 where its own plan takes 0.07 s. A statement not prepared is
    parsed anew each time, so PostgreSQL plans it for its values (``plan_cache_mode``
    auto: a statement's first 5 plans are custom; ``force_generic_plan`` would apply to
    these unnamed statements too). The one statement prepared is a single workload's
    lookup (``services.records._few_candidates``), whose planning cost as much as its
    run: after its first 5 runs on a connection PostgreSQL keeps its generic plan, whose
    estimate is no worse than the custom ones'. At most 10 connections:
    lookups hold one for milliseconds (``connections``: fewer where a process's share of
    the server's connections is smaller). Elsewhere ``engine`` itself (SQLite takes its
    lock at BEGIN, ``make_engine``)."""
    if engine.dialect.name != "postgresql":
        return engine
    kept = min(5, connections)
    reader = create_engine(engine.url, isolation_level="AUTOCOMMIT", pool_pre_ping=False,
                           pool_recycle=RECYCLE_S, pool_size=kept,
                           max_overflow=connections - kept,
                           connect_args={"options": "-c max_parallel_workers_per_gather=0 "
                                                      "-c work_mem=64MB",
                                         # never by itself (psycopg's None would refuse
                                         # the explicit ``prepare=True`` too)
                                         "prepare_threshold": sys.maxsize})
    event.listen(reader, "checkout", _drop_if_closed_by_server)
    return reader


def _alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str | None]:
    """Migrate to head; returns (revision before, revision after)."""
    from alembic import command

    before = current_revision(engine)
    cfg = _alembic_config(str(engine.url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return before, current_revision(engine)


def check_schema(engine: Engine, url_for_message: str) -> None:
    """Refuse a database whose revision is not this code's head, saying what fixes it."""
    have, want = current_revision(engine), head_revision()
    if have == want:
        return
    fix = f"tuner db upgrade --database-url '{url_for_message}'"
    if have is None:
        raise SchemaError(f"the database has no schema yet; run: {fix}")
    known = {s.revision for s in ScriptDirectory.from_config(
        _alembic_config(url_for_message)).walk_revisions()}
    if have not in known:
        raise SchemaError(
            f"the database is at schema revision {have!r}, which this version does not know "
            f"(newest known: {want!r}); upgrade the tuner package")
    raise SchemaError(f"the database is at schema revision {have!r}, not {want!r}; run: {fix}")

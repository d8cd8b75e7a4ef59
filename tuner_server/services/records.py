"""The records database: import AutoTVM lines, query, pick the best (ApplyHistoryBest)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from typing import Any

from sqlalchemy import (
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    not_,
    or_,
    select,
    union_all,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Compiled, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, aliased

from compiler.templates import UnknownTemplateError, get_template
from compiler.templates.history import (
    THIS_DEVICE,
    Ranked,
    Stored,
    device_order,
    pick,
    rank,
)
from compiler.templates.space import ConfigSpace, SplitKnob
from schemas import (
    Config,
    DeviceLimits,
    MeasureResult,
    Record,
    RecordFormatError,
    Target,
    Workload,
)
from schemas.api import (
    MAX_REPORTED_ERRORS,
    BestItem,
    ImportResponse,
    LineError,
    RecordSummary,
)
from schemas.measure import FAILED_COST, check_info, check_measurement
from schemas.record import timed_cold
from schemas.target import parsed_target
from schemas.text import one_line
from tuner_server.db.models import RecordRow, record_hash
from tuner_server.gc_pause import gc_paused
from tuner_server.services.foreign_flops import foreign_flops

log = logging.getLogger("tuner.records")

BATCH = 1000


def _among(session: Session, column: Any, values: Sequence[int] | Sequence[str]
           ) -> Iterator[Any]:
    """``column IN values`` (ids, or workload keys: JSON, never a line break) in as few
    statements as the database takes: on PostgreSQL one ``= ANY(array)`` of one
    parameter (the driver splits a statement of 1,000 placeholders in Python, and quotes
    each string of an array with a regex: each a tenth of a 10,000 workload lookup;
    keys go as one text split in SQL), elsewhere one IN of BATCH values per statement
    (SQLite's limit on parameters)."""
    if session.get_bind().dialect.name == "postgresql":
        if not values:
            return
        if isinstance(values[0], str):
            yield column == any_(func.string_to_array(literal("\n".join(values)), "\n",
                                                      type_=ARRAY(Text)))
        else:
            yield column == any_(literal(list(values), ARRAY(column.type)))
        return
    for start in range(0, len(values), BATCH):
        yield column.in_(values[start:start + BATCH])


# An AutoTVM line is a few hundred characters; a 3 MB "config" is junk, refused unread.
MAX_LINE_CHARS = 64 * 1024
MAX_REASON_CHARS = 400  # characters of each refused line's reason


@dataclass
class ImportReport:
    accepted: int = 0
    refused: int = 0
    # valid lines already stored (or given twice): identical input, config and result
    # (``record_hash``)
    duplicates: int = 0
    # (line number, reason) of the first MAX_REPORTED_ERRORS refused lines
    errors: list[tuple[int, str]] = field(default_factory=list)

    def refuse(self, number: int, why: str) -> None:
        self.refused += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append((number, one_line(why, MAX_REASON_CHARS)))

    def answer(self) -> ImportResponse:
        """The import's answer on the wire (the route's and ``tuner.Database``'s)."""
        return ImportResponse(accepted=self.accepted, refused=self.refused,
                              duplicates=self.duplicates,
                              errors=[LineError(line=n, error=why) for n, why in self.errors])


@dataclass(frozen=True)
class BestAnswer:
    """The best record for one workload and which ApplyHistoryBest rule found it."""

    workload: Workload
    text: str | None  # the winner's stored AutoTVM line, the JSON text as stored
    rule: str  # "model", "target_key:<key>" or "none"

    @cached_property
    def line(self) -> dict[str, Any] | None:
        """The winner's line as JSON values (read on first use: the route sends the
        text as stored)."""
        return None if self.text is None else json.loads(self.text)

    @cached_property
    def record(self) -> Record | None:
        """The winner as a Record (parsed on first use: the wire answer sends the line
        as stored, and ``best`` only picks lines that read as records)."""
        return None if self.line is None else Record.from_json(self.line)

    def item(self) -> BestItem:
        """This answer as a ``BestItem`` (``tuner.Database``'s)."""
        return BestItem(workload=self.workload, rule=self.rule, record=self.line)

    def item_json(self) -> str:
        """This answer as ``BestItem`` JSON, written without a model: the workload
        from its key (``[template, args]``, the same JSON), the line as stored. A
        request of 10,000 workloads answers in tens of milliseconds, not seconds of
        validating and serialising models that hold nothing new."""
        template = json.dumps(self.workload.template)
        args = self.workload.key[len(template) + 2:-1]
        return (f'{{"workload":{{"template":{template},"args":{args}}},'
                f'"rule":{json.dumps(self.rule)},"record":{self.text or "null"}}}')


def best_json(answers: Sequence[BestAnswer]) -> bytes:
    """``BestResponse`` JSON of ``answers`` (``BestAnswer.item_json``)."""
    return ('{"items":[' + ",".join(a.item_json() for a in answers) + "]}").encode()


def record_row(record: Record, source: str = "measured",
               verified_config: int | None = None) -> dict[str, Any]:
    """The records row of ``record``; ``source``: "measured" (this fleet's trial) or
    "imported" (a log line someone posted), which ``best`` ranks below a measurement;
    ``verified_config``: the config index a verification trial measured again."""
    return row_of(record.target, record.workload, record.to_json(), record.result, source,
                  verified_config)


def row_of(target: Target, workload: Workload, line: dict[str, Any], result: MeasureResult,
           source: str = "measured", verified_config: int | None = None) -> dict[str, Any]:
    """``record_row`` from a record's parts and its line (``schemas.record.line_of``)."""
    return {
        "source": source,
        "verified_config": verified_config,
        "cold": timed_cold(line.get("info")),
        "target": str(target),
        "target_kind": target.kind,
        "target_model": target.model,
        "target_keys": "," + ",".join(target.keys) + ",",
        "template": workload.template,
        "workload_key": workload.key,
        "line": line,
        "mean_cost": result.mean_cost,
        "error_no": int(result.error_no),
        "timestamp": result.timestamp,
    }


def add_records(session: Session, records: Iterable[Record], source: str = "measured") -> int:
    rows = [record_row(r, source) for r in records]
    for start in range(0, len(rows), BATCH):
        session.execute(insert(RecordRow), rows[start:start + BATCH])
    return len(rows)


_LABELS = {"target": "target", "target_kind": "target kind", "target_model": "target model",
           "target_keys": "target keys", "template": "template"}
# PostgreSQL's ix_records_best holds these text columns of a row in one btree row of at
# most 2,704 bytes (with its numbers): past this, the insert fails as a database error.
# Keys are ASCII and bounded (MAX_KEY_CHARS); a target's options may not be.
INDEXED_TEXT = ("workload_key", "target", "target_kind", "target_model", "target_keys",
                "source")
INDEXED_TEXT_BYTES = 2_600


def _unstorable(record: Record) -> str | None:
    """Why a parsed record cannot be stored alike on SQLite and PostgreSQL, or None:
    NaN/Infinity are not JSON, PostgreSQL refuses NUL characters, over-long strings and
    index rows past its btree's limit (``INDEXED_TEXT_BYTES``)."""
    row = record_row(record)
    try:
        json.dumps(row["line"], allow_nan=False)
    except ValueError:
        return "numbers must be finite: NaN and Infinity are not valid JSON"
    for column in RecordRow.__table__.columns:
        value, label = row.get(column.name), _LABELS.get(column.name, column.name)
        if not isinstance(value, str):
            continue
        if "\x00" in value:
            return f"{label}: contains a NUL character"
        limit = getattr(column.type, "length", None)
        if limit is not None and len(value) > limit:
            return f"{label}: longer than {limit} characters"
    indexed = sum(len(str(row.get(name, "")).encode()) for name in INDEXED_TEXT)
    if indexed > INDEXED_TEXT_BYTES:
        return (f"workload and target: {indexed} bytes of UTF-8 together, more than the "
                f"{INDEXED_TEXT_BYTES} the records index holds")
    return None


def _fits(space: ConfigSpace, config: Config) -> str | None:
    """Why ``config`` is not shaped like a point of ``space``, or None: knobs of the
    space (a template may fill one AutoTVM's space lacks, as conv2d_NCHWc.x86 does vec
    and wg), of their kinds, splits with as many integer factors, an index inside it.

    A knob's value need not be one of our candidates: TopHub's logs hold real AutoTVM
    records tuned with other candidate lists (auto_unroll_max_step 128 on rocm and
    opencl, splits of other extents). They are kept as AutoTVM would keep them, and
    whoever compiles with them decodes them first and skips those outside the space."""
    knobs = {knob.name: knob for knob in space}
    names = [item.name for item in config.entity]
    if len(set(names)) != len(names):
        return "config: a knob is named twice"
    for item in config.entity:
        knob = knobs.get(item.name)
        if knob is None:
            return (f"config: {item.name!r} is not a knob of {sorted(knobs)}"[:300])
        if item.kind != knob.kind:
            return f"config: {knob.name}: kind {item.kind!r}, expected {knob.kind!r}"
        if isinstance(knob, SplitKnob):
            value = item.value
            if not (isinstance(value, tuple) and len(value) == knob.num_outputs
                    and all(isinstance(v, int) and not isinstance(v, bool) and (v >= 1 or v == -1)
                            for v in value)):
                return (f"config: {knob.name}: expected a split of {knob.num_outputs} "
                        f"positive integer factors")
    if config.index >= len(space):
        return f"config: index {config.index} is outside the space of {len(space)} configs"
    return None


def _invalid(record: Record) -> str | None:
    """Why ``record`` is not a measurement we would have stored ourselves, or None: the
    rules a worker's result obeys, plus, for a template we have, arguments it reads and a
    config shaped like a point of its space."""
    try:
        check_measurement(record.result)
    except ValueError as err:
        return f"result: {err}"
    try:
        if record.info is not None:
            check_info(record.info)
    except ValueError as err:
        return str(err)
    try:
        template = get_template(record.workload.template)
    except UnknownTemplateError:
        # an AutoTVM template we cannot build (batch_matmul, conv2d_transpose: TopHub has
        # them): kept for AutoTVM readers of the pretuned log, checked as far as we can
        return None
    try:
        space = template.space(record.workload)
    except Exception as err:  # noqa: BLE001 - a template's refusal (WorkloadError, ...)
        return f"args: {' '.join(str(err).split())[:200]}"
    return _fits(space, record.config)


def import_lines(session: Session, lines: Iterable[str],
                 source: str = "imported") -> ImportReport:
    """Keep every valid line, as ``source``; count the others and report the first
    MAX_REPORTED_ERRORS with their line number and reason."""
    report = ImportReport()
    good: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_CHARS:
            report.refuse(number, f"line longer than {MAX_LINE_CHARS} characters")
            continue
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            record = Record.from_line(text)
        except RecordFormatError as err:
            report.refuse(number, str(err))
            continue
        why = _unstorable(record) or _invalid(record)
        if why is not None:
            report.refuse(number, why)
        else:
            good.append(record)
    unique: dict[str, Record] = {}
    for record in good:  # a line given twice counts once, where first given
        unique.setdefault(record_hash(record.to_json()), record)
    report.accepted = _insert_new(session, list(unique.values()), source)
    report.duplicates = len(good) - report.accepted
    return report


def insert_or_skip(session: Session, table: Any, index_elements: Sequence[Any] | None = None
                   ) -> Any:
    """An INSERT of ``table`` (a mapped class or a Table), in the session's dialect, that
    skips each row a unique index already holds (ON CONFLICT DO NOTHING; of the index on
    ``index_elements`` only, when given) instead of failing the statement."""
    dialect = session.get_bind().dialect.name
    statement = (sqlite_insert if dialect == "sqlite" else postgresql_insert)(table)
    return statement.on_conflict_do_nothing(index_elements=index_elements)


# A measured batch's rows as one JSON parameter on PostgreSQL (json_to_recordset): the
# statement's text and its two parameters stay the same whatever the rows, so psycopg
# converts it once (it caches statements of at most 50 parameters; a report's multi-row
# VALUES had 120), and the rows travel as one string json.dumps writes in C, where an
# array a column had psycopg quote each element in Python (~11% of a loaded server's
# CPU, the JSON lines' many quotes each escaped by a regex substitution).
_TRIAL_COLUMNS = (("source", "TEXT"), ("verified_config", "BIGINT"), ("cold", "BOOLEAN"),
                  ("target", "TEXT"),
                  ("target_kind", "TEXT"), ("target_model", "TEXT"), ("target_keys", "TEXT"),
                  ("template", "TEXT"), ("workload_key", "TEXT"), ("line", "JSON"),
                  ("mean_cost", "FLOAT8"), ("error_no", "INT"), ("timestamp", "FLOAT8"),
                  ("trial_id", "INT"), ("created_at", "TIMESTAMPTZ"), ("line_hash", "TEXT"))
_ROW_COLUMNS = tuple((name, kind) for name, kind in _TRIAL_COLUMNS if name != "created_at")
_TRIAL_INSERT = sql_text(
    f"INSERT INTO {RecordRow.__tablename__} ({', '.join(name for name, _ in _TRIAL_COLUMNS)}) "
    "SELECT " + ", ".join("CAST(:created_at AS TIMESTAMPTZ)" if name == "created_at"
                          else f"r.{name}" for name, _ in _TRIAL_COLUMNS)
    + " FROM json_to_recordset(CAST(:rows AS JSON)) AS r("
    + ", ".join(f"{name} {kind}" for name, kind in _ROW_COLUMNS)
    + ") ON CONFLICT DO NOTHING RETURNING trial_id")


def insert_trial_records(session: Session, rows: Sequence[dict[str, Any]]) -> set[int]:
    """Store trials' record rows (``row_of`` with ``trial_id``), skipping each a unique
    index already holds (a result stored before, or its line); the trial ids stored."""
    if not rows:
        return set()
    if session.get_bind().dialect.name != "postgresql":
        table = RecordRow.__table__
        return set(session.execute(insert_or_skip(session, table)
                                   .returning(table.c.trial_id), rows).scalars())
    batch = json.dumps([dict(row, line_hash=record_hash(row["line"])) for row in rows],
                       allow_nan=False)
    return set(session.execute(_TRIAL_INSERT, {"rows": batch, "created_at": datetime.now(UTC)})
               .scalars())


def _insert_new(session: Session, records: Sequence[Record], source: str) -> int:
    """Store the records no stored row has the hash of, and return how many: the unique
    ``line_hash`` index decides (ON CONFLICT DO NOTHING), so concurrent imports of one
    log store one copy and an import reads no stored lines."""
    rows = [record_row(r, source) for r in records]
    inserted = 0
    for start in range(0, len(rows), BATCH):
        statement = (insert_or_skip(session, RecordRow, [RecordRow.line_hash])
                     .returning(RecordRow.id))
        inserted += len(session.execute(statement, rows[start:start + BATCH]).all())
    return inserted


def _read(line: Any, row_id: int) -> Record | None:
    """The stored line as a Record, or None (logged) for a row stored before today's
    rules that no longer reads (a target that does not parse): such rows are skipped,
    never an error for the reader."""
    try:
        return Record.from_json(line)
    except RecordFormatError as err:
        log.warning("records row %s does not read as a record and is skipped: %s",
                    row_id, err)
        return None


def _target_filter(target: Target) -> list[Any]:
    """A bare kind (``cuda``) matches every model of that kind; a model narrows to it."""
    clauses = [RecordRow.target_kind == target.kind]
    if target.option("model"):
        clauses.append(RecordRow.target_model == target.model)
    return clauses


def query(session: Session, target: Target | None = None, template: str | None = None,
          workload: Workload | None = None, limit: int = 100,
          offset: int = 0) -> tuple[int, list[Record]]:
    clauses: list[Any] = []
    if target is not None:
        clauses += _target_filter(target)
    if template is not None:
        clauses.append(RecordRow.template == template)
    if workload is not None:
        clauses.append(RecordRow.workload_key == workload.key)
    total = session.scalar(select(func.count()).select_from(RecordRow).where(*clauses)) or 0
    rows = session.execute(
        select(RecordRow.id, RecordRow.line).where(*clauses).order_by(RecordRow.id)
        .limit(limit).offset(offset))
    return total, [r for row_id, line in rows if (r := _read(line, row_id)) is not None]


def stored_of(session: Session, workloads: Sequence[Workload]
              ) -> list[tuple[Record, bool, bool]]:
    """Every stored record of ``workloads`` (any target) in storage order, each with
    whether it is the fleet's measurement (not an import) and whether it is a
    verification's: what a build reading the database directly ranks, as ``best``
    does."""
    keys = list(dict.fromkeys(w.key for w in workloads))
    found: list[tuple[int, Record, bool, bool]] = []
    for among in _among(session, RecordRow.workload_key, keys):
        rows = session.execute(select(RecordRow.id, RecordRow.line, RecordRow.source,
                                      RecordRow.verified_config).where(among))
        found += [(row_id, r, source == "measured", verified is not None)
                  for row_id, line, source, verified in rows
                  if (r := _read(line, row_id)) is not None]
    found.sort(key=lambda f: f[0])
    return [(record, measured, verified) for _id, record, measured, verified in found]


def _entry(row: Sequence[Any]) -> Stored[int] | None:
    """A row that begins with the ``_STORED`` columns as the rule ranks it (``item``: its
    id); None where its target no longer parses."""
    row_id, _key, text, cost, error_no, source, verified, cold = row[:8]
    target = parsed_target(text)
    return None if target is None else Stored(row_id, target, cost, error_no,
                                              source == "measured", verified, bool(cold))


def _stored(rows: Iterable[Any]) -> dict[str, list[Stored[int]]]:
    """Workload key -> its rows as the rule ranks them (``item``: the row id), in
    storage order; rows whose target no longer parses are left out. (``_entry`` written
    out: a lookup of 10,000 workloads reads this loop's rows, a call each cost up to
    1.7x.)"""
    out: dict[str, list[Stored[int]]] = {}
    for row_id, key, text, cost, error_no, source, verified, cold in rows:
        target = parsed_target(text)
        if target is not None:
            entries = out.get(key)
            if entries is None:
                entries = out[key] = []
            entries.append(Stored(row_id, target, cost, error_no, source == "measured",
                                  verified, bool(cold)))
    return out


@lru_cache(maxsize=8192)
def _workload_of(key: str) -> Workload | None:
    """The workload a stored key names (``Workload.key`` reads back), or None."""
    try:
        template, args = json.loads(key)
        return Workload(template=template, args=args)
    except (ValueError, TypeError):
        return None


_STORED = (RecordRow.id, RecordRow.workload_key, RecordRow.target, RecordRow.mean_cost,
           RecordRow.error_no, RecordRow.source, RecordRow.verified_config, RecordRow.cold)
# What the rule ranks: working records, and every verification record (a failed round
# counts against its config's median).
_RANKED = or_(RecordRow.error_no == 0, RecordRow.verified_config.is_not(None))


@lru_cache(maxsize=65536)
def _config_of(text: str) -> Config:
    """A config's JSON as a Config, remembered: a fleet's winners share configs, and the
    rule remembers its verdict on each (``history.problem``)."""
    return Config.model_validate(json.loads(text))


# A stored line's config when the line reads as a record (else None), by a digest of
# its text: that depends on the text alone, so a process parses each winner once, not
# per request. The configs are ``_config_of``'s, each distinct one kept once (~6 KB a
# conv2d config, ~150 bytes a line besides); forgotten at once past MAX_CONFIGS lines.
_CONFIGS: dict[bytes, Config | None] = {}
MAX_CONFIGS = 100_000


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class _Lines:
    """Stored lines read on demand, in batches, in the rule's rank order, so that
    checking a winner reads its line, not every candidate's."""

    def __init__(self, session: Session, chunk: int = 16) -> None:
        self.session = session
        self.chunk = chunk
        self.texts: dict[int, str] = {}

    def load(self, ids: Iterable[int]) -> None:
        """Read the lines of ``ids`` not read yet (``_among``)."""
        wanted = [i for i in dict.fromkeys(ids) if i not in self.texts]
        for among in _among(self.session, RecordRow.id, wanted):
            # on the connection, as ``_candidates``'s
            rows = self.session.connection().execute(
                select(RecordRow.id, cast(RecordRow.line, Text)).where(among))
            self.texts.update((row_id, text) for row_id, text in rows)

    def record(self, row_id: int) -> Record | None:
        return _read(json.loads(self.texts[row_id]), row_id)

    def config(self, row_id: int) -> Config | None:
        """The config alone (a pretuned log sends the line as stored, unparsed)."""
        try:
            config = json.loads(self.texts[row_id])["config"]
            return _config_of(json.dumps(config, sort_keys=True))
        except (ValueError, KeyError, TypeError):
            return None

    def whole_config(self, row_id: int) -> Config | None:
        """The config of a line that reads as a record (records/best), else None; a
        line not read yet counts as unreadable (``load`` it first)."""
        text = self.texts.get(row_id)
        if text is None:
            return None
        digest = _digest(text)
        try:
            return _CONFIGS[digest]
        except KeyError:
            config = self.config(row_id) if self.record(row_id) is not None else None
            if len(_CONFIGS) >= MAX_CONFIGS:
                _CONFIGS.clear()
            _CONFIGS[digest] = config
            return config

    def reader(self, ids: Sequence[int]) -> Callable[[int], Config | None]:
        """``config_of`` for ``history.pick`` over candidates ``ids`` (in rank order), a
        miss reading the next chunk (the pretuned log)."""

        def config_of(row_id: int) -> Config | None:
            if row_id not in self.texts:
                at = ids.index(row_id)
                self.load(ids[at:at + self.chunk])
            if row_id not in self.texts:
                return None
            return self.config(row_id)

        return config_of


def _candidates(session: Session, keys: Sequence[str], tier: Any
                ) -> dict[str, list[Stored[int]]]:
    """One tier's stored candidates of the workloads ``keys``, in storage order: one
    query (``_among``)."""
    out: dict[str, list[Stored[int]]] = {}
    for among in _among(session, RecordRow.workload_key, keys):
        # on the session's connection, not Session.execute: the same rows without the
        # ORM's execution path and row loading (~7% of a 10,000-workload batch's server
        # CPU), and no autoflush (a lookup's session has nothing pending)
        rows = session.connection().execute(
            select(*_STORED).where(among, _RANKED, tier).order_by(RecordRow.id)).all()
        for key, entries in _stored(rows).items():
            out.setdefault(key, []).extend(entries)
    return out


# Candidates read per workload and group of the rule's order (a batch: other devices'
# by key; a few workloads: every group, tried as far as the first group that may have
# more), the rule's first usually winning; a workload none of whose leaders passes the
# check, and that has more, is read in full by a second query.
LEADING = 2


def _leading(session: Session, keys: Sequence[str], tier: Any, target: Target
             ) -> tuple[dict[str, list[Stored[int]]], set[str]]:
    """The first LEADING usable candidates of each workload of ``keys`` in ``tier`` (other
    devices), in the order ``history.rank`` gives them (under the first of
    ``target.keys`` a record shares, cheapest first, then the first stored), picked in
    SQL so that a batch reads a few rows a workload instead of every other device's
    (75,000 rows for 10,000 workloads at 100,000 records); and the workloads that may
    have more (one more is read to tell: it is a candidate too)."""
    place = case(*[(RecordRow.target_keys.contains(f",{k},", autoescape=True), i)
                   for i, k in enumerate(target.keys)], else_=len(target.keys))
    out: dict[str, list[Stored[int]]] = {}
    more: set[str] = set()
    for among in _among(session, RecordRow.workload_key, keys):
        ranked = select(
            *_STORED,
            func.row_number().over(partition_by=RecordRow.workload_key,
                                   order_by=(place, RecordRow.mean_cost, RecordRow.id)
                                   ).label("at"),
        ).where(among, tier, RecordRow.error_no == 0, RecordRow.mean_cost > 0,
                RecordRow.mean_cost < FAILED_COST).subquery()
        rows = session.connection().execute(  # as ``_candidates``'s
            select(*[ranked.c[column.key] for column in _STORED])
            .where(ranked.c.at <= LEADING + 1).order_by(ranked.c.id)).all()
        counts = Counter(row[1] for row in rows)  # before unreadable targets are dropped
        more.update(key for key, n in counts.items() if n > LEADING)
        for key, entries in _stored(rows).items():
            out.setdefault(key, []).extend(entries)
    return out, more


def _elsewhere(found: dict[str, list[Stored[int]]], target: Target
               ) -> dict[str, list[Ranked[int]]]:
    """Other devices' candidates by workload, in rank order (``history.rank``'s key
    tiers)."""
    return {key: [r for r in rank(entries, target) if r.source != THIS_DEVICE]
            for key, entries in found.items()}


# Candidates whose lines a round of ``_pick_all`` reads per workload still open: the
# favourite first (it wins unless its config left the space), then 8 times more a round.
FIRST_ROUND, GROWTH = 1, 8


def _pick_all(workloads: dict[str, Workload], ranked: dict[str, list[Ranked[int]]],
              lines: _Lines, limits: DeviceLimits | None
              ) -> dict[str, Ranked[int]]:
    """``history.pick`` for every workload of ``ranked`` (key -> candidates in rank
    order): the winners by key. Lines are read in rounds shared by all workloads (each
    one's next few candidates, one query per BATCH lines), so a batch of workloads
    costs a few queries, whatever its size; picking a prefix of the candidates, then
    the next, finds the winner picking all of them at once would."""
    winners: dict[str, Ranked[int]] = {}
    at = {key: 0 for key, candidates in ranked.items() if candidates}
    size = FIRST_ROUND
    while at:
        lines.load(c.item for key, start in at.items()
                   for c in ranked[key][start:start + size])
        for key, start in list(at.items()):
            window = ranked[key][start:start + size]
            verdict = pick(workloads[key], window, lines.whole_config, limits)
            if verdict.winner is not None:
                winners[key] = verdict.winner
                del at[key]
            elif start + size >= len(ranked[key]):
                del at[key]
            else:
                at[key] = start + size
        size *= GROWTH
    return winners


def _has_records(session: Session, target: Target) -> bool:
    """Whether any record of ``target``'s device model is stored (an index probe of
    ``ix_records_target_model``): a batch for a model never measured skips reading its
    workloads' records for this device's tier (60-70 ms at 10,000 workloads)."""
    return session.scalar(select(literal(1)).where(
        RecordRow.target_model == target.model,
        RecordRow.target_kind == target.kind).limit(1)) is not None


# Workloads a records/best request reads both tiers of in one query.
FEW_WORKLOADS = 16


def _like_pattern(key: str) -> str:
    """A LIKE pattern matching ``,key,`` inside ``target_keys`` (escape character /)."""
    escaped = key.replace("/", "//").replace("%", "/%").replace("_", "/_")
    return f"%,{escaped},%"


def _few_clauses(dialect: Dialect, model: bool, n_keys: int, n_workloads: int
                 ) -> tuple[Any, list[Any]]:
    """The few-workload queries' clauses: (the workloads', the tiers' with this device's
    first when ``model``), their values as parameters (``keys`` on PostgreSQL, ``w0``...
    elsewhere; ``kind``, ``model``, ``key0``...). On PostgreSQL ``n_workloads`` is 1 (one
    key, compared as it is: its prepared statement's generic plan, ``_few_candidates``) or 0
    (any number, as one text)."""
    if dialect.name == "postgresql" and n_workloads == 1:
        among = RecordRow.workload_key == bindparam("keys", type_=Text)
    elif dialect.name == "postgresql":  # one text parameter, split in SQL (``_among``)
        among = RecordRow.workload_key == any_(func.string_to_array(
            bindparam("keys", type_=Text), "\n", type_=ARRAY(Text)))
    else:
        among = RecordRow.workload_key.in_([bindparam(f"w{i}") for i in range(n_workloads)])
    tiers = [RecordRow.target_keys.like(bindparam(f"key{i}"), escape="/")
             for i in range(n_keys)]
    if model:  # ``best``'s "here": no index of these columns, compared as ``column || ''``
        tiers.insert(0, and_(RecordRow.target_kind.concat("") == bindparam("kind"),
                             RecordRow.target_model.concat("") == bindparam("model")))
    return among, tiers


@lru_cache(maxsize=256)
def _few_query(dialect: Dialect, model: bool, n_keys: int, n_workloads: int) -> Compiled:
    """Every candidate of ``n_workloads`` workloads in both tiers, with its line, compiled
    once per shape (``_few_clauses``), so a lookup builds and compiles no SQL (a third
    of its time in process did)."""
    among, tiers = _few_clauses(dialect, model, n_keys, n_workloads)
    query = (select(*_STORED, cast(RecordRow.line, Text))
             .where(among, _RANKED, or_(*tiers)).order_by(RecordRow.id))
    return query.compile(dialect=dialect)


@lru_cache(maxsize=256)
def _leaders_query(dialect: Dialect, model: bool, n_keys: int, n_workloads: int,
                   leading: int) -> Compiled:
    """``_few_query``'s candidates cut to each group's first ``leading`` + 1 in the rule's
    order, lines read for those only: a workload of 1,000 records has ~600 candidates,
    of which the rule tries the first. The groups are the runs ``history.rank`` orders
    by cost: this device's measurements, its imports (in both, those timed cold first),
    each target key's tier (an entry under the first key it shares); this device's
    verification rows come whole (the rule ranks them by median). ``at`` numbers a row in
    its group (0: verification)."""
    among, tiers = _few_clauses(dialect, model, n_keys, n_workloads)
    usable = and_(RecordRow.error_no == 0, RecordRow.mean_cost > 0,
                  RecordRow.mean_cost < FAILED_COST)
    elsewhere = 3  # the first other-device group: 0-2 are this device's
    places = [(and_(usable, tier), elsewhere + i)
              for i, tier in enumerate(tiers[1:] if model else tiers)]
    if model:  # the columns as they are: no index to keep the planner off here
        here = and_(RecordRow.target_kind == bindparam("kind"),
                    RecordRow.target_model == bindparam("model"))
        places[:0] = [(and_(here, RecordRow.verified_config.is_not(None)), 0),
                      (and_(here, usable, RecordRow.source == "measured"), 1),
                      (and_(here, usable), 2)]
    # a row of no group (unusable, not this device's verification) is left out
    found = select(*_STORED, case(*places).label("grp")).where(
        among, _RANKED, or_(*tiers)).subquery()
    # this device's records timed cold before its warm ones, as ``history.device_order``
    warm_later = case((and_(found.c.grp < elsewhere, found.c.cold), 0), else_=1)
    at = case((found.c.grp == 0, 0), else_=func.row_number().over(
        partition_by=(found.c.workload_key, found.c.grp),
        order_by=(warm_later, found.c.mean_cost, found.c.id)))
    numbered = select(found, at.label("at")).subquery()
    query = (select(*[numbered.c[column.key] for column in _STORED], numbered.c.at,
                    cast(RecordRow.line, Text))
             .join_from(numbered, RecordRow, RecordRow.id == numbered.c.id)
             .where(numbered.c.grp.is_not(None), numbered.c.at <= leading + 1)
             .order_by(numbered.c.id))
    return query.compile(dialect=dialect)


def _few_candidates(session: Session, keys: Sequence[str], target: Target, lines: _Lines,
                    leading: int | None = None
                    ) -> tuple[dict[str, list[Stored[int]]], dict[int, str]]:
    """``_candidates`` of both tiers for up to FEW_WORKLOADS workloads, with their lines
    (into ``lines``), in one query (``_run``): every candidate, or (``leading``) each
    group's first ``leading`` + 1 (``_leaders_query``); and the last row read of each
    group that may have more (a cut: its id -> its workload key), the second case."""
    dialect = session.get_bind().dialect
    model = target.model != "unknown"
    params: dict[str, Any] = ({"keys": "\n".join(keys)} if dialect.name == "postgresql"
                              else {f"w{i}": key for i, key in enumerate(keys)})
    if model:
        params.update(kind=target.kind, model=target.model)
    params.update((f"key{i}", _like_pattern(k)) for i, k in enumerate(target.keys))
    # PostgreSQL: one workload's statement is prepared on its connection, where it runs
    # the generic plan after its first 5 (``db.session.reader_engine``): planning these
    # statements took as long as running them (~0.45 of ~0.9 ms), and one key's plan is
    # the same for every key; several keys' statement is planned for its values each time
    one = dialect.name == "postgresql" and len(keys) == 1
    shape = (dialect, model, len(target.keys),
             int(one) if dialect.name == "postgresql" else len(keys))
    if leading is None:
        rows = _run(session, _few_query(*shape), params, prepare=one)
        cuts: dict[int, str] = {}
    else:
        rows = _run(session, _leaders_query(*shape, leading), params, prepare=one)
        cuts = {row[0]: row[1] for row in rows if row[-2] > leading}
        rows = [(*row[:-2], row[-1]) for row in rows]
    lines.texts.update((row[0], row[-1]) for row in rows)
    return _stored(row[:-1] for row in rows), cuts


def _through_cut(ranked: list[Ranked[int]], cuts: dict[int, str]) -> list[Ranked[int]]:
    """``ranked`` up to its first cut (``_few_candidates``), included: past it the rule
    would try candidates that were not read."""
    for at, candidate in enumerate(ranked):
        if candidate.item in cuts:
            return ranked[:at + 1]
    return ranked


def _run(session: Session, compiled: Compiled, params: dict[str, Any], prepare: bool = False
         ) -> list[Any]:
    """``compiled`` with ``params`` on the driver's cursor as is: SQLAlchemy's statement
    execution and result objects cost a single lookup more than the database's answer
    (the values are plain text and numbers, which need no conversion either way).
    ``prepare``: as a prepared statement of the connection (psycopg only)."""
    values = compiled.construct_params(params)
    connection = session.connection()
    dialect, dbapi = connection.dialect, connection.connection
    cursor = dbapi.cursor()
    args = (tuple(values[name] for name in compiled.positiontup) if compiled.positional
            else values)
    try:
        if prepare:
            cursor.execute(compiled.string, args, prepare=True)
        else:
            cursor.execute(compiled.string, args)
        return cursor.fetchall()
    except dialect.loaded_dbapi.Error as err:
        # as SQLAlchemy would raise it (an outage answers 503, not 500), the connection
        # dropped from the pool when it is gone
        gone = dialect.is_disconnect(err, dbapi.dbapi_connection, cursor)
        if gone:
            connection.invalidate(err)
        raise DBAPIError.instance(compiled.string, values, err, dialect.loaded_dbapi.Error,
                                  connection_invalidated=gone, dialect=dialect) from err
    finally:
        cursor.close()


@gc_paused()
def best(session: Session, workloads: Sequence[Workload], target: Target,
         limits: DeviceLimits | None = None) -> list[BestAnswer]:
    """The one ApplyHistoryBest rule (``compiler.templates.history``) over the stored
    records: this device (same kind and model; records timed cold before warm ones, of
    each verified configs by their median, then the fleet's measurements, then imports),
    then each of the target's keys in order;
    cheapest first, ties to the first stored; only configs that decode in the template's
    space (and fit ``limits`` when known).

    A batch costs one query per tier, not per workload: this device's candidates (ids,
    targets, costs) of every workload asked, then the other devices' of those still
    without a winner; the lines are read in rounds shared by all workloads, only as far
    as each winner (``_pick_all``). Up to FEW_WORKLOADS workloads, one query reads
    each group's leaders in both tiers with their lines (``_leaders_query``), tried as
    far as the first group cut short; a second reads whole the workloads whose leaders
    that far all fail the check."""
    keys = [w.key for w in workloads]  # a key is computed each time: once here
    asked = dict(zip(keys, workloads))  # one workload per key (one key's are alike)
    lines = _Lines(session)
    winners: dict[str, Ranked[int]] = {}
    if len(asked) <= FEW_WORKLOADS:
        # a few workloads (a build asking layer by layer): both tiers' leaders and their
        # lines in one query, two round trips fewer; the leaders of groups the rule will
        # not reach cost less than those round trips
        if target.model != "unknown" or target.keys:
            found, cuts = _few_candidates(session, list(asked), target, lines, LEADING)
            # a workload whose cut row's target no longer parses cannot be cut where the
            # rule would be: it is read whole
            read = {entry.item for entries in found.values() for entry in entries}
            whole = {key for row_id, key in cuts.items() if row_id not in read}
            ranked = {key: _through_cut(rank(entries, target), cuts)
                      for key, entries in found.items() if key not in whole}
            winners = _pick_all(asked, ranked, lines, limits)
            # every leader failed the check, and a group was cut: all their candidates
            rest = [key for key in dict.fromkeys(cuts.values()) if key not in winners]
            if rest:
                found, _ = _few_candidates(session, rest, target, lines)
                winners.update(_pick_all(asked, {key: rank(entries, target)
                                                 for key, entries in found.items()},
                                         lines, limits))
    else:
        # one query per tier for the whole batch: this device, then (for the workloads it
        # left without a winner) the other devices by the target's keys. The rule ranks
        # this device's records first, so a winner among them is the winner of all.
        # compared as ``column || ''``: no index of the target's columns, so the planner
        # reads these workloads' records through ix_records_best, not every record of the
        # kind (SQLite without statistics walked ix_records_target_kind: 12x slower)
        here = (and_(RecordRow.target_kind.concat("") == target.kind,
                     RecordRow.target_model.concat("") == target.model)
                if target.model != "unknown" else None)
        if here is not None and _has_records(session, target):
            winners = _pick_all(asked, {key: rank(entries, target) for key, entries
                                        in _candidates(session, list(asked), here).items()},
                                lines, limits)
        rest = [key for key in asked if key not in winners]
        if rest and target.keys:
            by_key = or_(*[RecordRow.target_keys.contains(f",{k},", autoescape=True)
                           for k in target.keys])
            elsewhere = by_key if here is None else and_(by_key, not_(here))
            leaders, more = _leading(session, rest, elsewhere, target)
            winners.update(_pick_all(asked, _elsewhere(leaders, target), lines, limits))
            rest = [key for key in more if key not in winners]
            if rest:  # every leader failed the check: all their candidates
                winners.update(_pick_all(asked, _elsewhere(
                    _candidates(session, rest, elsewhere), target), lines, limits))
    answers = []
    for workload, key in zip(workloads, keys):
        won = winners.get(key)
        if won is None:
            answers.append(BestAnswer(workload, None, "none"))
            continue
        rule = "model" if won.source == THIS_DEVICE else f"target_key:{won.key}"
        answers.append(BestAnswer(workload, lines.texts[won.item], rule))
    return answers


# The dashboard's search: one best record per (target kind, device model, workload). A
# page of groups is read from ``ix_records_groups`` alone (thousands of groups, no row
# read); each group of the page is then ranked as the build ranks a device's records
# (``history.device_order``: timed cold first, verified configs by their median, then
# measured, then the cheapest, then the first stored). Unlike the pretuned log it does
# not decode configs, so it may show a record outside the template's space.
_GROUP = (RecordRow.target_kind, RecordRow.target_model, RecordRow.workload_key)
_GROUP_ROW = (*_STORED, RecordRow.target_kind, RecordRow.target_model)


def _groups(clauses: Sequence[Any]) -> Any:
    """SELECT kind, model, workload key of every group with a working record under
    ``clauses``."""
    return select(*_GROUP).where(RecordRow.error_no == 0, *clauses).group_by(*_GROUP)


def _group_rows(among: Any, clauses: Sequence[Any]) -> Any:
    """SELECT (``_GROUP_ROW``) what ``device_order`` may put first in each group
    ``among`` names, and each group's cheapest working row: its verification rows, and
    of its other working rows the first by (cost, id) of each (cold, source, usable)
    part. A group of a long search holds thousands of rows; this is a few of them,
    found by two aggregates (a window over the rows sorted them all, spilling to disk on
    PostgreSQL: 3-4x slower)."""
    usable = case((and_(RecordRow.mean_cost > 0, RecordRow.mean_cost < FAILED_COST), 1),
                  else_=0)
    part = (*_GROUP, RecordRow.cold, RecordRow.source)
    plain = (RecordRow.error_no == 0, RecordRow.verified_config.is_(None))
    cheapest = (select(*part, usable.label("usable"), func.min(RecordRow.mean_cost).label("cost"))
                .where(among, *plain, *clauses).group_by(*part, usable).subquery())
    first = (select(func.min(RecordRow.id))
             .join(cheapest, and_(*(column == cheapest.c[column.key] for column in part),
                                  RecordRow.mean_cost == cheapest.c.cost))
             .where(among, *plain)
             .group_by(*(cheapest.c[column.key] for column in part), cheapest.c.cost))
    return union_all(
        select(*_GROUP_ROW).where(RecordRow.id.in_(first)),
        select(*_GROUP_ROW).where(among, RecordRow.verified_config.is_not(None), *clauses))


def _group_winners(session: Session, page: Sequence[tuple[str, str, str]],
                   clauses: Sequence[Any]) -> list[int]:
    """The id of each group's winner in the rule's order (``device_order``); where the
    rule would use none of its records (every verified median failed, a cost out of
    range, a target that no longer parses), its cheapest working record, first stored."""
    entries: dict[tuple[str, str, str], list[Stored[int]]] = {group: [] for group in page}
    fallback: dict[tuple[str, str, str], tuple[float, int]] = {}
    keys = list(dict.fromkeys(key for _kind, _model, key in page))
    for among in _among(session, RecordRow.workload_key, keys):
        for row in session.execute(_group_rows(among, clauses)):
            group = (row.target_kind, row.target_model, row.workload_key)
            if group not in entries:
                continue
            if row.error_no == 0:
                fallback[group] = min(fallback.get(group, (row.mean_cost, row.id)),
                                      (row.mean_cost, row.id))
            entry = _entry(row)
            if entry is not None:
                entries[group].append(entry)
    winners = []
    for group, stored in entries.items():
        stored.sort(key=lambda e: e.item)  # storage order: ties go to the first stored
        ordered = device_order(stored)
        if ordered:
            winners.append(ordered[0].item)
        elif group in fallback:
            winners.append(fallback[group][1])
    return winners


Group = tuple[str, str]  # (workload key, device model): one line of a pretuned log


def _log_winners(session: Session, rows: Iterable[Any]) -> dict[Group, str | None]:
    """The winning line of each group that ``rows`` (all of the group's ranked rows, in
    storage order) name, or None where no config may be used."""
    groups: dict[Group, list[Stored[int]]] = {}
    for row in rows:
        entry = _entry(row)
        if entry is not None:
            groups.setdefault((row.workload_key, row.target_model), []).append(entry)
    ordered = {group: [e.item for e in device_order(entries)]
               for group, entries in groups.items()}
    lines = _Lines(session)
    lines.load(ids[0] for ids in ordered.values() if ids)
    winners: dict[Group, str | None] = {}
    # workload by workload, so the template's space is built once for all its models
    for (key, model), ids in sorted(ordered.items()):
        workload = _workload_of(key)
        verdict = (None if workload is None else
                   pick(workload, (Ranked(THIS_DEVICE, None, i) for i in ids),
                        lines.reader(ids)))
        won = None if verdict is None else verdict.winner
        winners[key, model] = None if won is None else lines.texts[won.item]
    return winners


_LOG_COLUMNS = (*_STORED, RecordRow.target_model)


def _log_rows(session: Session, clauses: Sequence[Any]) -> Any:
    """The ranked rows (``_RANKED``) under ``clauses``, in storage order, as
    ``_log_winners`` reads them: as two disjoint halves, the working records through
    their index (ix_records_groups), the failed verification rounds through
    ix_records_verified; an OR of the two scans the table on SQLite (1.4x slower over
    100k records)."""
    return session.execute(union_all(
        select(*_LOG_COLUMNS).where(RecordRow.error_no == 0, *clauses),
        select(*_LOG_COLUMNS).where(RecordRow.verified_config.is_not(None),
                                    RecordRow.error_no != 0, *clauses)).order_by("id"))


def _template_or_none(name: str) -> Any:
    try:
        return get_template(name)
    except UnknownTemplateError:
        return None


@dataclass
class _Log:
    """One target's pretuned log as last computed, and what it was computed from: the
    target's rows up to id ``seen`` (``count`` of them; ``top``: the line hash of row
    ``seen``) and the templates that checked the configs."""

    seen: int
    count: int
    top: str | None
    templates: dict[str, Any]
    winners: dict[Group, str | None]
    lines: list[str] = field(default_factory=list)
    etag: str = ""

    def fresh(self) -> None:
        """The answer from ``winners``: lines by (model, workload), and their ETag."""
        self.lines = [text for (_key, _model), text in
                      sorted(self.winners.items(), key=lambda w: (w[0][1], w[0][0]))
                      if text is not None]
        digest = hashlib.sha256("\n".join(self.lines).encode()).hexdigest()[:32]
        self.etag = f'"{digest}"'
        names = {w.template for key, _model in self.winners
                 if (w := _workload_of(key)) is not None}
        self.templates = {name: _template_or_none(name) for name in names}


# (database, target kind, model or None) -> that target's log. A log is kept while the
# records it was computed from are: a fetch then reads the rows stored since (a tuning
# fleet's few) and picks again only their groups' winners.
_LOGS: dict[tuple[str, str, str | None], _Log] = {}
MAX_LOGS = 32
_LOGS_LOCK = threading.Lock()


@gc_paused()
def pretuned_log(session: Session, target: Target) -> tuple[list[str], str]:
    """Best record per (device model, workload) among ``target``'s records, as AutoTVM
    lines, plus an ETag that changes whenever the answer does.

    Each group's winner is the rule's this-device choice (``history.device_order`` then
    ``history.pick``, limits unknown): records timed cold before warm ones, of each
    verified configs by their median first, then measured, then cheapest, then first
    stored, and only a config that decodes in the
    template's space; a verified winner's line is its median measurement. A line is sent
    as stored (every stored line is ``Record.to_line()``), not re-serialised.

    Computed once per process and target, then kept up to date: each fetch counts the
    target's rows up to the last one read and reads the rows stored after it; only the
    groups those rows belong to are picked again, reading their rows anew. Any other
    change (a row deleted, a row committed late under a lower id, the last row read
    replaced, a template registered anew) computes the whole log again. Several
    server processes each keep their own, all read from the database."""
    where = _target_filter(target)
    name = (session.get_bind().url.render_as_string(hide_password=False), target.kind,
            target.model if target.option("model") else None)
    with _LOGS_LOCK:
        kept = _LOGS.pop(name, None)
        if kept is not None and not _update(session, kept, where):
            kept = None
        if kept is None:
            kept = _compute_log(session, where)
        _LOGS[name] = kept
        while len(_LOGS) > MAX_LOGS:
            del _LOGS[next(iter(_LOGS))]
        return list(kept.lines), kept.etag


def _compute_log(session: Session, where: Sequence[Any]) -> _Log:
    """The whole log, from one read of the target's rows."""
    count, seen = session.execute(select(func.count(), func.max(RecordRow.id))
                                  .where(*where)).one()
    seen = seen or 0
    winners = _log_winners(session, _log_rows(session, [*where, RecordRow.id <= seen]))
    log = _Log(seen, count, _line_hash_of(session, seen), {}, winners)
    log.fresh()
    return log


def _line_hash_of(session: Session, row_id: int) -> str | None:
    return session.scalar(select(RecordRow.line_hash).where(RecordRow.id == row_id))


def _update(session: Session, log: _Log, where: Sequence[Any]) -> bool:
    """Bring ``log`` up to date with the rows stored since it was computed; False when
    the rows it was computed from changed otherwise (then it is computed anew)."""
    if any(_template_or_none(name) is not template
           for name, template in log.templates.items()):
        return False
    last = aliased(RecordRow)  # the row read last, whatever the target's rows are now
    count, newest, top = session.execute(
        select(func.count(case((RecordRow.id <= log.seen, 1))), func.max(RecordRow.id),
               select(last.line_hash).where(last.id == log.seen).scalar_subquery())
        .where(*where)).one()
    if count != log.count or top != log.top:
        return False
    if newest is None or newest == log.seen:
        return True
    added = [RecordRow.id > log.seen, RecordRow.id <= newest]
    new = session.execute(select(RecordRow.workload_key, RecordRow.target_model)
                          .where(*where, *added)).all()
    groups = {(key, model) for key, model in new}
    keys = sorted({key for key, _model in groups})
    rows = []
    for among in _among(session, RecordRow.workload_key, keys):
        rows += [row for row in _log_rows(session, [*where, RecordRow.id <= newest, among])
                 if (row.workload_key, row.target_model) in groups]
    rows.sort(key=lambda row: row.id)
    log.winners.update(_log_winners(session, rows))
    for group in groups:  # a group of new failed rows only: nothing ranked yet
        log.winners.setdefault(group, None)
    log.seen, log.count, log.top = newest, log.count + len(new), _line_hash_of(session, newest)
    log.fresh()
    return True


def workload_flops(template: str, args: Any) -> float | None:
    """FLOPs of one run of the workload, for GFLOP/s; None where the template is not
    registered here or cannot read the arguments (an imported log may hold either)."""
    return _flops(template, json.dumps(args, separators=(",", ":")))


@lru_cache(maxsize=8192)
def _flops(template: str, args_json: str) -> float | None:
    try:
        flops = float(get_template(template).flops(Workload(template=template, args=args_json)))
    except UnknownTemplateError:  # an imported TopHub template this package lacks
        return foreign_flops(template, json.loads(args_json))
    except Exception:  # noqa: BLE001 - any template failure just means "no figure"
        return None
    return flops if flops > 0 else None


def _summary(row: Any) -> RecordSummary:
    line = row.line if isinstance(row.line, dict) else {}
    inp = line.get("input") or [None, row.template, [], {}]
    args = inp[2] if len(inp) > 2 and isinstance(inp[2], list) else []
    config = line.get("config") or {}
    knobs = {str(k[0]): k[2] for k in config.get("entity") or []
             if isinstance(k, list) and len(k) == 3}
    ok = row.error_no == 0 and 0 < row.mean_cost < FAILED_COST
    flops = workload_flops(row.template, args) if ok else None
    info = line.get("info") if isinstance(line.get("info"), dict) else {}
    return RecordSummary(
        id=row.id, target=row.target, template=row.template, workload_key=row.workload_key,
        args=args, error_no=row.error_no, cost=row.mean_cost if ok else None,
        gflops=flops / row.mean_cost / 1e9 if flops else None, config=config, knobs=knobs,
        timestamp=row.timestamp, worker=(info or {}).get("worker"))


def search(session: Session, target: Target | None = None, template: str | None = None,
           workload_contains: str | None = None, best_only: bool = True, limit: int = 100,
           offset: int = 0) -> tuple[int, list[RecordSummary]]:
    """Records matching the filters (``workload_contains``: a substring of the workload
    key, e.g. ``1,64,56,56``, in any case), with (total, page).

    ``best_only``: one row per (device model, workload), its winner in the rule's order
    (``_group_winners``) without the config check, ordered by workload; else every
    record, newest first."""
    clauses: list[Any] = []
    if target is not None:
        clauses += _target_filter(target)
    if template:
        clauses.append(RecordRow.template == template)
    if workload_contains:
        clauses.append(RecordRow.workload_key.icontains(workload_contains, autoescape=True))
    columns = (RecordRow.id, RecordRow.target, RecordRow.template, RecordRow.workload_key,
               RecordRow.line, RecordRow.error_no, RecordRow.mean_cost, RecordRow.timestamp)
    if best_only:
        groups = _groups(clauses)
        total = session.scalar(select(func.count()).select_from(groups.subquery())) or 0
        page = session.execute(groups.order_by(RecordRow.workload_key, RecordRow.target_kind,
                                               RecordRow.target_model)
                               .limit(limit).offset(offset)).all()
        winners = _group_winners(session, [(r[0], r[1], r[2]) for r in page], clauses)
        rows = session.execute(
            select(*columns).where(RecordRow.id.in_(winners))
            .order_by(RecordRow.workload_key, RecordRow.target_kind, RecordRow.target_model))
        return total, [_summary(r) for r in rows]
    total = session.scalar(select(func.count()).select_from(RecordRow).where(*clauses)) or 0
    rows = session.execute(select(*columns).where(*clauses).order_by(RecordRow.id.desc())
                           .limit(limit).offset(offset))
    return total, [_summary(r) for r in rows]

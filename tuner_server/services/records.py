"""The records database: import AutoTVM lines, query, pick the best (ApplyHistoryBest)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import Text, and_, case, cast, func, insert, select
from sqlalchemy.orm import Session, aliased

from compiler.templates import UnknownTemplateError, get_template
from compiler.templates.space import ConfigSpace, SplitKnob
from schemas import Config, Record, RecordFormatError, Target, Workload
from schemas.measure import FAILED_COST, check_info, check_measurement
from schemas.text import one_line
from tuner_server.db.models import RecordRow

log = logging.getLogger("tuner.records")

BATCH = 1000
# An AutoTVM line is a few hundred characters; a 3 MB "config" is junk, refused unread.
MAX_LINE_CHARS = 64 * 1024
# An import's answer names this many refused lines, then only counts the rest.
MAX_REPORTED_ERRORS = 100
MAX_REASON_CHARS = 400  # characters of each refused line's reason
# POST /records/best answers at most this many workloads a request.
MAX_BEST_WORKLOADS = 1000


@dataclass
class ImportReport:
    accepted: int = 0
    refused: int = 0
    # (line number, reason) of the first MAX_REPORTED_ERRORS refused lines
    errors: list[tuple[int, str]] = field(default_factory=list)

    def refuse(self, number: int, why: str) -> None:
        self.refused += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append((number, one_line(why, MAX_REASON_CHARS)))


@dataclass(frozen=True)
class BestAnswer:
    """The best record for one workload and which ApplyHistoryBest rule found it."""

    workload: Workload
    record: Record | None
    rule: str  # "model", "target_key:<key>" or "none"


def record_row(record: Record, source: str = "measured") -> dict[str, Any]:
    """The records row of ``record``; ``source``: "measured" (this fleet's trial) or
    "imported" (a log line someone posted), which ``best`` ranks below a measurement."""
    target = record.target
    return {
        "source": source,
        "target": str(target),
        "target_kind": target.kind,
        "target_model": target.model,
        "target_keys": "," + ",".join(target.keys) + ",",
        "template": record.workload.template,
        "workload_key": record.workload.key,
        "line": record.to_json(),
        "mean_cost": record.result.mean_cost,
        "error_no": int(record.result.error_no),
        "timestamp": record.result.timestamp,
    }


def add_records(session: Session, records: Iterable[Record], source: str = "measured") -> int:
    rows = [record_row(r, source) for r in records]
    for start in range(0, len(rows), BATCH):
        session.execute(insert(RecordRow), rows[start:start + BATCH])
    return len(rows)


_LABELS = {"target": "target", "target_kind": "target kind", "target_model": "target model",
           "target_keys": "target keys", "template": "template"}


def _unstorable(record: Record) -> str | None:
    """Why a parsed record cannot be stored alike on SQLite and PostgreSQL, or None:
    NaN/Infinity are not JSON, PostgreSQL refuses NUL characters and over-long strings."""
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
    report.accepted = add_records(session, good, source)
    return report


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


def _cheapest_each(session: Session, keys: Sequence[str], *clauses: Any,
                   measured_first: bool = False) -> dict[str, Record]:
    """Workload key -> its cheapest error_no 0 record under ``clauses``, for every key of
    ``keys`` that has one, in one query; ties go to the first stored. ``measured_first``:
    a measured record beats any imported one whatever their costs."""
    order = [RecordRow.mean_cost, RecordRow.id]
    if measured_first:
        order.insert(0, case((RecordRow.source == "imported", 1), else_=0))
    ranked = (select(RecordRow.id,
                     func.row_number().over(partition_by=RecordRow.workload_key,
                                            order_by=order).label("rank"))
              .where(RecordRow.workload_key.in_(keys), RecordRow.error_no == 0, *clauses)
              .subquery())
    rows = session.execute(select(RecordRow.id, RecordRow.workload_key, RecordRow.line)
                           .where(RecordRow.id.in_(select(ranked.c.id)
                                                   .where(ranked.c.rank == 1))))
    return {key: record for row_id, key, line in rows
            if (record := _read(line, row_id)) is not None}


def best(session: Session, workloads: Sequence[Workload], target: Target) -> list[BestAnswer]:
    """AutoTVM's ApplyHistoryBest: lowest mean cost among error_no 0 records, taken from
    the same device model first, then from each of the target's keys in order; ties go
    to the record stored first, as AutoTVM keeps the first of equal costs.

    Within the device model, this fleet's measurements outrank imported records: an
    import counts only for a workload the fleet never measured on that model. One query
    per rule answers every workload."""
    keys = list(dict.fromkeys(w.key for w in workloads))
    found: dict[str, tuple[Record, str]] = {}
    if target.model != "unknown":
        for key, record in _cheapest_each(session, keys, RecordRow.target_model == target.model,
                                          measured_first=True).items():
            found[key] = (record, "model")
    for target_key in target.keys:
        missing = [k for k in keys if k not in found]
        if not missing:
            break
        for key, record in _cheapest_each(
                session, missing, RecordRow.target_keys.contains(f",{target_key},")).items():
            found[key] = (record, f"target_key:{target_key}")
    answers = []
    for workload in workloads:
        record, rule = found.get(workload.key, (None, "none"))
        answers.append(BestAnswer(workload, record, rule))
    return answers


# One best record per (target kind, device model, workload): the pretuned log's and the
# dashboard's unit, its winner ranked as ``best`` ranks a device model's records: this
# fleet's measurements first, then the cheapest, then the first stored.
# ``ix_records_groups`` holds every column the grouping reads, so the cheapest of each
# group is found from the index alone; ``source`` is read only for those winners, and an
# imported one's group is searched again, cheapest first, for a measurement.
_GROUP = (RecordRow.target_kind, RecordRow.target_model, RecordRow.workload_key)


def _group_best(clauses: Sequence[Any]) -> Any:
    """SELECT kind, model, workload key, lowest working cost, grouped, under ``clauses``
    (each a function of the group: target, template, workload key)."""
    return (select(*_GROUP, func.min(RecordRow.mean_cost).label("best"))
            .where(RecordRow.error_no == 0, *clauses).group_by(*_GROUP))


def _winner_ids(groups: Any) -> Any:
    """SELECT the id of each group's winner (``groups``: a ``_group_best`` subquery).

    First the group's cheapest record, of equal costs the first stored, as AutoTVM
    keeps the first it reads; when that one is imported, the group's cheapest
    measurement (first stored) replaces it, if the fleet measured the group at all."""
    r = aliased(RecordRow)
    cheapest = (select(func.min(r.id))
                .join(groups, and_(r.error_no == 0, r.target_kind == groups.c.target_kind,
                                   r.target_model == groups.c.target_model,
                                   r.workload_key == groups.c.workload_key,
                                   r.mean_cost == groups.c.best))
                .group_by(r.target_kind, r.target_model, r.workload_key))
    w, m = aliased(RecordRow), aliased(RecordRow)
    measured = (select(m.id)
                .where(m.error_no == 0, m.target_kind == w.target_kind,
                       m.target_model == w.target_model, m.workload_key == w.workload_key,
                       m.source == "measured")
                .order_by(m.mean_cost, m.id).limit(1).correlate(w).scalar_subquery())
    return (select(case((w.source == "imported", func.coalesce(measured, w.id)), else_=w.id))
            .where(w.id.in_(cheapest)))


def pretuned_log(session: Session, target: Target) -> tuple[list[str], str]:
    """Best record per (device model, workload) among ``target``'s records (measured
    first, then cheapest: ``_winner_ids``), as AutoTVM lines, plus an ETag that changes
    whenever the answer does.

    Every stored line is ``json.dumps(Record.to_json())`` (inserts go through
    ``record_row``; a JSON column keeps the text it was given), which is exactly
    ``Record.to_line()``: the text is sent as stored, neither parsed nor validated again
    (4x faster for thousands of lines)."""
    winners = _winner_ids(_group_best(_target_filter(target)).subquery())
    lines = list(session.scalars(
        select(cast(RecordRow.line, Text)).where(RecordRow.id.in_(winners))
        .order_by(RecordRow.target_model, RecordRow.workload_key)))
    etag = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]
    return lines, f'"{etag}"'


def workload_flops(template: str, args: Any) -> float | None:
    """FLOPs of one run of the workload, for GFLOP/s; None where the template is not
    registered here or cannot read the arguments (an imported log may hold either)."""
    return _flops(template, json.dumps(args, separators=(",", ":")))


@lru_cache(maxsize=8192)
def _flops(template: str, args_json: str) -> float | None:
    try:
        flops = float(get_template(template).flops(Workload(template=template, args=args_json)))
    except Exception:  # noqa: BLE001 - any template failure just means "no figure"
        return None
    return flops if flops > 0 else None


@dataclass(frozen=True)
class RecordSummary:
    """A record as the dashboard lists it: what it is for, how fast, which config."""

    id: int
    target: str
    template: str
    workload_key: str
    args: list[Any]
    error_no: int
    cost: float | None  # mean seconds; None when it failed
    gflops: float | None
    config: dict[str, Any]
    knobs: dict[str, Any]  # knob name -> value, from the config's entity
    timestamp: float
    worker: str | None


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

    ``best_only``: one row per (device model, workload), its winner as the pretuned log
    picks it (measured first, then cheapest), ordered by template and workload; else
    every record, newest first."""
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
        groups = _group_best(clauses)
        total = session.scalar(select(func.count()).select_from(groups.subquery())) or 0
        page = (groups.order_by(RecordRow.workload_key, RecordRow.target_kind,
                                RecordRow.target_model)
                .limit(limit).offset(offset).subquery())
        rows = session.execute(
            select(*columns).where(RecordRow.id.in_(_winner_ids(page)))
            .order_by(RecordRow.workload_key, RecordRow.target_kind, RecordRow.target_model))
        return total, [_summary(r) for r in rows]
    total = session.scalar(select(func.count()).select_from(RecordRow).where(*clauses)) or 0
    rows = session.execute(select(*columns).where(*clauses).order_by(RecordRow.id.desc())
                           .limit(limit).offset(offset))
    return total, [_summary(r) for r in rows]

"""The records database: import AutoTVM lines, query, pick the best (ApplyHistoryBest)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import Text, and_, cast, func, insert, select
from sqlalchemy.orm import Session, aliased

from compiler.templates import get_template
from schemas import Record, RecordFormatError, Target, Workload
from schemas.measure import FAILED_COST
from schemas.record import read_lines
from tuner_server.db.models import RecordRow

BATCH = 1000


@dataclass
class ImportReport:
    accepted: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class BestAnswer:
    """The best record for one workload and which ApplyHistoryBest rule found it."""

    workload: Workload
    record: Record | None
    rule: str  # "model", "target_key:<key>" or "none"


def record_row(record: Record) -> dict[str, Any]:
    target = record.target
    return {
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


def add_records(session: Session, records: Iterable[Record]) -> int:
    rows = [record_row(r) for r in records]
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


def import_lines(session: Session, lines: Iterable[str]) -> ImportReport:
    """Keep every valid line; report the others with their line number and reason."""
    report = ImportReport()
    good: list[Record] = []
    for number, item in read_lines(lines):
        if isinstance(item, RecordFormatError):
            report.errors.append((number, str(item)))
        elif (why := _unstorable(item)) is not None:
            report.errors.append((number, why))
        else:
            good.append(item)
    report.accepted = add_records(session, good)
    return report


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
    rows = session.scalars(
        select(RecordRow.line).where(*clauses).order_by(RecordRow.id).limit(limit).offset(offset)
    ).all()
    return total, [Record.from_json(line) for line in rows]


def _cheapest(session: Session, workload: Workload, *clauses: Any) -> Record | None:
    line = session.scalar(
        select(RecordRow.line)
        .where(RecordRow.workload_key == workload.key, RecordRow.error_no == 0, *clauses)
        .order_by(RecordRow.mean_cost, RecordRow.id)
        .limit(1)
    )
    return Record.from_json(line) if line is not None else None


def best(session: Session, workloads: Sequence[Workload], target: Target) -> list[BestAnswer]:
    """AutoTVM's ApplyHistoryBest: lowest mean cost among error_no 0 records, taken from
    the same device model first, then from each of the target's keys in order; ties go
    to the record stored first, as AutoTVM keeps the first of equal costs."""
    answers = []
    for workload in workloads:
        found, rule = None, "none"
        if target.model != "unknown":
            found = _cheapest(session, workload, RecordRow.target_model == target.model)
            rule = "model" if found else "none"
        if found is None:
            for key in target.keys:
                found = _cheapest(session, workload, RecordRow.target_keys.contains(f",{key},"))
                if found is not None:
                    rule = f"target_key:{key}"
                    break
        answers.append(BestAnswer(workload, found, rule))
    return answers


# One best record per (target kind, device model, workload): the pretuned log's and the
# dashboard's unit. ``ix_records_groups`` holds every column these queries read, so the
# winners are found from the index alone; only their own JSON lines are read.
_GROUP = (RecordRow.target_kind, RecordRow.target_model, RecordRow.workload_key)


def _group_best(clauses: Sequence[Any]) -> Any:
    """SELECT kind, model, workload key, lowest working cost, grouped, under ``clauses``
    (each a function of the group: target, template, workload key)."""
    return (select(*_GROUP, func.min(RecordRow.mean_cost).label("best"))
            .where(RecordRow.error_no == 0, *clauses).group_by(*_GROUP))


def _winner_ids(groups: Any) -> Any:
    """SELECT the id of each group's best record (``groups``: a ``_group_best`` subquery):
    of equal costs the first stored, as AutoTVM keeps the first it reads."""
    r = aliased(RecordRow)
    return (select(func.min(r.id))
            .join(groups, and_(r.error_no == 0, r.target_kind == groups.c.target_kind,
                               r.target_model == groups.c.target_model,
                               r.workload_key == groups.c.workload_key,
                               r.mean_cost == groups.c.best))
            .group_by(r.target_kind, r.target_model, r.workload_key))


def pretuned_log(session: Session, target: Target) -> tuple[list[str], str]:
    """Best record per (device model, workload) among ``target``'s records, as AutoTVM
    lines, plus an ETag that changes whenever the answer does.

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

    ``best_only``: one row per (device model, workload), its cheapest working record (as
    the pretuned log picks), ordered by template and workload; else every record, newest
    first."""
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

"""The records database: import AutoTVM lines, query, pick the best (ApplyHistoryBest)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from schemas import Record, RecordFormatError, Target, Workload
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


def pretuned_log(session: Session, target: Target) -> tuple[list[str], str]:
    """Best record per (device model, workload) among ``target``'s records, as AutoTVM
    lines, plus an ETag that changes whenever the answer does."""
    rows = session.execute(
        select(RecordRow.target_model, RecordRow.workload_key, RecordRow.line)
        .where(RecordRow.error_no == 0, *_target_filter(target))
        .order_by(RecordRow.target_model, RecordRow.workload_key, RecordRow.mean_cost,
                  RecordRow.id)
    ).all()
    lines, seen = [], set()
    for model, key, line in rows:
        if (model, key) in seen:
            continue
        seen.add((model, key))
        lines.append(Record.from_json(line).to_line())
    etag = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]
    return lines, f'"{etag}"'

"""SQLAlchemy 2.x models. The schema itself is owned by the Alembic migrations."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


def record_hash(line: Any) -> str:
    """SHA-256 of what makes two records the same measurement: input (target,
    workload), config and result as canonical JSON; not the version fields nor ``info``
    (which worker, notes). The records table's unique key, so an import stores a line
    at most once even when two imports run at once."""
    key = ([line.get("input"), line.get("config"), line.get("result")]
           if isinstance(line, dict) else line)
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _line_hash(context: DefaultExecutionContext) -> str:
    return record_hash(context.get_current_parameters()["line"])


class RecordRow(Base):
    """One measured trial (an AutoTVM log line), denormalised for the best-record lookup."""

    __tablename__ = "records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(255))
    target_kind: Mapped[str] = mapped_column(String(32), index=True)
    target_model: Mapped[str] = mapped_column(String(128), index=True)
    # ",cuda,gpu," so a key matches with LIKE '%,gpu,%'
    target_keys: Mapped[str] = mapped_column(String(255))
    template: Mapped[str] = mapped_column(String(128), index=True)
    workload_key: Mapped[str] = mapped_column(Text)
    line: Mapped[dict[str, Any]] = mapped_column(JSON)  # the AutoTVM record, as written
    mean_cost: Mapped[float] = mapped_column(Float)
    error_no: Mapped[int] = mapped_column(Integer)
    timestamp: Mapped[float] = mapped_column(Float)
    # when the server stored it (``timestamp`` is the worker's clock): the dashboard's
    # "last 10 minutes" reads the newest records through its index
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now,
                                                 index=True)
    # set when the record is a trial's result: a trial is recorded at most once
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # "measured" (this fleet's trial) or "imported": an import never outranks a
    # measurement of the same device
    source: Mapped[str] = mapped_column(String(16), default="measured",
                                        server_default="measured")
    # record_hash(line), filled in from ``line`` on insert
    line_hash: Mapped[str] = mapped_column(String(64), default=_line_hash)
    # the config index this record re-measured in its task's verification (a trial of
    # verify_round >= 1); null for search trials and imports. On its device a config's
    # verified measurements, ranked by their median, outrank every unverified record.
    verified_config: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # timed with cold weights (the line's info says ``cpu_cache_flush``): on its device
    # the rule ranks these before the records timed warm
    cold: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    __table_args__ = (
        # best lookup: walk one workload's good records cheapest first; on PostgreSQL
        # with what the rule ranks by, so a lookup reads its candidates from the index
        Index("ix_records_best", "workload_key", "error_no", "mean_cost", "id",
              postgresql_include=["target_kind", "target_model", "target_keys", "target",
                                  "source", "verified_config", "cold"]),
        # best per (kind, model, workload) (pretuned log, dashboard) from the index alone
        Index("ix_records_groups", "error_no", "target_kind", "target_model", "workload_key",
              "mean_cost", "template"),
        UniqueConstraint("trial_id", name="uq_records_trial_id"),
        Index("uq_records_line_hash", "line_hash", unique=True),
        # the rule reads working records and every verification record (its failures
        # count): this index finds the few failed ones without a scan of the table
        Index("ix_records_verified", "verified_config"),
    )


class TokenRow(Base):
    """A bearer token; only its SHA-256 is stored."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # the worker this token speaks for (a registration's token); null: any caller of its
    # role (a worker token that only registers)
    worker_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), index=True)
    tuner: Mapped[str] = mapped_column(String(32))
    n_trial: Mapped[int] = mapped_column(Integer)
    early_stopping: Mapped[int | None] = mapped_column(Integer, nullable=True)
    plan_size: Mapped[int] = mapped_column(Integer)
    measure: Mapped[dict[str, Any]] = mapped_column(JSON)
    # best configs of each task measured again when its search ends (0: none)
    verify_top: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # the model the tasks come from (its file name); null for a job of given tasks
    model: Mapped[str | None] = mapped_column(String(255), nullable=True)


class TaskRow(Base):
    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    template: Mapped[str] = mapped_column(String(128))
    args: Mapped[list[Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    trials_planned: Mapped[int] = mapped_column(Integer, default=0)
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    best_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)  # trials_done then
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why it failed
    # the model's layers this task serves (null: unknown, counted as one layer)
    layers: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # the default config planned first (the template's, sized for the serving devices'
    # lanes); null: not planned yet, not valid there, or a task from before it was kept
    default_index: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class TrialRow(Base):
    """One config of one task sent for measurement; its status is the queue's truth."""

    __tablename__ = "trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    queue: Mapped[str] = mapped_column(String(255))  # target the trial must run on
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_index: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # queued, leased, done
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lease_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_no: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # 0: a search trial (counts against n_trial); n >= 1: round n of the task's
    # verification, which measures the same configs again
    verify_round: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        UniqueConstraint("task_id", "config_index", "verify_round",
                         name="uq_trials_task_config_round"),
        Index("ix_trials_queue", "status", "queue", "id"),
        Index("ix_trials_lease", "status", "lease_deadline"),
        Index("ix_trials_worker", "worker_id", "status"),
    )


class WorkerRow(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    target: Mapped[str] = mapped_column(String(255))
    limits: Mapped[dict[str, Any]] = mapped_column(JSON)
    last_seen: Mapped[float] = mapped_column(Float)
    # the device's own name ("NVIDIA H200"), when the worker says it
    device: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # when it deregistered (SIGTERM); null while it serves
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)

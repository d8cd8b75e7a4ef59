"""SQLAlchemy 2.x models. The schema itself is owned by the Alembic migrations."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


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
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    __table_args__ = (
        # best lookup: walk one workload's good records cheapest first
        Index("ix_records_best", "workload_key", "error_no", "mean_cost", "id"),
    )


class TokenRow(Base):
    """A bearer token; only its SHA-256 is stored."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

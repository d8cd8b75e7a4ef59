"""Server settings from the environment (prefix ``TUNER_``); defaults are the embedded ones."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tuner"


def default_database_url() -> str:
    return f"sqlite:///{user_data_dir() / 'tuner.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_")

    database_url: str = default_database_url()
    queue_url: str = "sql"  # or redis://127.0.0.1:6379/0
    redis_prefix: str = "tuner"
    require_auth: bool = True
    lease_seconds: float = 120.0  # a heartbeat extends it; past it the trial is requeued
    long_poll_seconds: float = 10.0
    scheduler_interval: float = 0.2
    run_scheduler: bool = True
    # a fleet's bootstrap worker token (TUNER_WORKER_TOKEN): admitted at startup; it only
    # registers workers, each of which gets a token of its own
    worker_token: str | None = None
    # server processes sharing the database (TUNER_SERVER_PROCESSES: ``tuner serve
    # --workers N`` sets it); each takes its share of PostgreSQL's connections
    server_processes: int = Field(1, ge=1)
    # connections one process may hold (TUNER_DB_CONNECTIONS), its pool and records/best's
    # reader together; unset: its share of the server's max_connections
    # (``db.session.connection_share``). Servers on several hosts over one database set it.
    db_connections: int | None = Field(None, ge=1)

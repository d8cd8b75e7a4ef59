"""Server settings from the environment (prefix ``TUNER_``); defaults are the embedded ones."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


def user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tuner"


def default_database_url() -> str:
    return f"sqlite:///{user_data_dir() / 'tuner.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_")

    database_url: str = default_database_url()
    # Embedded mode runs without tokens; a fleet server sets this to require them.
    require_auth: bool = True

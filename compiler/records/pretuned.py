"""TopHub's public pretuned logs, carried as package data (see tophub/README.md): real
AutoTVM records that import, map onto our templates and apply offline."""

from __future__ import annotations

from pathlib import Path

TOPHUB_DIR = Path(__file__).resolve().parent / "tophub"

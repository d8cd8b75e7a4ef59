"""Image ops: resize (nearest, linear, cubic; every coordinate transformation)."""

from __future__ import annotations

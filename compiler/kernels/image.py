"""Resize: one work-item per output element, its taps read from tables made at build time."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Node
from compiler.templates.base import Kernel

KERNELS: dict[str, Callable[[Node], Kernel]] = {}

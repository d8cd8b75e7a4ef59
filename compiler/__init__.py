"""The embedded compiler and its kernel library.

``compiler.build(model, target, records=...)`` compiles a model (see ``build_module``);
it is loaded on first use, so the server, which imports only ``compiler.templates``,
never loads the runtime.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "build":
        from compiler.build_module import build

        return build
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")

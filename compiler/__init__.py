"""The embedded compiler and its kernel library.

``compiler.build(model, target, records=...)`` compiles a model (see ``build_module``);
``compiler.quantize(graph, compiler.QConfig(...))`` rewrites its convs into int8;
it is loaded on first use, so the server, which imports only ``compiler.templates``,
never loads the runtime.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "build":
        from compiler.build_module import build

        return build
    if name in ("quantize", "QConfig"):
        from compiler.passes import quantize

        return getattr(quantize, name)
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")

"""DESIGN.md's import rules, checked on what a fresh interpreter actually loads."""

from __future__ import annotations

import json
import subprocess
import sys


def within(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def loaded_after(statement: str) -> list[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return json.loads(out.splitlines()[-1])


def test_server_never_loads_the_runtime_the_workers_or_the_compiler_pipeline() -> None:
    modules = loaded_after("import tuner_server.app")
    assert within(modules, "compiler.runtime", "compiler.build_module", "compiler.kernels",
                  "workers", "cli") == []
    assert "compiler.templates" in modules  # the one part it does use


def test_compiler_never_loads_the_server_or_the_workers() -> None:
    modules = loaded_after("import compiler.build_module, compiler.records, "
                           "compiler.frontend")
    assert within(modules, "tuner_server", "workers", "cli") == []

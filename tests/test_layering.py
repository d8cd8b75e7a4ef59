"""DESIGN.md's import rules, checked on what a fresh interpreter actually loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
                  "workers", "cli", "tuner_client") == []
    assert "compiler.templates" in modules  # the one part it does use


def test_compiler_never_loads_the_server_or_the_workers() -> None:
    modules = loaded_after("import compiler.build_module, compiler.records, "
                           "compiler.frontend")
    assert within(modules, "tuner_server", "workers", "cli") == []


def test_client_loads_only_the_contract() -> None:
    """``tuner_client`` is what workers, the compiler and scripts reach the server with:
    importing it must not pull in the server, the compiler, the workers or the CLI."""
    modules = loaded_after("import tuner_client")
    assert within(modules, "tuner_server", "compiler", "workers", "cli", "tuner") == []
    assert "schemas.api" in modules and "httpx" in modules


def test_api_paths_appear_only_in_the_server_and_the_client() -> None:
    """Every caller reaches the REST API through ``tuner_client``: no other package
    spells an API path (tests do, on purpose: they address the API itself)."""
    offenders = [str(path.relative_to(REPO))
                 for package in ("cli", "compiler", "workers", "tuner", "bench", "schemas")
                 for path in sorted((REPO / package).rglob("*.py"))
                 if "/api/v1" in path.read_text(encoding="utf-8")]
    assert offenders == [], f"API paths outside tuner_server/ and tuner_client/: {offenders}"

"""Records import de-duplicates (the same log twice adds nothing, over HTTP, on SQLite
and PostgreSQL), and `tuner records import --pretuned [--target T]` loads the TopHub logs
shipped with the package into a database."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import (
    BACKENDS,
    LiveServer,
    live_server,
    migrate,
    migrated_sessions,
    tophub_lines,
    tophub_paths,
)
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from cli.main import app
from compiler.records.pretuned import TOPHUB_DIR
from schemas import Target
from tuner_server.services import records as svc

pytestmark = pytest.mark.timeout(300)

runner = CliRunner()
TEXT = {"content-type": "text/plain"}


def distinct(path: Path) -> int:
    """Records of a log that differ in input, config or result (cuda_v0.10.log repeats
    one line)."""
    return len({json.dumps([r["input"], r["config"], r["result"]], sort_keys=True)
                for r in tophub_lines(path)})


@pytest.fixture(params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(str(request.param), tmp_path) as live:
        yield live


def test_importing_a_log_twice_adds_nothing(server: LiveServer) -> None:
    def post(body: str) -> dict[str, Any]:
        resp = client.post("/api/v1/records/import", content=body, headers=TEXT)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def total() -> int:
        return int(client.get("/api/v1/records", params={"limit": 1}).json()["total"])

    with server.client("client") as client:
        for path in tophub_paths():
            lines = len(tophub_lines(path))
            first = post(path.read_text())
            assert first["accepted"] == distinct(path), path.name
            assert first["duplicates"] == lines - distinct(path)
        stored = total()
        assert stored == sum(distinct(p) for p in tophub_paths())
        for path in tophub_paths():
            again = post(path.read_text())
            assert (again["accepted"], again["refused"], again["duplicates"]) == (
                0, 0, len(tophub_lines(path))), path.name
        assert total() == stored


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(str(request.param), tmp_path) as made:
        yield made


def test_a_duplicate_is_the_same_input_config_and_result(
        sessions: sessionmaker[Session]) -> None:
    """Another worker note (info) or version field is the same measurement; another
    target, config or cost is a new record."""
    base = tophub_lines(tophub_paths()[0])[0]

    def variant(**change: Any) -> str:
        rec = copy.deepcopy(base)
        for key, value in change.items():
            rec[key] = value
        return json.dumps(rec)

    other_target = copy.deepcopy(base["input"])
    other_target[0] = "cuda -model=h200"
    other_config = copy.deepcopy(base["config"])
    other_config["index"] += 1
    other_result = copy.deepcopy(base["result"])
    other_result[0] = [c * 2 for c in other_result[0]]
    with sessions.begin() as session:
        assert svc.import_lines(session, [json.dumps(base)]).accepted == 1
    with sessions.begin() as session:
        report = svc.import_lines(session, [
            variant(info={"worker": "elsewhere"}), variant(tvm_version="0.8"),
            variant(input=other_target), variant(config=other_config),
            variant(result=other_result), variant(result=other_result)])
    assert (report.accepted, report.duplicates, report.refused) == (3, 3, 0)


def invoke(*argv: str) -> Any:
    result = runner.invoke(app, list(argv))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def stored(url: str, target: str | None = None) -> int:
    from tuner_server.db.session import make_engine, session_factory

    engine = make_engine(url)
    try:
        with session_factory(engine)() as session:
            return svc.query(session, Target.parse(target) if target else None, limit=1)[0]
    finally:
        engine.dispose()


def test_import_pretuned_loads_the_shipped_logs_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    first = invoke("records", "import", "--pretuned", "--database-url", url)
    assert first.exit_code == 0, first.output
    for path in tophub_paths():
        assert f"{path}: {distinct(path)} imported, 0 refused" in first.stdout
    count = stored(url)
    assert count == sum(distinct(p) for p in TOPHUB_DIR.glob("*.log"))
    again = invoke("records", "import", "--pretuned", "--database-url", url)
    assert again.exit_code == 0, again.output
    for path in tophub_paths():
        assert (f"{path}: 0 imported, 0 refused, {len(tophub_lines(path))} duplicates"
                in again.stdout)
    assert stored(url) == count


def test_import_pretuned_for_one_target(tmp_path: Path) -> None:
    """--target keeps the records the records filter would: its kind, and its model when
    given (opencl -model=gfx900's records ship in the rocm log)."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    result = invoke("records", "import", "--pretuned", "--target", "cuda -model=v100",
                    "--database-url", url)
    assert result.exit_code == 0, result.output
    assert stored(url) == stored(url, "cuda -model=v100") == 137
    result = invoke("records", "import", "--pretuned", "--target", "opencl",
                    "--database-url", url)
    assert result.exit_code == 0, result.output
    assert "rocm_v0.05.log: 20 imported" in result.stdout
    assert stored(url, "opencl") == 97 + 20 and stored(url) == 137 + 117


def test_import_needs_files_or_pretuned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    neither = invoke("records", "import", "--database-url", url)
    assert neither.exit_code == 2 and "--pretuned" in neither.output
    both = invoke("records", "import", str(tophub_paths()[0]), "--pretuned",
                  "--database-url", url)
    assert both.exit_code == 2
    stray = invoke("records", "import", str(tophub_paths()[0]), "--target", "cuda",
                   "--database-url", url)
    assert stray.exit_code == 2 and "--target" in stray.output
    unknown = invoke("records", "import", "--pretuned", "--target", "vulkan",
                     "--database-url", url)
    assert unknown.exit_code == 1 and "no pretuned records for vulkan" in unknown.output
    assert stored(url) == 0

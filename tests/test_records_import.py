"""Records import de-duplicates (the same log twice adds nothing, over HTTP, on SQLite
and PostgreSQL), and `tuner records import --pretuned [--target T]` loads the TopHub logs
shipped with the package into a database."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import (
    BACKENDS,
    LiveServer,
    empty_database,
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


def test_concurrent_imports_store_one_copy(sessions: sessionmaker[Session]) -> None:
    """Two imports of one log at once (two threads, two transactions): the unique
    ``line_hash`` keeps one copy of each line, and between them the reports count every
    line once as accepted and once as a duplicate."""
    path = tophub_paths()[0]
    lines = path.read_text().splitlines()
    start = threading.Barrier(2)
    reports: list[svc.ImportReport] = []

    def run() -> None:
        start.wait(30)
        with sessions.begin() as session:
            reports.append(svc.import_lines(session, lines))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(reports) == 2, "an import failed"
    with sessions() as session:
        assert svc.query(session, limit=1)[0] == distinct(path)
    assert sum(r.accepted for r in reports) == distinct(path)
    assert [r.accepted + r.duplicates for r in reports] == [len(tophub_lines(path))] * 2


def _alembic(url: str, revision: str) -> None:
    """``alembic upgrade <revision>`` on ``url`` (the project's scripts)."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    import migrations
    from tuner_server.db.session import make_engine

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_hashes_stored_rows_and_keeps_the_first_copy(backend: str,
                                                             tmp_path: Path) -> None:
    """Migration 0005 over rows stored before it: each gets its record_hash, of rows
    that repeat one another (another info or version, same measurement) the first
    stored stays, and a later import of them counts as a duplicate."""
    import sqlalchemy as sa

    from tuner_server.db.models import record_hash
    from tuner_server.db.session import make_engine, session_factory

    first, other = tophub_lines(tophub_paths()[0])[:2]
    again = copy.deepcopy(first)
    again["info"] = {"worker": "elsewhere"}
    old = sa.table("records", *(sa.column(c) for c in (
        "target", "target_kind", "target_model", "target_keys", "template", "workload_key",
        "mean_cost", "error_no", "timestamp", "source", "created_at")),
        sa.column("line", sa.JSON))
    with empty_database(backend, tmp_path) as url:
        _alembic(url, "0004")
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.insert(old), [
                    {"target": rec["input"][0], "target_kind": "cuda", "target_model": "x",
                     "target_keys": ",cuda,gpu,", "template": rec["input"][1],
                     "workload_key": json.dumps(rec["input"][1:3]), "mean_cost": 1e-3,
                     "error_no": 0, "timestamp": 1.0, "source": "imported", "line": rec,
                     "created_at": datetime.now(UTC)}
                    for rec in (first, other, again)])
            _alembic(url, "head")
            with engine.connect() as conn:
                rows = conn.execute(sa.text(
                    "SELECT id, line_hash FROM records ORDER BY id")).all()
            assert rows == [(1, record_hash(first)), (2, record_hash(other))]
            with session_factory(engine).begin() as session:
                report = svc.import_lines(session, [json.dumps(again), json.dumps(other)])
            assert (report.accepted, report.duplicates) == (0, 2)
        finally:
            engine.dispose()

"""The load harness of bench/server.py (`--load`, issue 18, point 5): its double-lease
count catches a fabricated double lease, and a short run against a real server on
PostgreSQL + Redis counts no error, no double lease and no lost result."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from server_fixtures import PG_UNREACHABLE, REDIS_UNREACHABLE

BENCH = Path(__file__).resolve().parents[1] / "bench" / "server.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_server", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_server"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_double_leases_are_counted(bench: ModuleType) -> None:
    """(trial, worker, leased at, lease deadline) and (trial, worker, accepted at)."""
    leases = [(1, 10, 100.0, 220.0), (1, 11, 150.0, 270.0),  # still held by 10: twice
              (2, 10, 100.0, 105.0), (2, 11, 110.0, 230.0),  # 10's lease had expired
              (3, 10, 100.0, 220.0), (3, 11, 300.0, 420.0),  # handed out after its result
              (4, 12, 100.0, 220.0),                         # once
              (5, 12, 100.0, 220.0), (5, 12, 100.5, 220.5)]  # twice to the same worker
    reported = [(1, 10, 160.0), (3, 10, 200.0), (4, 12, 130.0), (2, 11, 140.0)]
    assert bench.audit_leases(leases, reported) == (3, [1, 3, 5])
    assert bench.audit_leases(leases[2:5] + leases[6:7], reported) == (0, [])


@pytest.mark.timeout(240)
@pytest.mark.skipif(bool(PG_UNREACHABLE or REDIS_UNREACHABLE),
                    reason=str(PG_UNREACHABLE or REDIS_UNREACHABLE))
def test_a_short_load_run_loses_nothing(bench: ModuleType,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench.main(["--load", "--load-workers", "12", "--load-seconds", "4", "--load-ramp",
                     "1", "--warmup", "3", "--load-measure-s", "0.05", "--load-batch", "2",
                     "--plan-size", "16", "--tasks", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"errors 0 of \d+ calls", out), out
    assert "leased twice at once 0; lost 0; recorded twice 0" in out, out
    recorded = re.search(r"recorded (\d+)/s;", out)
    assert recorded is not None and int(recorded.group(1)) > 0, out

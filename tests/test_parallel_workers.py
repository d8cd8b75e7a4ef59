"""The suite's own plumbing under parallel test workers (``pytest -n``, as ``make test``
runs it): ports no two workers share, and what a worker sends its controller."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from server_fixtures import PORT_RANGE, free_port

TESTS = Path(__file__).parent
CLAIMS = 300  # of 12,000 ports: ~7.5 shared by chance if claims were not exclusive
HOLDER = f"""
import sys
from server_fixtures import free_port
print(" ".join(str(free_port()) for _ in range({CLAIMS})), flush=True)
sys.stdin.read()  # hold the claims until the parent is done
"""
# bad input is logged and warned about as it came, lone surrogates included
SURROGATES = '''
import logging
import warnings

def test_warns():
    warnings.warn("bad input: \\udcff")

def test_logs():
    logging.getLogger("x").warning("bad input: \\ud800")
    assert False, "bad input: \\udcff"

def test_after():
    pass
'''


def test_two_processes_never_hand_out_the_same_port() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=TESTS,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        theirs = {int(p) for p in holder.stdout.readline().split()}
        ours = {free_port() for _ in range(CLAIMS)}
    finally:
        try:
            holder.communicate("", timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            raise
    assert len(theirs) == len(ours) == CLAIMS
    assert not theirs & ours
    # below the ephemeral range that client connections take their ports from
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] < 32768 for p in theirs | ours)


def test_lone_surrogates_in_warnings_and_reports_reach_the_controller(tmp_path: Path) -> None:
    """A test worker sends UTF-8: unescaped, a lone surrogate in a warning or a failed
    test's report ends in an INTERNALERROR (or the worker) instead of the test's outcome."""
    (tmp_path / "test_bad_text.py").write_text(SURROGATES)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-q", str(tmp_path / "test_bad_text.py")],
        check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "INTERNALERROR" not in run.stdout + run.stderr, run.stdout[-3000:]
    assert "1 failed, 2 passed" in run.stdout, run.stdout[-3000:]
    assert "UserWarning: bad input: \\udcff" in run.stdout

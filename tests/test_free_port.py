"""free_port() under parallel test workers (``pytest -n``): a port one process handed out
is never handed out by another while the first lives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server_fixtures import PORT_RANGE, free_port

CLAIMS = 300  # of 12,000 ports: ~7.5 shared by chance if claims were not exclusive
HOLDER = f"""
import sys
from server_fixtures import free_port
print(" ".join(str(free_port()) for _ in range({CLAIMS})), flush=True)
sys.stdin.read()  # hold the claims until the parent is done
"""


def test_two_processes_never_hand_out_the_same_port() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=Path(__file__).parent,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        theirs = {int(p) for p in holder.stdout.readline().split()}
        ours = {free_port() for _ in range(CLAIMS)}
    finally:
        holder.communicate("", timeout=30)
    assert len(theirs) == len(ours) == CLAIMS
    assert not theirs & ours
    # below the ephemeral range that client connections take their ports from
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] < 32768 for p in theirs | ours)

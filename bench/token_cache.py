"""What authenticating a request costs, with the token cache and without (ttl 0: a
session and a query per request, as before), side by side on SQLite and PostgreSQL
(when one answers at 127.0.0.1:5432): microseconds per request's token check,
alternating rounds.

    .venv/bin/python bench/token_cache.py [--checks 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_fixtures import make_tokens, migrated_sessions  # noqa: E402

from tuner_server.services.tokens import TokenCache  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    print(f"{'backend':10} {'lookup per request us':>22} {'cached us':>10} {'ratio':>7}")
    for backend in ("sqlite", "postgresql"):
        try:
            with tempfile.TemporaryDirectory() as tmp, \
                    migrated_sessions(backend, Path(tmp)) as sessions:
                token = make_tokens(str(sessions.kw["bind"].url.render_as_string(
                    hide_password=False)))["client"]
                seconds: dict[float, list[float]] = {0.0: [], 1.0: []}
                for _ in range(opts.rounds):
                    for ttl in seconds:
                        cache = TokenCache(sessions, ttl=ttl)
                        start = time.perf_counter()
                        for _ in range(opts.checks):
                            assert cache.lookup(token) is not None
                        seconds[ttl].append((time.perf_counter() - start) / opts.checks)
        except Exception as err:  # noqa: BLE001 - no PostgreSQL here: say so
            print(f"{backend:10} skipped: {err}")
            continue
        per, cached = statistics.median(seconds[0.0]), statistics.median(seconds[1.0])
        print(f"{backend:10} {per * 1e6:22.1f} {cached * 1e6:10.1f} {per / cached:6.0f}x")


if __name__ == "__main__":
    main()

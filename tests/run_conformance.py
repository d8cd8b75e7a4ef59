"""Run ONNX's node cases in scope (``tests/onnx_conformance.py``) and print what failed
and the per-operator table: ``python tests/run_conformance.py [NAME_SUBSTRING ...]``."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from onnx_conformance import collect, per_operator, run, table_lines  # noqa: E402

from compiler.runtime import open_device  # noqa: E402


def main(filters: list[str]) -> None:
    logging.disable(logging.WARNING)
    device = open_device()
    cases = [c for c in collect() if not filters or any(f in c.name for f in filters)]
    start = time.perf_counter()
    failures = {c.name: why for c in cases if (why := run(c, device)) is not None}
    for name, why in sorted(failures.items()):
        print(f"FAIL {name}: {why}")
    print(f"{len(cases) - len(failures)}/{len(cases)} passed "
          f"({time.perf_counter() - start:.0f} s)")
    for line in table_lines(per_operator(cases, failures)):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

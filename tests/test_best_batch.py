"""records/best for many workloads at once: the same answers as asking one workload at a
time, on a mix of this device's records, other devices', none, and configs that left the
space; and a query count that does not grow with the number of workloads."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import BACKENDS, migrated_sessions
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from compiler.templates import get_template
from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target, Workload
from tuner_server.services import records as svc

TEMPLATE = "conv2d_nchw.cuda"
RECORD_TARGETS = ["cuda -model=h200 -arch=sm_90", "cuda -model=a100 -arch=sm_80",
                  "rocm -model=mi300x", "opencl -model=pocl-cpu"]
# a model with records (this-device rule first) and one without (target keys only), and a
# kind no record shares a key with
ASKED = ["cuda -model=h200", "cuda -model=l4", "vulkan -model=arc", "llvm -model=xeon"]


def conv(batch: int, c: int, hw: int) -> Workload:
    return Workload(template=TEMPLATE, args=(
        ["TENSOR", [batch, c, hw, hw], "float32"], ["TENSOR", [c, c, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "float32"))


def workloads(n: int) -> list[Workload]:
    shapes = [(c, hw) for c in (16, 32, 64, 128) for hw in (7, 14, 28, 56)]
    return [conv(1 + i // len(shapes), *shapes[i % len(shapes)]) for i in range(n)]


def fill(session: Session, asked: list[Workload], seed: int = 0) -> None:
    """Records for all but every 7th workload: each on 1-4 devices, some imported, some
    failed, and some (the cheapest, on purpose) with a config of another workload's
    space, which the rule must pass over."""
    rng = random.Random(seed)
    template = get_template(TEMPLATE)
    spaces: dict[str, list[Config]] = {}
    for w in asked:
        space = template.space(w)
        spaces[w.key] = [space.sample(rng) for _ in range(3)]
    measured: list[Record] = []
    imported: list[Record] = []
    for i, w in enumerate(asked):
        if i % 7 == 3:
            continue  # no record at all: rule "none"
        for target in rng.sample(RECORD_TARGETS, rng.randint(1, len(RECORD_TARGETS))):
            for _ in range(rng.randint(1, 3)):
                failed = rng.random() < 0.15
                alien = rng.random() < 0.25  # a config outside this workload's space
                config = (spaces[asked[(i + 1) % len(asked)].key][0] if alien
                          else rng.choice(spaces[w.key]))
                cost = 1e-6 if alien else rng.choice([1e-4, 2e-4, 3e-4])  # ties happen
                result = MeasureResult(
                    costs=(1e9,) if failed else (cost,),
                    error_no=MeasureErrorNo.RUNTIME_DEVICE if failed else MeasureErrorNo.NO_ERROR,
                    all_cost=0.1, timestamp=1.7e9 + len(measured) + len(imported))
                record = Record(target=Target.parse(target), workload=w, config=config,
                                result=result)
                (imported if rng.random() < 0.3 else measured).append(record)
    svc.add_records(session, measured, source="measured")
    svc.add_records(session, imported, source="imported")


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


def answers(found: list[svc.BestAnswer]) -> list[tuple[str, Any]]:
    return [(a.rule, a.line) for a in found]


def test_batch_answers_as_one_at_a_time(sessions: sessionmaker[Session]) -> None:
    """Every rule path, asked for 120 workloads at once (a few twice) and one workload
    per call: the same winners, the same rules, the same lines; the lines read back as
    the records they are."""
    asked = workloads(120)
    with sessions.begin() as session:
        fill(session, asked)
    batch = asked + asked[:5]  # repeats are answered in place
    for text in ASKED:
        target = Target.parse(text)
        with sessions() as session:
            together = svc.best(session, batch, target)
        with sessions() as session:
            alone = [svc.best(session, [w], target)[0] for w in batch]
        assert answers(together) == answers(alone), text
        assert [a.workload for a in together] == batch
        for answer in together:
            assert (answer.record is None) == (answer.line is None)
            if answer.record is not None:
                assert answer.record.to_json() == answer.line
                assert answer.record.workload.key == answer.workload.key
    with sessions() as session:
        rules = {a.rule for text in ASKED[:2]
                 for a in svc.best(session, asked, Target.parse(text))}
    assert {"model", "none", "target_key:cuda"} <= rules


def test_queries_do_not_grow_with_the_batch(sessions: sessionmaker[Session]) -> None:
    """1,000 workloads in one call: a handful of statements (one per tier, a few rounds
    of lines), not one per workload."""
    asked = workloads(1000)
    with sessions.begin() as session:
        fill(session, asked)
    engine = sessions.kw["bind"]
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(engine, "before_cursor_execute", count)
    try:
        for text in ("cuda -model=h200", "cuda -model=l4"):
            statements.clear()
            with sessions() as session:
                found = svc.best(session, asked, Target.parse(text))
            assert sum(a.line is not None for a in found) > 500
            selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
            assert len(selects) <= 8, (text, len(selects))
    finally:
        event.remove(engine, "before_cursor_execute", count)

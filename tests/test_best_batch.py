"""records/best for many workloads at once: the same answers as asking one workload at a
time, on a mix of this device's records, other devices', none, and configs that left the
space; and a query count that does not grow with the number of workloads."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import BACKENDS, migrated_sessions
from sqlalchemy import delete, event, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from compiler.records.choose import DEFAULT, THIS_DEVICE, choose_one
from compiler.records.source import Candidate
from compiler.templates import ConfigError, get_template, register_template
from compiler.templates.history import Stored, device_order
from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target, Workload
from schemas.api import BestResponse
from schemas.record import COLD_INFO
from tuner_client.client import _best_items
from tuner_server.db.models import RecordRow
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


def cold_info(rng: random.Random) -> dict[str, Any] | None:
    """A third of the records timed with cold weights: the rule ranks them apart."""
    return {COLD_INFO: True} if rng.random() < 0.3 else None


def fill(session: Session, asked: list[Workload], seed: int = 0) -> None:
    """Records for all but every 7th workload: each on 1-4 devices, some imported, some
    failed, some timed cold, and some (the cheapest, on purpose) with a config of another
    workload's space, which the rule must pass over."""
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
                                result=result, info=cold_info(rng))
                (imported if rng.random() < 0.3 else measured).append(record)
    svc.add_records(session, measured, source="measured")
    svc.add_records(session, imported, source="imported")


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(request.param, tmp_path) as made:
        yield made


def answers(found: list[svc.BestAnswer]) -> list[tuple[str, Any]]:
    return [(a.rule, a.line) for a in found]


@pytest.mark.parametrize("leading", [1, svc.LEADING])
def test_batch_answers_as_one_at_a_time(sessions: sessionmaker[Session], leading: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rule path, asked for 120 workloads at once (a few twice) and one workload
    per call: the same winners, the same rules, the same lines; the lines read back as
    the records they are. A batch reads other devices' first ``leading`` candidates
    of a workload, all of them when none passes: at 1, a quarter of the cheapest
    configs are another workload's, so that read happens too."""
    monkeypatch.setattr(svc, "LEADING", leading)
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


def fill_deep(session: Session, asked: list[Workload], seed: int = 0) -> None:
    """Many records a workload on every device (as a fleet's long searches leave), the
    cheapest often another workload's config, a third timed cold, and on h200
    verification rounds (some failed, some of an alien config): a lookup that reads each group's leaders must
    reach past a group's cut to the candidates it did not read."""
    rng = random.Random(seed)
    template = get_template(TEMPLATE)
    rows: list[dict[str, Any]] = []

    def add(target: str, w: Workload, config: Config, cost: float | None,
            source: str = "measured", verified: int | None = None) -> None:
        result = MeasureResult(
            costs=(1e9,) if cost is None else (cost,),
            error_no=MeasureErrorNo.RUNTIME_DEVICE if cost is None else MeasureErrorNo.NO_ERROR,
            all_cost=0.1, timestamp=1.7e9 + len(rows))
        record = Record(target=Target.parse(target), workload=w, config=config, result=result,
                        info=cold_info(rng))
        rows.append(svc.record_row(record, source, verified))

    for i, w in enumerate(asked):
        space = template.space(w)
        own = [space.sample(rng) for _ in range(4)]
        alien = template.space(asked[(i + 1) % len(asked)]).sample(rng)
        for target in RECORD_TARGETS:
            for _ in range(rng.randint(0, 12)):
                stranger = rng.random() < 0.4
                add(target, w, alien if stranger else rng.choice(own),
                    None if rng.random() < 0.15 else
                    1e-6 * rng.randint(1, 3) if stranger else rng.choice([1e-4, 2e-4, 3e-4]),
                    "imported" if rng.random() < 0.3 else "measured")
        if i % 2:
            for config in rng.sample([*own, alien], 3):
                for _ in range(3):
                    add(RECORD_TARGETS[0], w, config,
                        None if rng.random() < 0.3 else rng.choice([5e-5, 1e-4]),
                        verified=config.index)
    session.execute(insert(RecordRow), rows)


@pytest.mark.parametrize("leading", [1, svc.LEADING])
def test_few_workloads_answer_as_the_rule_over_every_record(
        sessions: sessionmaker[Session], leading: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup of a few workloads reads each group's first ``leading`` + 1 candidates
    (this device's verification rows whole); its answers are the rule's over every
    stored record (the compiler's ``choose_one`` over ``stored_of``), alone and together."""
    monkeypatch.setattr(svc, "LEADING", leading)
    asked = workloads(10)
    with sessions.begin() as session:
        fill_deep(session, asked)
    for text in [*ASKED, "cuda", "rocm -model=mi300x"]:
        target = Target.parse(text)
        expected = []
        with sessions() as session:
            for w in asked:
                choice = choose_one(w, [Candidate(r, "db", measured, verified) for r, measured,
                                        verified in svc.stored_of(session, [w])], target, None)
                rule = ("none" if choice.source == DEFAULT else "model"
                        if choice.source == THIS_DEVICE else f"target_key:{choice.key}")
                expected.append((rule, None if choice.record is None
                                 else choice.record.to_json()))
        with sessions() as session:
            assert [(a.rule, a.line) for w in asked
                    for a in svc.best(session, [w], target)] == expected, text
            assert answers(svc.best(session, asked, target)) == expected, text


@pytest.mark.parametrize("seed", [3, 4])
def test_the_search_shows_the_rules_first_record_of_each_group(
        sessions: sessionmaker[Session], seed: int) -> None:
    """The dashboard's best view shows, per device model and workload, the record the
    rule ranks first over every row of the group (``device_order``: cold, verified
    medians, measured, cheapest, first stored), though it reads only each part's
    cheapest; where the rule would use none, the group's cheapest working record."""
    asked = workloads(10)
    with sessions.begin() as session:
        fill_deep(session, asked, seed)
        # a few working rows whose cost the rule cannot use (0 s): the cheapest of their part
        plain = session.scalars(select(RecordRow.id).where(
            RecordRow.error_no == 0, RecordRow.verified_config.is_(None))).all()
        zero = random.Random(seed).sample(list(plain), len(plain) // 5)
        session.execute(update(RecordRow).where(RecordRow.id.in_(zero)).values(mean_cost=0.0))
    with sessions() as session:
        rows = session.execute(select(RecordRow).order_by(RecordRow.id)).scalars().all()
        total, page = svc.search(session, limit=1000)
    groups: dict[tuple[str, str, str], list[RecordRow]] = {}
    for row in rows:
        groups.setdefault((row.target_kind, row.target_model, row.workload_key), []).append(row)
    expected = {}
    for group, members in groups.items():
        working = [r for r in members if r.error_no == 0]
        if working:
            ordered = device_order([Stored(r.id, Target.parse(r.target), r.mean_cost, r.error_no,
                                           r.source == "measured", r.verified_config, r.cold)
                                    for r in members])
            expected[group] = (ordered[0].item if ordered
                               else min(working, key=lambda r: (r.mean_cost, r.id)).id)
    shown = {(Target.parse(s.target).kind, Target.parse(s.target).model, s.workload_key): s.id
             for s in page}
    assert total == len(expected) == len(shown)
    assert shown == expected
    assert any(r.verified_config is not None for r in rows) and any(r.cold for r in rows)


def test_a_cut_row_whose_target_no_longer_parses(sessions: sessionmaker[Session],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut of a group (its last row read) is a row whose target text no longer
    parses, so the rule cannot tell where the group stops: the workload is read whole,
    and the other devices' cheaper "gpu" record does not jump the "cuda" tier."""
    monkeypatch.setattr(svc, "LEADING", 2)
    w, other = workloads(2)
    template = get_template(TEMPLATE)
    rng = random.Random(1)
    good, alien = template.space(w).sample(rng), template.space(other).sample(rng)

    def row(target: str, config: Config, cost: float) -> dict[str, Any]:
        return svc.record_row(Record(
            target=Target.parse(target), workload=w, config=config,
            result=MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR,
                                 all_cost=0.1, timestamp=1.7e9 + cost)))

    with sessions.begin() as session:
        session.execute(insert(RecordRow), [
            row("cuda -model=a100", alien, 1e-4), row("cuda -model=a100", alien, 2e-4),
            row("cuda -model=a100", good, 3e-4), row("cuda -model=a100", good, 4e-4),
            row("rocm -model=mi300x", good, 1e-5)])
        third = session.scalar(select(RecordRow.id).where(RecordRow.mean_cost == 3e-4))
        broken = 'cuda -model=a100 -arch -x="a b"'
        assert svc.parsed_target(broken) is None
        session.execute(update(RecordRow).where(RecordRow.id == third).values(target=broken))
    target = Target.parse("cuda -model=l4")
    with sessions() as session:
        [cut] = svc.best(session, [w], target)
    monkeypatch.setattr(svc, "LEADING", 100)
    with sessions() as session:
        [whole] = svc.best(session, [w], target)
    assert (cut.rule, cut.line) == (whole.rule, whole.line)
    assert cut.rule == "target_key:cuda" and cut.record is not None
    assert cut.record.result.mean_cost == pytest.approx(4e-4)


def test_queries_do_not_grow_with_the_batch(sessions: sessionmaker[Session]) -> None:
    """1,000 workloads in one call: a handful of statements (whether the model has
    records, one per tier, a few rounds of lines), not one per workload."""
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
            assert len(selects) <= 9, (text, len(selects))
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_wire_answer_is_the_models_json(sessions: sessionmaker[Session]) -> None:
    """The route's JSON, written without models (``svc.best_json``), is what the
    BestResponse of the same answers serialises to, and reads back as one."""
    asked = workloads(60)
    with sessions.begin() as session:
        fill(session, asked)
    for text in ASKED:
        with sessions() as session:
            found = svc.best(session, asked, Target.parse(text))
        wire = svc.best_json(found)
        expected = BestResponse(items=[a.item() for a in found])
        assert json.loads(wire) == expected.model_dump(mode="json"), text
        assert BestResponse.model_validate_json(wire) == expected


def test_client_reads_answers_as_validation_would() -> None:
    """``TunerClient.best``'s reading of an answer: the plain echo of the workloads asked
    is built from them; anything else is left to validation (None)."""
    asked = workloads(3)
    line = {"input": ["cuda -model=h200", TEMPLATE, asked[0].args_json(), {}]}
    items = [{"workload": w.model_dump(mode="json"), "rule": rule, "record": record}
             for w, rule, record in zip(asked, ["model", "none", "target_key:gpu"],
                                        [line, None, line], strict=True)]
    body = json.dumps({"items": items}).encode()
    fast = _best_items(body, asked)
    assert fast == BestResponse.model_validate_json(body).items
    assert fast is not None and all(a.workload is w for a, w in zip(fast, asked, strict=True))
    other = [{**items[0], "workload": asked[1].model_dump(mode="json")}, *items[1:]]
    for bad in ({"items": items[:2]}, {"items": other}, {"items": items, "extra": 1},
                {"items": [{**items[0], "rule": 3}, *items[1:]]},
                {"items": [{**items[0], "record": [1]}, *items[1:]]}, [items]):
        assert _best_items(json.dumps(bad).encode(), asked) is None, bad
    assert _best_items(b"not json", asked) is None
    # a stored line nested deeper than pydantic's parser goes (200 levels) reads as before
    deep: Any = 0
    for _ in range(300):
        deep = [deep]
    nested = [{**items[0], "record": {**line, "info": deep}}, *items[1:]]
    read = _best_items(json.dumps({"items": nested}).encode(), asked)
    assert read is not None and read[0].record == nested[0]["record"]


def test_pretuned_log_kept_as_records_change(sessions: sessionmaker[Session]) -> None:
    """The pretuned log a process keeps (updated from the rows stored since) is the log
    computed anew after every change: records stored, better ones stored, records
    deleted, the last row read deleted and its id stored again (SQLite reuses it), a
    template registered anew."""
    asked = workloads(80)
    with sessions.begin() as session:
        fill(session, asked)
    targets = [Target.parse(t) for t in ("cuda -model=h200", "cuda", "rocm", "vulkan")]

    def agree() -> None:
        for target in targets:
            with sessions() as session:
                kept = svc.pretuned_log(session, target)
                where = svc._target_filter(target)
                anew = svc._compute_log(session, where)
            assert kept == (anew.lines, anew.etag), target

    agree()
    agree()  # kept, nothing read but the count
    rng = random.Random(3)
    with sessions() as session:
        stored = [Record.from_json(line) for line in session.scalars(
            select(RecordRow.line).where(RecordRow.error_no == 0).order_by(RecordRow.id))]
    better = [r.model_copy(update={"result": r.result.model_copy(update={
        "costs": (1e-8 * (i + 1),), "timestamp": 1.8e9 + i})})
        for i, r in enumerate(rng.sample(stored, 12))]
    with sessions.begin() as session:
        svc.add_records(session, better[:6])
    agree()
    with sessions.begin() as session:
        svc.add_records(session, better[6:], source="imported")
        ids = list(session.scalars(select(RecordRow.id).where(RecordRow.mean_cost < 1e-6)
                                   .order_by(RecordRow.id).limit(3)))
        session.execute(delete(RecordRow).where(RecordRow.id.in_(ids)))
    agree()
    # the last row a log read, deleted, and another stored in its place: SQLite gives
    # the new row the same id, so the count of rows up to it does not change
    first, second = [r.model_copy(update={"result": r.result.model_copy(
        update={"costs": (1e-9,)})}) for r in stored if r.target.model == "h200"][:2]
    with sessions.begin() as session:
        svc.add_records(session, [first])
    agree()
    with sessions.begin() as session:
        last = session.scalar(select(func.max(RecordRow.id)))
        session.execute(delete(RecordRow).where(RecordRow.id == last))
        svc.add_records(session, [second])  # the new cheapest of its group
    agree()
    with sessions.begin() as session:
        session.execute(delete(RecordRow).where(RecordRow.id.in_(
            select(RecordRow.id).where(RecordRow.error_no == 0).order_by(RecordRow.id)
            .limit(50))))
    agree()
    original = get_template(TEMPLATE)

    class Narrowed(type(original)):  # type: ignore[misc]
        """The template with a space no stored config decodes in."""

        def decode(self, workload: Workload, config: Config) -> dict[str, Any]:
            raise ConfigError("the space changed")

    narrowed = copy.copy(original)
    narrowed.__class__ = Narrowed
    register_template(narrowed)
    try:
        agree()
        with sessions() as session:
            assert svc.pretuned_log(session, targets[0])[0] == []
    finally:
        register_template(original)
    agree()

"""One ApplyHistoryBest rule (compiler.templates.history) for the server and the
compiler: over the TopHub logs, the server's POST /records/best (and the service with
known limits) and the compiler's choice agree on every workload; unit cases for what
never wins, the fallback by target key, ties and limits, each asked of both paths."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import (
    BACKENDS,
    LiveServer,
    live_server,
    migrated_sessions,
    tophub_lines,
    tophub_paths,
)
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

import tuner.records
from compiler.records import LogSource, MemorySource
from compiler.records.choose import THIS_DEVICE, Choice, choose_configs, choose_one
from compiler.templates import get_template
from compiler.templates.history import NOT_IN_SPACE, Stored, rank
from schemas import Config, DeviceLimits, Record, Target, Workload
from tuner_server.services import records as svc

pytestmark = pytest.mark.timeout(300)

TEXT = {"content-type": "text/plain"}
LIMITS = DeviceLimits()
# Other devices of each kind than the logs', and a kind with no log (keys only).
OTHER_TARGETS = ("cuda -model=h200", "rocm -model=gfx90a", "opencl -model=unseen", "vulkan")


def log_targets() -> list[str]:
    """Every target the TopHub logs were tuned for."""
    return sorted({rec["input"][0] for path in tophub_paths() for rec in tophub_lines(path)})


TARGETS = (*log_targets(), *OTHER_TARGETS)


def buildable() -> list[Workload]:
    """The logs' workloads the compiler can build: a template of ours that reads the args."""
    seen: dict[str, Workload] = {}
    for path in tophub_paths():
        for rec in tophub_lines(path):
            workload = Record.from_json(rec).workload
            seen.setdefault(workload.key, workload)
    return [w for w in seen.values() if _builds(w)]


def _builds(workload: Workload) -> bool:
    try:
        get_template(workload.template).space(workload)
    except Exception:  # noqa: BLE001 - unknown template or args it refuses
        return False
    return True


def compiler_rule(choice: Choice) -> str:
    """The server's name for the tier a compiler choice came from."""
    if choice.record is None:
        return "none"
    return "model" if choice.source == THIS_DEVICE else f"target_key:{choice.key}"


Answer = tuple[str, str | None]  # (rule, winning line)


def compiler_answers(source: LogSource, workloads: Sequence[Workload], target: Target,
                     limits: DeviceLimits | None) -> list[Answer]:
    out = []
    for workload in workloads:
        choice = choose_one(workload, source.candidates([workload], target), target, limits)
        out.append((compiler_rule(choice),
                    None if choice.record is None else choice.record.to_line()))
    return out


def service_answers(sessions: sessionmaker[Session], workloads: Sequence[Workload],
                    target: Target, limits: DeviceLimits | None) -> list[Answer]:
    with sessions() as session:
        return [(a.rule, None if a.record is None else a.record.to_line())
                for a in svc.best(session, workloads, target, limits)]


# --------------------------------------------------------------------------------------
# Every TopHub workload, both paths


class Loaded:
    def __init__(self, server: LiveServer, sessions: sessionmaker[Session]) -> None:
        self.server = server
        self.sessions = sessions


@pytest.fixture(scope="module", params=BACKENDS)
def loaded(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """A live server holding the four TopHub logs, imported over HTTP in file order."""
    backend = str(request.param)
    with live_server(backend, tmp_path_factory.mktemp(f"history_{backend}")) as server:
        with server.client("client") as client:
            for path in tophub_paths():
                resp = client.post("/api/v1/records/import", content=path.read_text(),
                                   headers=TEXT)
                assert resp.status_code == 200 and resp.json()["refused"] == 0, resp.text
        engine = create_engine(server.database_url, poolclass=NullPool)
        try:
            yield Loaded(server, sessionmaker(engine))
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def tophub() -> LogSource:
    return LogSource(tophub_paths())


@pytest.fixture(scope="module")
def workloads() -> list[Workload]:
    found = buildable()
    assert len(found) > 400, len(found)
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_records_best_and_the_compiler_agree(loaded: Loaded, tophub: LogSource,
                                             workloads: list[Workload], target: str) -> None:
    """POST /records/best (limits unknown) and the compiler's choice without limits pick
    the same record by the same tier for every TopHub workload; so do the service and the
    compiler given the device's limits."""
    tgt = Target.parse(target)
    with loaded.server.client("client") as client:
        resp = client.post("/api/v1/records/best", json={
            "target": target, "workloads": [w.model_dump(mode="json") for w in workloads]})
    assert resp.status_code == 200, resp.text
    served = [(item["rule"], None if item["record"] is None
               else Record.from_json(item["record"]).to_line())
              for item in resp.json()["items"]]
    compiled = compiler_answers(tophub, workloads, tgt, None)
    differ = [(w.key, s, c) for w, s, c in zip(workloads, served, compiled) if s != c]
    assert not differ, f"{len(differ)} of {len(workloads)} differ, first: {differ[0]}"

    limited = service_answers(loaded.sessions, workloads, tgt, LIMITS)
    compiled = compiler_answers(tophub, workloads, tgt, LIMITS)
    differ = [(w.key, s, c) for w, s, c in zip(workloads, limited, compiled) if s != c]
    assert not differ, f"{len(differ)} of {len(workloads)} differ, first: {differ[0]}"

    # The data exercises the tier each target is meant to hit.
    rules = Counter(rule.split(":")[0] for rule, _ in served)
    if target in OTHER_TARGETS:
        assert rules["model"] == 0 and rules["target_key"] > 0, rules
    elif tgt.model != "unknown":
        assert rules["model"] > 0 and rules["target_key"] > 0, rules


def test_tophub_records_out_of_the_space_never_win(loaded: Loaded, tophub: LogSource,
                                                   workloads: list[Workload]) -> None:
    """TopHub holds records whose knob values our space lacks: kept by the import, passed
    over by both paths, which then agree on the next one."""
    target = Target.parse("opencl -model=1080ti")
    choices = [choose_one(w, tophub.candidates([w], target), target, None) for w in workloads]
    passed_over = [c for c in choices if c.rejected_counts.get(NOT_IN_SPACE)]
    assert len(passed_over) >= 5, "expected TopHub records outside the space on opencl"
    served = service_answers(loaded.sessions, [c.workload for c in passed_over], target, None)
    for choice, answer in zip(passed_over, served):
        assert answer == (compiler_rule(choice), None if choice.record is None
                          else choice.record.to_line())


# --------------------------------------------------------------------------------------
# Unit cases, each asked of the service (SQLite and PostgreSQL) and of the compiler

BASE = next(r for r in tophub_lines(tophub_paths()[0]) if r["input"][1] == "conv2d_nchw.cuda")
ARGS = copy.deepcopy(BASE["input"][2])
ARGS[0][1][0] = 7  # batch 7: a workload no TopHub record has
WORKLOAD = Workload(template=BASE["input"][1], args=ARGS)


def line(target: str, index: int, cost: float, error_no: int = 0,
         config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The base record for WORKLOAD on ``target``, told apart by its config index."""
    rec = copy.deepcopy(BASE)
    rec["input"][0], rec["input"][2] = target, ARGS
    if config is not None:
        rec["config"] = copy.deepcopy(config)
    rec["config"]["index"] = index
    rec["result"][0], rec["result"][1] = [cost, cost], error_no
    return rec


@pytest.fixture(params=BACKENDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sessions(str(request.param), tmp_path) as made:
        yield made


def store(sessions: sessionmaker[Session], lines: Sequence[dict[str, Any]],
          validated: bool = True) -> None:
    """Import the lines (validated), or write them as rows a worker of an older version
    stored, without the import's checks."""
    with sessions.begin() as session:
        if validated:
            report = svc.import_lines(session, [json.dumps(x) for x in lines])
            assert report.refused == 0, report.errors
        else:
            svc.add_records(session, [Record.from_json(x) for x in lines])


def both(sessions: sessionmaker[Session], lines: Sequence[dict[str, Any]], target: str,
         limits: DeviceLimits | None = None) -> tuple[Answer, Answer]:
    """(service, compiler) answers for WORKLOAD: (rule, winning config index or None)."""
    tgt = Target.parse(target)
    with sessions() as session:
        (served,) = svc.best(session, [WORKLOAD], tgt, limits)
    memory = MemorySource([Record.from_json(x) for x in lines])
    chosen = choose_one(WORKLOAD, memory.candidates([WORKLOAD], tgt), tgt, limits)
    server_index = None if served.record is None else str(served.record.config.index)
    compiler_index = None if chosen.record is None else str(chosen.record.config.index)
    return (served.rule, server_index), (compiler_rule(chosen), compiler_index)


def with_knob(value: Any, name: str = "auto_unroll_max_step") -> dict[str, Any]:
    config = copy.deepcopy(BASE["config"])
    for item in config["entity"]:
        if item[0] == name:
            item[2] = value
    return config


def test_unknown_knob_or_value_never_wins(sessions: sessionmaker[Session]) -> None:
    """An imported record whose knob value is not in the space, and a stored one with a
    knob the template lacks, lose to a dearer record that decodes, on both paths."""
    odd_value = line("cuda -model=h200", 1, 1e-9, config=with_knob(7))
    extra = copy.deepcopy(BASE["config"])
    extra["entity"].append(["bogus", "ot", 1])
    unknown_knob = line("cuda -model=h200", 2, 1e-9, config=extra)
    good = line("cuda -model=h200", 3, 1e-3)
    store(sessions, [odd_value, good])
    store(sessions, [unknown_knob], validated=False)
    server, compiler = both(sessions, [odd_value, good, unknown_knob], "cuda -model=h200")
    assert server == compiler == ("model", "3")


def test_failed_or_negative_costs_never_win(sessions: sessionmaker[Session]) -> None:
    """A cost of -1.0 (stored past the import's checks) and error_no != 0 never win,
    neither on this device nor through a target key."""
    lines = [line("cuda -model=h200", 1, -1.0), line("cuda -model=a100", 2, -1.0),
             line("cuda -model=h200", 3, 1e-9, error_no=4), line("cuda -model=h200", 4, 1e-2),
             line("cuda -model=a100", 5, 1e-3)]
    store(sessions, lines, validated=False)
    for target, want in (("cuda -model=h200", ("model", "4")),
                         ("cuda -model=v100", ("target_key:cuda", "5"))):
        server, compiler = both(sessions, lines, target)
        assert server == compiler == want, target


def test_same_model_of_another_kind_is_another_device(sessions: sessionmaker[Session]) -> None:
    """"Same device" is the kind and the model: an opencl h200 record is not this device
    for cuda h200; cuda records of other models come first (key cuda), then it (key gpu)."""
    other_kind = line("opencl -model=h200", 1, 1e-9)
    other_model = line("cuda -model=a100", 2, 1e-3)
    store(sessions, [other_kind, other_model])
    server, compiler = both(sessions, [other_kind, other_model], "cuda -model=h200")
    assert server == compiler == ("target_key:cuda", "2")
    server, compiler = both(sessions, [other_kind, other_model], "rocm -model=gfx90a")
    assert server == compiler == ("target_key:gpu", "1")


def test_ties_go_to_the_first_stored(sessions: sessionmaker[Session]) -> None:
    lines = [line("cuda -model=b", 1, 2e-3), line("cuda -model=a", 2, 1e-3),
             line("cuda -model=b", 3, 1e-3), line("cuda -model=a", 4, 1e-3)]
    store(sessions, lines)
    for target, want in (("cuda -model=a", ("model", "2")), ("cuda -model=b", ("model", "3")),
                         ("cuda -model=zz", ("target_key:cuda", "2"))):
        server, compiler = both(sessions, lines, target)
        assert server == compiler == want, target


def _over_and_within(limits: DeviceLimits) -> tuple[Config, Config]:
    """Two configs of WORKLOAD's space: one over ``limits``, one within them."""
    template = get_template(WORKLOAD.template)
    space = template.space(WORKLOAD)
    rng = random.Random(7)
    over = within = None
    for _ in range(20000):
        config = space.get(rng.randrange(len(space)))
        fits = not template.check_limits(WORKLOAD, config, limits)
        if fits and within is None:
            within = config
        if not fits and over is None and not template.check_limits(WORKLOAD, config, LIMITS):
            over = config
        if over is not None and within is not None:
            return over, within
    raise AssertionError("no pair of configs around the limits")


def test_limits_exclude_a_record_when_known(sessions: sessionmaker[Session]) -> None:
    """A cheaper record over the device's limits wins only while they are unknown."""
    small = DeviceLimits(max_threads_per_block=64, max_thread_x=64, max_thread_y=64,
                         max_thread_z=64)
    over, within = _over_and_within(small)
    lines = [line("cuda -model=h200", 1, 1e-4, config=over.to_json()),
             line("cuda -model=h200", 2, 1e-3, config=within.to_json())]
    store(sessions, lines)
    server, compiler = both(sessions, lines, "cuda -model=h200")
    assert server == compiler == ("model", "1")
    server, compiler = both(sessions, lines, "cuda -model=h200", small)
    assert server == compiler == ("model", "2")


def test_rank_measured_first_on_this_device_only() -> None:
    """The fleet's measurement outranks a cheaper import on this device; through a
    target key cost alone decides."""
    here, there = Target.parse("cuda -model=h200"), Target.parse("cuda -model=a100")
    entries = [Stored("import", here, 1e-9, 0), Stored("measured", here, 1e-3, 0, True),
               Stored("import elsewhere", there, 1e-9, 0),
               Stored("measured elsewhere", there, 1e-3, 0, True)]
    assert [r.item for r in rank(entries, here)] == [
        "measured", "import", "import elsewhere", "measured elsewhere"]


def test_measured_outranks_a_cheaper_import_on_both_paths(
        sessions: sessionmaker[Session]) -> None:
    """One database, one device: a cheaper imported line and the fleet's dearer
    measurement. records/best and a build reading the database directly
    (``tuner.records.database``) both pick the measurement; a log file holding the same
    lines has no measurements, so there the cheaper one wins."""
    imported = line("cuda -model=h200", 1, 1e-4)
    measured = line("cuda -model=h200", 2, 1e-3)
    store(sessions, [imported])
    with sessions.begin() as session:
        svc.add_records(session, [Record.from_json(measured)], source="measured")
    target = Target.parse("cuda -model=h200")
    with sessions() as session:
        (served,) = svc.best(session, [WORKLOAD], target)
        url = session.get_bind().engine.url.render_as_string(hide_password=False)
    (built,) = choose_configs([WORKLOAD], tuner.records.database(url), target, LIMITS)
    assert served.rule == "model" and served.record is not None
    assert built.source == THIS_DEVICE and built.record is not None
    assert served.record.config.index == built.record.config.index == 2
    (from_log,) = choose_configs([WORKLOAD], MemorySource(
        [Record.from_json(x) for x in (imported, measured)]), target, LIMITS)
    assert from_log.record is not None and from_log.record.config.index == 1

"""Schemas: target strings, configs with -1 splits, and AutoTVM v0.2 log lines (TopHub)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from compiler.records.pretuned import TOPHUB_DIR
from compiler.templates import ConfigError, get_template
from schemas import (
    Config,
    KnobEntity,
    MeasureErrorNo,
    MeasureOptions,
    Record,
    RecordFormatError,
    Target,
    Workload,
)
from schemas.measure import (
    FAILED_COST,
    MAX_ERROR_MSG_CHARS,
    MeasureResult,
    check_info,
    check_measurement,
)
from schemas.record import read_lines
from schemas.text import check_text, first_problem, one_line

TOPHUB = TOPHUB_DIR
TOPHUB_COUNTS = {
    "cuda_v0.10.log": 825,
    "rocm_v0.05.log": 217,
    "opencl_v0.04.log": 97,
    "llvm_v0.04.log": 35,
}

# A real TopHub line (cuda_v0.10.log, first line), used as the base for malformed variants.
GOOD_LINE: dict[str, Any] = {
    "input": [
        "cuda -model=titanx",
        "conv2d_nchw.cuda",
        [["TENSOR", [1, 2048, 8, 8], "float32"], ["TENSOR", [192, 2048, 1, 1], "float32"],
         [1, 1], [0, 0, 0, 0], [1, 1], "float32"],
        {},
    ],
    "config": {
        "index": 8797896,
        "code_hash": None,
        "entity": [
            ["tile_f", "sp", [6, 1, 32, 1]], ["tile_y", "sp", [4, 1, 2, 1]],
            ["tile_x", "sp", [1, 1, 8, 1]], ["tile_rc", "sp", [64, 32]],
            ["tile_rx", "sp", [1, 1]], ["tile_ry", "sp", [1, 1]],
            ["auto_unroll_max_step", "ot", 1500], ["unroll_explicit", "ot", 1],
        ],
    },
    "result": [[5.69732536806342e-05], 0, 14.116215467453003, 1535423916.7184713],
    "version": 0.2,
    "tvm_version": "0.7.dev0",
}


def _line(mutate: Any = None) -> str:
    """GOOD_LINE with ``mutate(row)`` applied, as one JSON line."""
    row = copy.deepcopy(GOOD_LINE)
    if mutate is not None:
        mutate(row)
    return json.dumps(row)


# --- targets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "model", "arch", "keys"),
    [
        ("cuda -model=h200 -arch=sm_90", "cuda", "h200", "sm_90", ("cuda", "gpu")),
        ("rocm -model=gfx90a", "rocm", "gfx90a", None, ("rocm", "gpu")),
        ("opencl -model=pocl-cpu", "opencl", "pocl-cpu", None, ("opencl", "gpu")),
    ],
)
def test_target_round_trip(text: str, kind: str, model: str, arch: str | None,
                           keys: tuple[str, ...]) -> None:
    """A target prints back exactly as written, and keeps kind, model, arch and keys."""
    target = Target.parse(text)
    assert str(target) == text
    assert target.kind == kind
    assert target.model == model
    assert target.arch == arch
    assert target.keys == keys
    assert Target.parse(str(target)) == target
    # Serialised (e.g. inside a Record) as the same string.
    assert target.model_dump() == text
    assert Target.model_validate_json(json.dumps(text)) == target


def test_target_option_order_is_kept() -> None:
    """Options print in the order they were written, not sorted."""
    assert str(Target.parse("cuda -arch=sm_90 -model=h200")) == "cuda -arch=sm_90 -model=h200"


def test_target_explicit_keys() -> None:
    assert Target.parse("opencl -model=x -keys=mali,gpu").keys == ("mali", "gpu")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", "empty"),
        ("cuda model=h200", "model=h200"),
        ("cuda -=x", "no name"),
        ('cuda -model="h200', "quotation"),
        ("CUDA -model=h200", "kind"),
        ("-model=h200", "kind"),
    ],
)
def test_bad_target_raises_value_error_naming_problem(text: str, names: str) -> None:
    with pytest.raises(ValueError) as info:
        Target.parse(text)
    assert names in str(info.value)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('opencl "-model=a b"', "space"),  # would print as `opencl -model=a b`
        ("opencl '-model=a\"b'", "quote"),
        ('opencl "-model=a\\\\b"', "backslash"),
        ("opencl -model=a\x00b", "control character"),
        ("opencl -model=a\x1bb", "control character"),
        ("opencl -model=\ud800", "lone surrogate"),  # a JSON "\ud800": not Unicode
        ("opencl\udfff", "lone surrogate"),
        ("cuda -model=" + "m" * 300, "255"),
        ("cuda -model=" + "m" * 200, "model longer than 128"),
        ("cuda " + " ".join(f"-o{i}" for i in range(40)), "more than 32 options"),
        ('opencl "-mo=del=x"', None),  # reads back: name mo, value del=x
    ],
)
def test_target_must_read_back_as_itself(text: str, names: str | None) -> None:
    """Every accepted target satisfies Target.parse(str(t)) == t; the rest are refused
    with a one-line message starting "target", whatever their length."""
    try:
        target = Target.parse(text)
    except ValueError as err:
        assert names is not None, err
        message = str(err).split("Value error, ", 1)[1].splitlines()[0]
        assert message.startswith("target") and names in message, message
        assert len(message) < 300, message
    else:
        assert names is None, str(target)
        assert Target.parse(str(target)) == target


def test_target_built_from_fields_must_read_back() -> None:
    with pytest.raises(ValidationError, match="not a name"):
        Target(kind="cuda", options=(("mo=del", "x"),))
    with pytest.raises(ValidationError, match="space"):
        Target(kind="cuda", options=(("model", "a b"),))


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ([float("inf")], "finite"),
        ([float("nan")], "finite"),
        ([2**70], "int64"),
        (["x\x00"], "control character"),
        (["x" * 200], "longer than 128"),
        ([[[[[[[[[[1]]]]]]]]]], "nested deeper"),
        ([0] * 2000, "more than 1024"),
        ("[" * 5000 + "]" * 5000, "not JSON"),
        ("[" + "9" * 5000 + "]", "not JSON"),
    ],
)
def test_workload_args_are_bounded(args: Any, names: str) -> None:
    with pytest.raises(ValidationError) as info:
        Workload(template="conv2d_nchw.cuda", args=args)
    assert names in str(info.value)


def test_workload_template_is_bounded() -> None:
    with pytest.raises(ValidationError, match="control character"):
        Workload(template="conv\x00", args=[])
    with pytest.raises(ValidationError, match="128"):
        Workload(template="t" * 129, args=[])


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout_s", 1e300), ("timeout_s", float("inf")), ("timeout_s", float("nan")),
     ("min_repeat_ms", float("inf")), ("number", 10**12), ("repeat", 10**6),
     ("rtol", float("nan")), ("atol", float("inf"))],
)
def test_measure_options_are_bounded(field: str, value: Any) -> None:
    """A job's options reach every worker: one no worker could honour is refused."""
    with pytest.raises(ValidationError) as info:
        MeasureOptions(**{field: value})
    assert field in str(info.value)


# --- configs -----------------------------------------------------------------------


def test_config_with_minus_one_split_round_trips_and_decodes() -> None:
    """-1 (the outer factor implied by the rest) survives JSON and decodes to the true factor."""
    raw = {"index": 3, "code_hash": None, "entity": [["tile_k", "sp", [-1, 16]]]}
    config = Config.model_validate(raw)
    assert config.knob("tile_k") == (-1, 16)
    assert config.to_json() == raw
    assert Config.model_validate(config.to_json()) == config

    template = get_template("dense_small_batch.gpu")
    workload = Workload(template=template.name, args=[
        ["TENSOR", [1, 256], "float32"], ["TENSOR", [10, 256], "float32"], None, "float32"])
    assert template.decode(workload, config) == {"tile_k": (16, 16)}
    # The space itself writes -1 for the outer factor, and its index is the true one.
    normal = template.space(workload).normalize(config)
    assert normal.knob("tile_k") == (-1, 16)
    assert template.space(workload).values_at(normal.index) == {"tile_k": (16, 16)}


def test_config_split_not_dividing_is_a_config_error() -> None:
    template = get_template("dense_small_batch.gpu")
    workload = Workload(template=template.name, args=[
        ["TENSOR", [1, 256], "float32"], ["TENSOR", [10, 256], "float32"], None, "float32"])
    bad = Config.model_validate({"index": 0, "entity": [["tile_k", "sp", [-1, 3]]]})
    with pytest.raises(ConfigError, match="tile_k"):
        template.decode(workload, bad)
    wrong_outer = Config.model_validate({"index": 0, "entity": [["tile_k", "sp", [2, 16]]]})
    with pytest.raises(ConfigError, match="tile_k"):
        template.decode(workload, wrong_outer)


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"index": -1, "entity": []}, "index"),
        ({"index": 2**70, "entity": []}, "index"),
        ({"index": 0, "entity": [["k", "ot", 1]] * 65}, "more than 64"),
        ({"index": 0, "entity": [["k\x00", "ot", 1]]}, "control character"),
        ({"index": 0, "entity": [["k", "ot", float("inf")]]}, "finite"),
        ({"index": 0, "entity": [["k", "sp", [1] * 65]]}, "more than 64"),
        ({"index": 0, "entity": [["k", "sp", [1, [2]]]]}, "not a knob value"),
        ({"index": 0, "entity": [["tile_k", "xx", [-1, 2]]]}, "kind"),
        ({"index": 0, "entity": [["tile_k", "sp"]]}, "entity[0]"),
        ({"index": 0, "entity": "tile_k"}, "entity"),
    ],
)
def test_bad_config_names_field(raw: dict[str, Any], names: str) -> None:
    with pytest.raises(ValidationError) as info:
        Config.model_validate(raw)
    assert names in str(info.value)


def test_knob_entity_json() -> None:
    knob = KnobEntity(name="unroll_explicit", kind="ot", value=1)
    assert knob.to_json() == ["unroll_explicit", "ot", 1]


# --- records -----------------------------------------------------------------------


def test_good_line_parses_and_round_trips() -> None:
    record = Record.from_line(_line())
    assert str(record.target) == "cuda -model=titanx"
    assert record.workload.template == "conv2d_nchw.cuda"
    assert record.result.error_no == MeasureErrorNo.NO_ERROR
    assert record.result.costs == (5.69732536806342e-05,)
    assert record.config.index == 8797896
    assert json.loads(record.to_line()) == GOOD_LINE
    assert Record.from_line(record.to_line()) == record


def test_error_msg_survives_round_trip() -> None:
    def failed(row: dict[str, Any]) -> None:
        row["result"][1] = 5
        row["info"] = {"error_msg": "3 of 10 outputs differ", "device": "x"}

    record = Record.from_line(_line(failed))
    assert record.result.error_no == MeasureErrorNo.WRONG_ANSWER
    assert record.result.error_msg == "3 of 10 outputs differ"
    assert Record.from_line(record.to_line()) == record


@pytest.mark.parametrize("name", sorted(TOPHUB_COUNTS))
def test_tophub_log_parses_and_round_trips(name: str) -> None:
    """Every record line of a TopHub log reads, and write -> read gives an equal Record."""
    path = TOPHUB / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    lines = path.read_text().splitlines()
    parsed = list(read_lines(lines))
    errors = [(n, str(r)) for n, r in parsed if isinstance(r, RecordFormatError)]
    assert errors == []
    assert len(parsed) == TOPHUB_COUNTS[name]
    for number, record in parsed:
        assert isinstance(record, Record)
        text = record.to_line()
        again = Record.from_line(text)
        assert again == record, f"{name}:{number} changed on write -> read"
        # The written line carries the same AutoTVM fields as the original one.
        original, written = json.loads(lines[number - 1]), json.loads(text)
        assert written["input"] == original["input"], f"{name}:{number}"
        assert written["config"]["entity"] == original["config"]["entity"], f"{name}:{number}"
        assert written["config"]["index"] == original["config"]["index"]
        assert written["result"] == original["result"], f"{name}:{number}"


def test_read_lines_skips_comments_and_reports_bad_lines_by_number() -> None:
    lines = ["# comment", "", _line(), "not json", _line(lambda r: r.pop("config"))]
    out = list(read_lines(lines))
    assert [n for n, _ in out] == [3, 4, 5]
    assert isinstance(out[0][1], Record)
    assert isinstance(out[1][1], RecordFormatError)
    assert "config" in str(out[2][1])


def test_v01_line_refused_with_reason() -> None:
    v01 = json.dumps({"i": ["llvm", "topi_nn_conv2d", [], {}, [], {"i": 0, "e": []}],
                      "r": [[1e-3], 0, 1.0, 1.5e9], "v": 0.1})
    with pytest.raises(RecordFormatError) as info:
        Record.from_line(v01)
    message = str(info.value)
    assert "0.1" in message and "not supported" in message


@pytest.mark.parametrize(
    ("mutate", "names"),
    [
        (lambda r: r.pop("config"), "config"),
        (lambda r: r.pop("input"), "input"),
        (lambda r: r.pop("result"), "result"),
        (lambda r: r.__setitem__("version", 0.3), "version"),
        (lambda r: r["result"].__setitem__(1, 42), "error_no"),
        (lambda r: r["result"].__setitem__(1, "oops"), "error_no"),
        (lambda r: r.__setitem__("result", [[1.0], 0, 1.0]), "result"),
        (lambda r: r.__setitem__("input", ["cuda"]), "input"),
        (lambda r: r["input"].__setitem__(0, "cuda model=x"), "target"),
        (lambda r: r["input"].__setitem__(2, {"not": "a list"}), "args"),
        (lambda r: r["config"].__setitem__("index", -5), "index"),
        (lambda r: r["config"]["entity"].__setitem__(0, ["tile_f", "zz", [1]]), "kind"),
        (lambda r: r["result"].__setitem__(0, "fast"), "costs"),
        (lambda r: r["input"].__setitem__(0, "cuda -model=\ud800"), "surrogate"),
        (lambda r: r["input"].__setitem__(3, {"k": "\udc00"}), "kwargs"),
        (lambda r: r.__setitem__("tvm_version", "0.7\ud800"), "tvm_version"),
        (lambda r: r.__setitem__("info", {"worker": ["\ud800"]}), "info"),
        (lambda r: r.__setitem__("info", {"error_msg": "\ud800"}), "error_msg"),
        (lambda r: r.__setitem__("info", ["not", "a dict"]), "info"),
    ],
)
def test_malformed_line_names_field(mutate: Any, names: str) -> None:
    with pytest.raises(RecordFormatError) as info:
        Record.from_line(_line(mutate))
    assert names in str(info.value)


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", "null", "{", "9" * 5000,
                                  "[" * 5000 + "]" * 5000])
def test_non_object_lines_refused(text: str) -> None:
    with pytest.raises(RecordFormatError):
        Record.from_line(text)


# --- what a measurement may report -----------------------------------------------------


def _result(**change: Any) -> MeasureResult:
    fields: dict[str, Any] = {"costs": (1e-3,), "error_no": 0, "all_cost": 0.5,
                              "timestamp": 1.7e9}
    fields.update(change)
    return MeasureResult(**fields)


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"costs": (0.0,)}, "costs"),
        ({"costs": (1e-3, -1.0)}, "costs"),
        ({"costs": (float("inf"),)}, "costs"),
        ({"costs": (1e308, 1e308)}, "costs"),  # each finite, their mean not
        ({"costs": (FAILED_COST * 2,)}, "costs"),
        ({"costs": (float("nan"),), "error_no": 4}, "costs"),
        ({"costs": ()}, "at least one cost"),
        ({"costs": (1e-3,) * 1001}, "more than 1000"),
        ({"all_cost": -1.0}, "all_cost"),
        ({"all_cost": float("nan")}, "all_cost"),
        ({"timestamp": 0.0}, "timestamp"),
        ({"timestamp": 2.0**40}, "timestamp"),
        ({"timestamp": float("inf")}, "timestamp"),
        ({"error_no": 4, "costs": (FAILED_COST,), "error_msg": "a\x00b"}, "control"),
        ({"error_no": 4, "costs": (FAILED_COST,), "error_msg": "e" * 2001}, "2000"),
    ],
)
def test_check_measurement_refuses_what_cannot_be_ranked(change: dict[str, Any],
                                                         names: str) -> None:
    """One rule for a worker's result and an imported line, its message one line."""
    with pytest.raises(ValueError, match=names) as info:
        check_measurement(_result(**change))
    assert "\n" not in str(info.value)


def test_check_measurement_takes_real_results() -> None:
    check_measurement(_result())
    check_measurement(_result(costs=(2e-3, 1e-3, 3e-3), all_cost=0.0))
    check_measurement(_result(error_no=7, costs=(), error_msg="timed out\n\tin run"))
    # a failure made from any text passes: cut, its unprintable characters replaced
    failed = MeasureResult.failure(MeasureErrorNo.COMPILE_DEVICE,
                                   "log\x1b[31m\ud800\n" + "x" * 10_000)
    check_measurement(failed)
    assert len(failed.error_msg or "") == MAX_ERROR_MSG_CHARS
    assert (failed.error_msg or "").startswith("log\ufffd[31m\ufffd\n")


def test_lone_surrogate_in_error_msg_is_refused_by_the_model() -> None:
    """Not even a stored record may hold one: no reader could send it on as UTF-8."""
    with pytest.raises(ValidationError, match="surrogate"):
        _result(error_no=4, costs=(FAILED_COST,), error_msg="\ud800")


@pytest.mark.parametrize(
    ("info", "names"),
    [
        ({"worker": "\ud800"}, "surrogate"),
        ({"\udfff": 1}, "surrogate"),
        ({"log": ["ok", "a\x00b"]}, "control"),
        ({"x": float("nan")}, "finite"),
        ({"log": "x" * 20_000}, "16384"),
    ],
)
def test_check_info_refuses(info: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        check_info(info)


def test_check_info_keeps_free_text() -> None:
    info = {"worker": "gpu0", "device": "NVIDIA H200", "log": "line 1\n\tline 2", "n": 3}
    assert check_info(info) == info


# --- text rules ------------------------------------------------------------------------


def test_one_line_flattens_cuts_and_escapes_surrogates() -> None:
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("x" * 1000, 20) == "x" * 17 + "..."
    flat = one_line("bad \ud800 input")
    assert flat == "bad \\ud800 input"
    flat.encode("utf-8")  # always encodable


def test_check_text_names_the_character() -> None:
    assert check_text("plain", "name") == "plain"
    with pytest.raises(ValueError, match=r"name contains the lone surrogate '\\ud800'"):
        check_text("a\ud800", "name")
    with pytest.raises(ValueError, match="name contains the control character"):
        check_text("a\nb", "name")


def test_first_problem_is_loc_and_message() -> None:
    with pytest.raises(ValidationError) as info:
        MeasureOptions(timeout_s=-1)
    assert first_problem(info.value) == "timeout_s: Input should be greater than 0"
    with pytest.raises(ValidationError) as info:
        Target.parse("cuda -model=\ud800")
    assert first_problem(info.value) == ("target 'cuda -model=\\ud800' contains the lone "
                                         "surrogate '\\ud800'")


# --------------------------------------------------------------------------- the wire contract

def test_states_are_the_strings_stored_and_sent() -> None:
    from schemas.api import ACTIVE, FINAL, JobStatus, TaskStatus, TrialStatus

    assert [s.value for s in JobStatus] == ["queued", "running", "verifying", "done",
                                            "cancelled", "failed"]
    assert TaskStatus is JobStatus  # a task lives a job's states: one final set
    assert [s.value for s in TrialStatus] == ["queued", "leased", "done", "cancelled"]
    assert FINAL == {"done", "cancelled", "failed"}
    assert ACTIVE == {"queued", "running", "verifying"}
    assert {s for s in JobStatus if s.final} == FINAL and not FINAL & ACTIVE
    assert "done" in FINAL and JobStatus("failed").final and not JobStatus.RUNNING.final
    assert json.dumps({"status": JobStatus.DONE}) == '{"status": "done"}'
    assert f"{TrialStatus.LEASED}" == "leased"


def test_wire_models_keep_the_apis_field_names() -> None:
    from schemas.api import ImportResponse, LeaseAnswer, TrialIds, TrialResult

    answer = LeaseAnswer.model_validate({"trials": [{
        "trial_id": 3, "task_id": 1, "template": "dense_small_batch.gpu", "args": [],
        "config": {"index": 0, "code_hash": None, "entity": []}, "target": "cuda",
        "measure": {"number": 1}, "lease_deadline": 12.5}], "lease_seconds": 120})
    assert answer.trials[0].measure == {"number": 1}  # raw: the worker reports a bad one
    assert set(answer.model_dump()) == {"trials", "lease_seconds"}
    assert ImportResponse.model_validate(
        {"accepted": 1, "refused": 1, "errors": [{"line": 2, "error": "bad"}]}).duplicates == 0
    with pytest.raises(ValidationError, match="trial_ids"):
        TrialIds(trial_ids=[2**31])  # an INTEGER column's range, refused as a 422
    with pytest.raises(ValidationError, match="costs"):
        TrialResult.model_validate({"trial_id": 1, "result": {
            "costs": [], "error_no": 0, "all_cost": 0.1, "timestamp": 1.0}})


def test_the_default_tuner_is_one_the_server_has() -> None:
    from schemas.api import DEFAULT_TUNER
    from tuner_server.search import TUNERS

    assert DEFAULT_TUNER in TUNERS


def test_equal_workloads_and_configs_hash_alike_however_they_were_written() -> None:
    """The rule's verdict cache and every per-workload dict key on these: equal values
    built from lists or tuples, from JSON text or objects, are one key."""
    args = [["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
            [1, 1], [1, 1, 1, 1], [1, 1], "float32"]
    a = Workload(template="conv2d_nchw.cuda", args=args)
    b = Workload(template="conv2d_nchw.cuda", args=json.dumps(args))
    c = Workload(template="conv2d_nchw.cuda", args=[*args[:-1], "float16"])
    assert a == b and hash(a) == hash(b) and len({a, b, c}) == 2

    entity = [["tile_f", "sp", [-1, 2, 8, 1]], ["unroll_explicit", "ot", 1]]
    x = Config(index=7, entity=entity)
    y = Config.model_validate(json.loads(json.dumps({"index": 7, "entity": entity})))
    z = Config(index=7, entity=[entity[0], ["unroll_explicit", "ot", 0]])
    assert x == y and hash(x) == hash(y) and {x: 1}[y] == 1 and len({x, y, z}) == 2


def test_a_copy_with_changed_fields_works_out_its_own_key_model_and_hash() -> None:
    """What a frozen model remembers (a workload's key, a target's model and keys, a
    config's hash) follows a copy's new fields, not the original's."""
    target = Target.parse("cuda -model=a100")
    assert (target.model, target.keys) == ("a100", ("cuda", "gpu"))
    moved = target.model_copy(update={"options": (("model", "h100"), ("keys", "x,y"))})
    assert (moved.model, moved.keys) == ("h100", ("x", "y"))

    wl = Workload(template="dense_small_batch.gpu", args=[["TENSOR", [1, 8], "float32"]])
    assert wl.key.endswith('[1,8],"float32"]]]')
    wider = wl.model_copy(update={"args": (("TENSOR", (1, 16), "float32"),)})
    assert wider.key.endswith('[1,16],"float32"]]]') and wider != wl

    config = Config(index=0, entity=[["tile_x", "sp", [-1, 4]]])
    hash(config)
    other = config.model_copy(update={"index": 1})
    fresh = Config(index=1, entity=[["tile_x", "sp", [-1, 4]]])
    assert other == fresh and hash(other) == hash(fresh) and fresh in {other}
    assert Workload(template="t", args=[1]) != Workload(template="t", args=[1.0])

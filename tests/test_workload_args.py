"""Workload arguments: the one-pass check of plain JSON values (``_plain``) accepts and
freezes exactly what the checked walk (``_check_arg``, which names the bad value's
path) accepts, so a well-formed workload is validated fast and a bad one refused with
the same message as before; and the key, remembered, is the JSON of the thawed args."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import Workload
from schemas.workload import (
    MAX_ARG_DEPTH,
    MAX_ARG_INT,
    MAX_ARG_NODES,
    MAX_ARG_STRING,
    MAX_KEY_CHARS,
    _check_arg,
    _freeze,
    _plain,
)

CONV = [["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
        [1, 1], [1, 1, 1, 1], [1, 1], "float32"]


def nested(depth: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


CASES: list[list[Any]] = [
    CONV, [], [None, True, False, 0, -1, 1.5, -0.0, "x"], [MAX_ARG_INT, -MAX_ARG_INT],
    [MAX_ARG_INT + 1], [-MAX_ARG_INT - 1], [float("inf")], [float("nan")], [1e308],
    ["a" * MAX_ARG_STRING], ["a" * (MAX_ARG_STRING + 1)], ["tab\there"], ["\x7f"],
    ["\ud800"], ["caf\u00e9"], nested(MAX_ARG_DEPTH), nested(MAX_ARG_DEPTH + 1),
    list(range(MAX_ARG_NODES - 1)), list(range(MAX_ARG_NODES)),
    [[1] * (MAX_ARG_NODES - 2)], [[1] * (MAX_ARG_NODES - 1)], [{"a": 1}], [b"x"],
    [(1, 2)], [[1, [2, ["s", None]]], 3.0], [1, float("-inf"), "\x00"],
]


def checked(args: list[Any]) -> tuple[Any, ...] | str:
    """What the walk with paths makes of ``args``: frozen, or its message."""
    try:
        _check_arg(args, "args", 0, [0])
    except ValueError as err:
        return str(err)
    return tuple(_freeze(v) for v in args)


@pytest.mark.parametrize("args", CASES, ids=range(len(CASES)))
def test_one_pass_check_agrees_with_the_walk(args: list[Any]) -> None:
    reference = checked(args)
    fast = _plain(args, 0, [1])
    if isinstance(reference, str):
        assert fast is None
        with pytest.raises(ValidationError) as err:
            Workload(template="t", args=args)
        assert reference in str(err.value)
    else:
        assert fast == reference
        if len(json.dumps(["t", args], separators=(",", ":"))) <= MAX_KEY_CHARS:
            assert Workload(template="t", args=args).args == reference
        else:  # arguments within every bound whose key the records index cannot hold
            with pytest.raises(ValidationError, match=f"more than {MAX_KEY_CHARS}"):
                Workload(template="t", args=args)


def test_a_key_is_refused_past_its_bound_and_kept_at_it() -> None:
    """The bound is on the key as stored: a workload of exactly MAX_KEY_CHARS
    characters is kept, one more refused, saying how long it is."""
    def of_length(total: int) -> list[str]:
        # strings of MAX_ARG_STRING, the last one cut so the key is ``total`` long
        args = ["x" * MAX_ARG_STRING] * (total // MAX_ARG_STRING)
        over = len(json.dumps(["t", args], separators=(",", ":"))) - total
        args[-1] = "x" * (MAX_ARG_STRING - over)
        return args

    assert len(Workload(template="t", args=of_length(MAX_KEY_CHARS)).key) == MAX_KEY_CHARS
    with pytest.raises(ValidationError, match=f"are {MAX_KEY_CHARS + 1} characters as JSON"):
        Workload(template="t", args=of_length(MAX_KEY_CHARS + 1))


def test_key_is_the_json_of_the_args_and_does_not_change_equality() -> None:
    one = Workload(template="conv2d_nchw.cuda", args=CONV)
    other = Workload(template="conv2d_nchw.cuda", args=json.dumps(CONV))
    assert one.key == json.dumps(["conv2d_nchw.cuda", CONV], separators=(",", ":"))
    assert one == other and hash(one) == hash(other)
    assert other.key == one.key and one == other
    assert one.model_dump(mode="json") == {"template": "conv2d_nchw.cuda", "args": CONV}
    assert "key" not in one.model_dump()

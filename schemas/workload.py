"""A workload: template name plus AutoTVM-serialised arguments, so keys match TVM logs."""

from __future__ import annotations

import json
import math
from functools import cached_property
from typing import Any

from pydantic import Field, field_validator, model_validator

from schemas.frozen import Frozen
from schemas.text import ONE_LINE, check_text

# Bounds no operator's arguments come near (a conv2d's are 6 items, 20 numbers, depth 3):
# past them a workload is junk that would only cost time and space.
MAX_TEMPLATE_CHARS = 128  # records.template is VARCHAR(128)
MAX_ARG_NODES = 1024
MAX_ARG_DEPTH = 8
MAX_ARG_STRING = 128
MAX_ARG_INT = 2**63 - 1
# records.workload_key leads PostgreSQL's ix_records_best, whose rows (the key, the target
# columns it includes at their longest, the cost) must fit a btree row of 2,704 bytes: a
# key of ~1,960 incompressible characters is the most that does, so half that, checked
# here, refuses a workload before anything is stored or planned for it
MAX_KEY_CHARS = 1024
# ``Workload.key``'s writer, made once: json.dumps with separators makes an encoder per call
_KEY_JSON = json.JSONEncoder(separators=(",", ":"))


def _check_arg(value: Any, path: str, depth: int, nodes: list[int]) -> None:
    nodes[0] += 1
    if nodes[0] > MAX_ARG_NODES:
        raise ValueError(f"args: more than {MAX_ARG_NODES} values")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_ARG_INT:
            raise ValueError(f"{path}: an integer outside the int64 range")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: {value} is not a finite number")
        return
    if isinstance(value, str):
        if len(value) > MAX_ARG_STRING:
            raise ValueError(f"{path}: string longer than {MAX_ARG_STRING} characters")
        check_text(value, path)
        return
    if isinstance(value, (list, tuple)):
        if depth >= MAX_ARG_DEPTH:
            raise ValueError(f"{path}: nested deeper than {MAX_ARG_DEPTH} lists")
        for i, item in enumerate(value):
            _check_arg(item, f"{path}[{i}]", depth + 1, nodes)
        return
    raise ValueError(f"{path}: {type(value).__name__} is not an AutoTVM-serialisable argument")


def _plain(value: list[Any] | tuple[Any, ...], depth: int, nodes: list[int]
           ) -> tuple[Any, ...] | None:
    """``value`` frozen when every item is of the plain kinds JSON gives and within the
    bounds ``_check_arg`` sets, else None (then ``_check_arg`` says why): the same rules
    in one pass, without the path of each value, which only an error message needs.
    ``nodes`` counts values seen, ``value`` itself included by the caller."""
    nodes[0] += len(value)
    if nodes[0] > MAX_ARG_NODES:
        return None
    out = []
    for item in value:
        kind = type(item)
        if kind is int:
            if not -MAX_ARG_INT <= item <= MAX_ARG_INT:
                return None
        elif kind is str:
            if len(item) > MAX_ARG_STRING or ONE_LINE.search(item):
                return None
        elif kind is list or kind is tuple:
            if depth + 1 >= MAX_ARG_DEPTH:
                return None
            item = _plain(item, depth + 1, nodes)
            if item is None:
                return None
        elif kind is float:
            if not math.isfinite(item):
                return None
        elif item is not None and kind is not bool:
            return None
        out.append(item)
    return tuple(out)


def tensor_arg(shape: tuple[int, ...] | list[int], dtype: str = "float32") -> list[Any]:
    """AutoTVM's serialisation of a placeholder tensor argument."""
    return ["TENSOR", [int(d) for d in shape], dtype]


def is_tensor_arg(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) == 3
        and value[0] == "TENSOR"
        and isinstance(value[1], (list, tuple))
        and isinstance(value[2], str)
    )


class Workload(Frozen):
    """One operator instance; ``key`` is what records are matched on."""

    template: str = Field(min_length=1, max_length=MAX_TEMPLATE_CHARS)
    args: tuple[Any, ...]

    @field_validator("template")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_text(value, "template")

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as err:  # or 4300+ digits, or too deep
                raise ValueError(f"args is not JSON: {str(err)[:100]}") from None
        if not isinstance(value, (list, tuple)):
            raise ValueError("args must be a JSON list, as AutoTVM serialises them")
        frozen = _plain(value, 0, [1])  # a list of plain values: checked and frozen at once
        if frozen is not None:
            return frozen
        _check_arg(value, "args", 0, [0])
        return tuple(_freeze(v) for v in value)

    @model_validator(mode="after")
    def _key_fits(self) -> Workload:
        if len(self.key) > MAX_KEY_CHARS:
            raise ValueError(f"workload: template and args are {len(self.key)} characters "
                             f"as JSON, more than {MAX_KEY_CHARS}")
        return self

    @cached_property
    def key(self) -> str:
        """The workload as records store it (``records.workload_key``): computed once, as
        a lookup of many workloads asks it of each several times. JSON writes the
        frozen tuples as the lists they were."""
        return _KEY_JSON.encode([self.template, self.args])

    def __eq__(self, other: object) -> bool:
        # equal exactly when records match them alike: args 1, 1.0 and true are three
        # workloads to the records table, as they are three hashes
        if not isinstance(other, Workload):
            return NotImplemented
        return self.key == other.key

    def __hash__(self) -> int:
        # the key is computed once and a str caches its hash; the fields' own hash walks
        # every nested tuple of the args each time
        return hash(self.key)

    def args_json(self) -> list[Any]:
        return [_thaw(v) for v in self.args]


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value

"""A point in a config space, encoded as AutoTVM encodes it (``index`` + ``entity``)."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.frozen import Frozen
from schemas.text import check_text, shown

KNOB_KINDS = ("sp", "ot", "re", "an")
# AutoTVM's config index is an int64 (trials.config_index is BIGINT).
MAX_INDEX = 2**63 - 1
MAX_KNOBS = 64
MAX_KNOB_ITEMS = 64  # factors of a split, axes of a reorder
MAX_NAME_CHARS = 128


def _check_scalar(value: Any, where: str) -> None:
    """A knob value's scalar: what AutoTVM writes (ints, bools, strings, None), bounded."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_INDEX:
            raise ValueError(f"{where}: an integer outside the int64 range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
    elif isinstance(value, str):
        if len(value) > MAX_NAME_CHARS:
            raise ValueError(f"{where}: string longer than {MAX_NAME_CHARS} characters")
        check_text(value, where)
    else:
        raise ValueError(f"{where}: a {type(value).__name__} is not a knob value")  # noqa: TRY004


class KnobEntity(BaseModel):
    """One knob's value: ``["tile_f", "sp", [-1, 2, 8, 1]]`` or ``["unroll_explicit", "ot", 1]``."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    kind: str
    value: Any

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_text(value, "knob name")

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in KNOB_KINDS:
            raise ValueError(f"knob kind {shown(value, 20)} is not one of "
                             f"{', '.join(KNOB_KINDS)}")
        return value

    @field_validator("value")
    @classmethod
    def _freeze(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            if len(value) > MAX_KNOB_ITEMS:
                raise ValueError(f"more than {MAX_KNOB_ITEMS} items")
            for i, item in enumerate(value):
                _check_scalar(item, f"item {i}")
            return tuple(value)
        _check_scalar(value, "value")
        return value

    def to_json(self) -> list[Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return [self.name, self.kind, value]


class Config(Frozen):
    """AutoTVM's ConfigEntity as it appears in a log line's ``config`` object."""

    index: int = Field(ge=0, le=MAX_INDEX)
    code_hash: str | None = Field(None, max_length=MAX_NAME_CHARS)
    entity: tuple[KnobEntity, ...] = Field(max_length=MAX_KNOBS)

    @field_validator("entity", mode="before")
    @classmethod
    def _entity(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ValueError("entity must be a list of [name, kind, value] triples")
        if len(value) > MAX_KNOBS:
            raise ValueError(f"entity: more than {MAX_KNOBS} knobs")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, (KnobEntity, dict)):
                out.append(item)
            elif isinstance(item, (list, tuple)) and len(item) == 3:
                out.append({"name": item[0], "kind": item[1], "value": item[2]})
            else:
                raise ValueError(f"entity[{i}] must be a [name, kind, value] triple, "
                                 f"got {shown(repr(item), 40)}")
        return out

    @cached_property
    def _identity(self) -> tuple[Any, ...]:
        return (self.index, self.code_hash,
                tuple((item.name, item.kind, item.value) for item in self.entity))

    def __hash__(self) -> int:
        # the fields' own hash walks every knob model each time; a config is hashed on
        # every look-up of the rule's verdict cache (``history._problem``)
        return hash(self._identity)

    def knob(self, name: str) -> Any:
        for item in self.entity:
            if item.name == name:
                return item.value
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {item.name: item.value for item in self.entity}

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "code_hash": self.code_hash,
            "entity": [item.to_json() for item in self.entity],
        }

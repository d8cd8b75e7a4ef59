"""A point in a config space, encoded as AutoTVM encodes it (``index`` + ``entity``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

KNOB_KINDS = ("sp", "ot", "re", "an")


class KnobEntity(BaseModel):
    """One knob's value: ``["tile_f", "sp", [-1, 2, 8, 1]]`` or ``["unroll_explicit", "ot", 1]``."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1)
    kind: str
    value: Any

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in KNOB_KINDS:
            raise ValueError(f"knob kind {value!r} is not one of {', '.join(KNOB_KINDS)}")
        return value

    @field_validator("value")
    @classmethod
    def _freeze(cls, value: Any) -> Any:
        if isinstance(value, list):
            return tuple(value)
        return value

    def to_json(self) -> list[Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return [self.name, self.kind, value]


class Config(BaseModel):
    """AutoTVM's ConfigEntity as it appears in a log line's ``config`` object."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    code_hash: str | None = None
    entity: tuple[KnobEntity, ...]

    @field_validator("entity", mode="before")
    @classmethod
    def _entity(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ValueError("entity must be a list of [name, kind, value] triples")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, KnobEntity) or isinstance(item, dict):
                out.append(item)
            elif isinstance(item, (list, tuple)) and len(item) == 3:
                out.append({"name": item[0], "kind": item[1], "value": item[2]})
            else:
                raise ValueError(f"entity[{i}] must be a [name, kind, value] triple, got {item!r}")
        return out

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

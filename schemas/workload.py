"""A workload: template name plus AutoTVM-serialised arguments, so keys match TVM logs."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


def _check_arg(value: Any, path: str) -> None:
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_arg(item, f"{path}[{i}]")
        return
    raise ValueError(f"{path}: {type(value).__name__} is not an AutoTVM-serialisable argument")


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


class Workload(BaseModel):
    """One operator instance; ``key`` is what records are matched on."""

    model_config = ConfigDict(frozen=True)

    template: str = Field(min_length=1)
    args: tuple[Any, ...]

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"args is not JSON: {err}") from None
        if not isinstance(value, (list, tuple)):
            raise ValueError("args must be a JSON list, as AutoTVM serialises them")
        _check_arg(value, "args")
        return tuple(_freeze(v) for v in value)

    @property
    def key(self) -> str:
        return json.dumps([self.template, self.args_json()], separators=(",", ":"))

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

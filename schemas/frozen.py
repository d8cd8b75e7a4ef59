"""A frozen model that may remember what it works out from its fields."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """A frozen model whose ``cached_property`` values (a workload's key, a config's
    identity, a target's model) are computed once from its fields: a copy made with
    changed fields drops them (pydantic's copy would carry them over) and computes its
    own."""

    model_config = ConfigDict(frozen=True)

    def model_copy(self, *, update: dict[str, Any] | None = None,
                   deep: bool = False) -> Any:
        copied = super().model_copy(update=update, deep=deep)
        if update:
            for cls in type(self).__mro__:
                for name, attr in vars(cls).items():
                    if isinstance(attr, cached_property):
                        copied.__dict__.pop(name, None)
        return copied

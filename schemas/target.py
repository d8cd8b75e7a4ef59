"""Targets written like AutoTVM: ``cuda -model=h200 -arch=sm_90``."""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

# AutoTVM's target keys: records tuned for one key apply to every target sharing it.
_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "cuda": ("cuda", "gpu"),
    "rocm": ("rocm", "gpu"),
    "opencl": ("opencl", "gpu"),
    "vulkan": ("vulkan", "gpu"),
    "metal": ("metal", "gpu"),
    "nvptx": ("cuda", "gpu"),
    "llvm": ("cpu",),
}


class Target(BaseModel):
    """A device kind plus its options, printed back in the order it was written."""

    model_config = ConfigDict(frozen=True)

    kind: str = Field(min_length=1, pattern=r"^[a-z][a-z0-9_]*$")
    options: tuple[tuple[str, str], ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            return cls._parse_fields(value)
        return value

    @model_serializer
    def _to_string(self) -> str:
        return str(self)

    @staticmethod
    def _parse_fields(text: str) -> dict[str, Any]:
        try:
            words = shlex.split(text)
        except ValueError as err:
            raise ValueError(f"target {text!r}: {err}") from None
        if not words:
            raise ValueError("target: empty string")
        kind, options = words[0], []
        for word in words[1:]:
            if not word.startswith("-") or word == "-":
                raise ValueError(f"target {text!r}: option {word!r} must look like -name=value")
            name, _, val = word.lstrip("-").partition("=")
            if not name:
                raise ValueError(f"target {text!r}: option {word!r} has no name")
            options.append((name, val))
        return {"kind": kind, "options": tuple(options)}

    @classmethod
    def parse(cls, text: str) -> Target:
        return cls.model_validate(text)

    def option(self, name: str, default: str | None = None) -> str | None:
        for key, val in self.options:
            if key == name:
                return val
        return default

    @property
    def model(self) -> str:
        return self.option("model", "unknown") or "unknown"

    @property
    def arch(self) -> str | None:
        return self.option("arch")

    @property
    def device_class(self) -> str:
        """"cpu" or "gpu": which template family suits the device. ``-device=cpu|gpu``
        says it outright; else cuda and rocm are GPUs, llvm a CPU, and an OpenCL device
        is a CPU when its model ends in "-cpu", as our OpenCL backend names the targets
        of devices whose OpenCL device type is CPU (``opencl -model=pocl-cpu``)."""
        explicit = self.option("device")
        if explicit in ("cpu", "gpu"):
            return explicit
        if self.kind == "llvm" or (self.kind == "opencl" and self.model.endswith("-cpu")):
            return "cpu"
        return "gpu"

    @property
    def keys(self) -> tuple[str, ...]:
        explicit = self.option("keys")
        if explicit:
            return tuple(k for k in explicit.split(",") if k)
        return _KIND_KEYS.get(self.kind, (self.kind,))

    def __str__(self) -> str:
        parts = [self.kind]
        for name, val in self.options:
            parts.append(f"-{name}={val}" if val != "" else f"-{name}")
        return " ".join(parts)

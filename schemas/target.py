"""Targets written like AutoTVM: ``cuda -model=h200 -arch=sm_90``."""

from __future__ import annotations

import re
import shlex
from functools import cached_property, lru_cache
from typing import Any

from pydantic import Field, model_serializer, model_validator

from schemas.frozen import Frozen
from schemas.text import check_text, shown

# A target is stored in VARCHAR(255) columns (jobs, workers, records) and its kind and
# model in VARCHAR(32) and VARCHAR(128) ones: longer ones are refused, not truncated.
MAX_TARGET_CHARS = 255
MAX_KIND_CHARS = 32
MAX_MODEL_CHARS = 128
MAX_OPTIONS = 32
# What an option value may not hold: it would not survive ``str`` then ``parse``.
_UNQUOTED = re.compile(r"[\s\"'\\]")
_QUOTING = re.compile(r"[\"'\\]")

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


class Target(Frozen):
    """A device kind plus its options, printed back in the order it was written."""

    kind: str = Field(min_length=1, pattern=r"^[a-z][a-z0-9_]*$")
    options: tuple[tuple[str, str], ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            return cls._parse_fields(value)
        return value

    @model_validator(mode="after")
    def _round_trips(self) -> Target:
        """A target must print back to itself: a stored target is parsed again by the
        scheduler, the dispatcher and every reader, and one that does not parse stalls
        them all."""
        text = str(self)
        if len(text) > MAX_TARGET_CHARS:
            raise ValueError(f"target {shown(text)}: longer than {MAX_TARGET_CHARS} characters")
        if len(self.kind) > MAX_KIND_CHARS:
            raise ValueError(f"target {shown(text)}: kind longer than {MAX_KIND_CHARS} "
                             "characters")
        if len(self.options) > MAX_OPTIONS:
            raise ValueError(f"target {shown(text)}: more than {MAX_OPTIONS} options")
        for name, val in self.options:
            for part, label in ((name, "name"), (val, "value")):
                check_text(part, f"target {shown(text)}: option {name[:40]!r} {label}")
                if _UNQUOTED.search(part):
                    raise ValueError(
                        f"target {shown(text)}: option {name[:40]!r} {label} {shown(part, 40)} "
                        "holds a space, quote or backslash")
            if not name or name.startswith("-") or "=" in name:
                raise ValueError(f"target {shown(text)}: option name {shown(name, 40)} "
                                 "is not a name")
        if len(self.model) > MAX_MODEL_CHARS:
            raise ValueError(f"target {shown(text)}: model longer than {MAX_MODEL_CHARS} "
                             "characters")
        if self._parse_fields(text) != {"kind": self.kind, "options": self.options}:
            raise ValueError(f"target {shown(text)}: does not read back as itself")
        return self

    @model_serializer
    def _to_string(self) -> str:
        return str(self)

    @staticmethod
    def _parse_fields(text: str) -> dict[str, Any]:
        # the length first: shlex on a megabyte of input is slow, and no target is that long
        if len(text) > MAX_TARGET_CHARS:
            raise ValueError(f"target {shown(text)}: longer than {MAX_TARGET_CHARS} characters")
        check_text(text, f"target {shown(text)}")
        try:
            # shlex only where it changes anything: it is 10x slower than str.split
            words = shlex.split(text) if _QUOTING.search(text) else text.split()
        except ValueError as err:
            raise ValueError(f"target {shown(text)}: {err}") from None
        if not words:
            raise ValueError("target: empty string")
        kind, options = words[0], []
        for word in words[1:]:
            if not word.startswith("-") or word == "-":
                raise ValueError(f"target {shown(text)}: option {shown(word, 40)} must look "
                                 "like -name=value")
            name, _, val = word.lstrip("-").partition("=")
            if not name:
                raise ValueError(f"target {shown(text)}: option {shown(word, 40)} has no name")
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

    # model and keys are read for every stored record a lookup ranks: worked out once
    @cached_property
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

    @cached_property
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


@lru_cache(maxsize=1024)
def parsed_target(text: str) -> Target | None:
    """The target ``text`` names, or None where it does not parse; remembered per process:
    stored rows and log lines name a few targets, each parsed once (a fifth of reading a
    record line)."""
    try:
        return Target.parse(text)
    except ValueError:
        return None

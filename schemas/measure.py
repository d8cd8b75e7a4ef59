"""Measure inputs and results with AutoTVM's error numbers."""

from __future__ import annotations

import json
import math
import time
from enum import IntEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.config import Config
from schemas.target import Target
from schemas.text import FREE_TEXT, SURROGATES, check_strings, check_text, printable
from schemas.workload import Workload

# AutoTVM stores this as the cost of a failed measurement.
FAILED_COST = 1e9
# What a measurement may report (check_measurement): MeasureOptions.repeat costs at most,
# a timestamp of this era (unix seconds below 2^40, year 36812), a bounded message.
MAX_COSTS = 1000
MAX_TIMESTAMP = float(2**40)
MAX_ERROR_MSG_CHARS = 2000
# A result's ``info`` (worker name, device, build log excerpts) rides in its record's line.
MAX_INFO_CHARS = 16384


class MeasureErrorNo(IntEnum):
    """AutoTVM's MeasureErrorNo, number for number."""

    NO_ERROR = 0
    INSTANTIATION_ERROR = 1  # config does not fit the workload or the device
    COMPILE_HOST = 2
    COMPILE_DEVICE = 3
    RUNTIME_DEVICE = 4
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7
    UNKNOWN_ERROR = 8


class MeasureOptions(BaseModel):
    """How a trial is timed; the same knobs as AutoTVM's LocalRunner."""

    model_config = ConfigDict(frozen=True)

    # Bounded: a job's options reach every worker that measures its trials, and one that
    # cannot be honoured (timeout_s=1e300 overflows a timer) must be refused at submission.
    number: int = Field(3, ge=1, le=1_000_000, description="runs averaged into one cost")
    repeat: int = Field(3, ge=1, le=1000, description="costs reported")
    min_repeat_ms: float = Field(0.0, ge=0, le=60_000, allow_inf_nan=False,
                                 description="raise number until a repeat lasts this "
                                 "(at least 100 on a GPU, to warm its clocks; launches "
                                 "are timed in batches of 1000)")
    timeout_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False,
                             description="wall time for build + check + timing")
    check_correctness: bool = True
    enable_cpu_cache_flush: bool = Field(
        False, description="AutoTVM's LocalRunner option: on a CPU device each timed launch "
        "reads every input but the first (the data: the weight, a fused bias or residual) "
        "from memory, not from the caches the launch before left them in, as a layer inside "
        "a model does; GPU devices ignore it")
    rtol: float = Field(1e-4, gt=0, le=1e6, allow_inf_nan=False)
    atol: float = Field(1e-4, ge=0, le=1e6, allow_inf_nan=False)


class MeasureInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: Target
    workload: Workload
    config: Config


class MeasureResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    costs: tuple[float, ...]
    error_no: MeasureErrorNo
    all_cost: float = 0.0
    timestamp: float = Field(default_factory=time.time)
    error_msg: str | None = None

    @field_validator("error_msg")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        # Every reader sends the message on as UTF-8: a lone surrogate could not be, and
        # a stored one would break every answer holding its record. check_measurement
        # holds the rest of what a reported message must obey.
        return value if value is None else check_text(value, "error_msg", SURROGATES)

    @property
    def ok(self) -> bool:
        return self.error_no == MeasureErrorNo.NO_ERROR

    @property
    def mean_cost(self) -> float:
        if not self.ok or not self.costs:
            return FAILED_COST
        return sum(self.costs) / len(self.costs)

    @classmethod
    def failure(
        cls, error_no: MeasureErrorNo, msg: str, all_cost: float = 0.0
    ) -> MeasureResult:
        """A failed measurement; ``msg`` (an exception's, a compiler's text) is made to
        pass check_measurement: unprintable characters replaced, cut to its bound."""
        return cls(costs=(FAILED_COST,), error_no=error_no, all_cost=all_cost,
                   error_msg=printable(msg, MAX_ERROR_MSG_CHARS))


def check_measurement(result: MeasureResult) -> None:
    """Raise ValueError (one line) unless ``result`` is what a worker may report and the
    records database may rank: the one rule for a worker's result and an imported line.

    Costs are seconds in (0, FAILED_COST] (a failed result carries FAILED_COST: no
    measurement ranks below a failure, and their mean stays finite), at least one
    when error_no is 0, at most MAX_COSTS; all_cost finite and >= 0; a timestamp in
    (0, 2^40); the error message printable text (line breaks and tabs allowed) of at
    most MAX_ERROR_MSG_CHARS characters. NaN and Infinity cannot be stored (PostgreSQL
    refuses them in JSON) and a zero or negative cost would outrank every measurement."""
    costs = result.costs
    if len(costs) > MAX_COSTS:
        raise ValueError(f"costs: more than {MAX_COSTS} costs")
    if not all(0 < c <= FAILED_COST for c in costs):  # False for NaN too
        listed = ", ".join(f"{c:g}" for c in costs[:5]) + (", ..." if len(costs) > 5 else "")
        raise ValueError(f"costs: every cost must be a finite number > 0 and <= "
                         f"{FAILED_COST:g} seconds (got [{listed}])")
    if result.ok and not costs:
        raise ValueError("costs: a result with error_no 0 needs at least one cost")
    if not (math.isfinite(result.all_cost) and result.all_cost >= 0):
        raise ValueError(f"all_cost: must be a finite number >= 0 seconds "
                         f"(got {result.all_cost:g})")
    if not (math.isfinite(result.timestamp) and 0 < result.timestamp < MAX_TIMESTAMP):
        raise ValueError(f"timestamp: must be unix seconds in (0, 2^40) "
                         f"(got {result.timestamp:g})")
    if result.error_msg is not None:
        if len(result.error_msg) > MAX_ERROR_MSG_CHARS:
            raise ValueError(f"error_msg: longer than {MAX_ERROR_MSG_CHARS} characters")
        check_text(result.error_msg, "error_msg", FREE_TEXT)


def check_info(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` unless it is more than MAX_INFO_CHARS characters of JSON, holds NaN or
    Infinity, or a string (a key among them) that is not printable text (line breaks
    and tabs allowed); ValueError with one line otherwise."""
    try:
        size = len(json.dumps(info, allow_nan=False))
    except ValueError:
        raise ValueError("info: numbers must be finite: NaN and Infinity are not valid "
                         "JSON") from None
    if size > MAX_INFO_CHARS:
        raise ValueError(f"info: at most {MAX_INFO_CHARS} characters of JSON")
    check_strings(info, "info", FREE_TEXT)
    return info

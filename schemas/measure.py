"""Measure inputs and results with AutoTVM's error numbers."""

from __future__ import annotations

import time
from enum import IntEnum

from pydantic import BaseModel, ConfigDict, Field

from schemas.config import Config
from schemas.target import Target
from schemas.workload import Workload

# AutoTVM stores this as the cost of a failed measurement.
FAILED_COST = 1e9


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
                                 description="raise number until a repeat lasts this")
    timeout_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False,
                             description="wall time for build + check + timing")
    check_correctness: bool = True
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
        return cls(costs=(FAILED_COST,), error_no=error_no, all_cost=all_cost, error_msg=msg)

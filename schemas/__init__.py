"""The shared vocabulary: workload, target, config, measure input/result, record.

Pure data, no I/O: every other part of the project may import this package.
"""

from schemas.config import Config, KnobEntity
from schemas.device import DeviceLimits
from schemas.measure import MeasureErrorNo, MeasureInput, MeasureOptions, MeasureResult
from schemas.record import LOG_VERSION, Record, RecordFormatError
from schemas.target import Target
from schemas.workload import Workload

__all__ = [
    "LOG_VERSION",
    "Config",
    "DeviceLimits",
    "KnobEntity",
    "MeasureErrorNo",
    "MeasureInput",
    "MeasureOptions",
    "MeasureResult",
    "Record",
    "RecordFormatError",
    "Target",
    "Workload",
]

"""Where a build's best configs come from: records sources (log files, memory, a tuner
server with a cached pretuned log), the fallback chain and the build report."""

from compiler.records.cache import LogCache, default_cache_dir
from compiler.records.choose import (
    DEFAULT,
    OTHER_DEVICE,
    SOURCES,
    THIS_DEVICE,
    Choice,
    Rejection,
    choose_configs,
    choose_one,
    rank,
)
from compiler.records.memory import LogSource, MemorySource, parse_log
from compiler.records.pretuned import TOPHUB_DIR
from compiler.records.report import Prediction, TaskEstimate, build_report, predict
from compiler.records.resolve import open_source
from compiler.records.server import LogFetch, RecordsServerError, ServerSource
from compiler.records.source import (
    Candidate,
    ChainSource,
    RecordsError,
    RecordSource,
    RecordsUnavailableError,
    RecordsWarning,
)

__all__ = [
    "TOPHUB_DIR",
    "DEFAULT",
    "OTHER_DEVICE",
    "SOURCES",
    "THIS_DEVICE",
    "Candidate",
    "ChainSource",
    "Choice",
    "LogCache",
    "LogFetch",
    "LogSource",
    "MemorySource",
    "Prediction",
    "RecordSource",
    "RecordsError",
    "RecordsServerError",
    "RecordsUnavailableError",
    "RecordsWarning",
    "Rejection",
    "ServerSource",
    "TaskEstimate",
    "build_report",
    "choose_configs",
    "choose_one",
    "default_cache_dir",
    "open_source",
    "parse_log",
    "predict",
    "rank",
]

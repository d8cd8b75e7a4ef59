"""The one HTTP client of the tuning server's REST API, typed by :mod:`schemas.api`.

It imports only ``schemas``, ``httpx`` and the standard library, so workers, the
compiler and scripts reach the server without importing it."""

from tuner_client.client import MAX_500, RECORDS_PAGE, PretunedLog, Stop, TunerClient
from tuner_client.errors import (
    ApiError,
    BadAnswer,
    Conflict,
    Invalid,
    NotFound,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "MAX_500",
    "RECORDS_PAGE",
    "ApiError",
    "BadAnswer",
    "Conflict",
    "Invalid",
    "NotFound",
    "PretunedLog",
    "Stop",
    "TunerClient",
    "Unauthorized",
    "Unavailable",
]

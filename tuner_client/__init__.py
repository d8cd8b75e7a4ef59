"""The one HTTP client of the tuning server's REST API, typed by :mod:`schemas.api`.

It imports only ``schemas``, ``httpx`` and the standard library, so workers, the
compiler and scripts reach the server without importing it."""

from tuner_client.client import RECORDS_PAGE, PretunedLog, TunerClient
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
    "RECORDS_PAGE",
    "ApiError",
    "BadAnswer",
    "Conflict",
    "Invalid",
    "NotFound",
    "PretunedLog",
    "TunerClient",
    "Unauthorized",
    "Unavailable",
]

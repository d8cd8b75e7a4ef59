"""What a failed API call raises: one exception per kind of refusal, each carrying the
HTTP status and the server's own ``detail`` message, so a caller branches on the type
and shows the message as is."""

from __future__ import annotations


class ApiError(Exception):
    """The server refused a request, or gave an answer that is not the API's.

    ``status`` is the HTTP status (None: no answer at all); ``detail`` the server's
    message (its ``{"detail": ...}``), else the HTTP reason."""

    def __init__(self, status: int | None, detail: str, method: str, path: str,
                 url: str = "") -> None:
        self.status = status
        self.detail = detail
        self.method = method
        self.path = path
        self.url = url
        where = f"{method} {url}{path}"
        super().__init__(f"{where}: {status} {detail}" if status is not None
                         else f"{where}: {detail}")


class NotFound(ApiError):
    """404: no such job, task or worker (or no such route: another server)."""


class Conflict(ApiError):
    """409: at odds with the worker's state or leases (a trial no longer its own, a
    deregistered worker)."""


class Unauthorized(ApiError):
    """401 (missing or unknown token) or 403 (the token's role may not do this)."""


class Invalid(ApiError):
    """422: the request does not validate; ``detail`` names the field."""


class Unavailable(ApiError):
    """503, or no answer at all (connection refused, timed out) after the retries: the
    server is down, restarting or overloaded; the same request may succeed later.

    ``sent``: whether the request may have reached the server (False: the connection
    never opened, so sending anything again is safe)."""

    def __init__(self, status: int | None, detail: str, method: str, path: str,
                 url: str = "", *, sent: bool = True) -> None:
        super().__init__(status, detail, method, path, url)
        self.sent = sent


class BadAnswer(ApiError):
    """A 2xx whose body is not what the API answers there: not a tuning server (or
    another version of it)."""


_BY_STATUS: dict[int, type[ApiError]] = {401: Unauthorized, 403: Unauthorized,
                                         404: NotFound, 409: Conflict, 422: Invalid,
                                         503: Unavailable}


def error_for(status: int) -> type[ApiError]:
    """The exception class of an HTTP error status."""
    return _BY_STATUS.get(status, ApiError)

"""Text rules every edge shares: which characters a stored string may hold, and how an
error is told in one bounded line (a REST detail, a CLI ``error:`` line)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

# Names, targets, query parameters: no control character (PostgreSQL refuses NUL, a
# terminal misprints the rest) and no lone surrogate ("\ud800" in JSON): it is not
# Unicode, so no UTF-8 encoder (the database driver, a JSON answer) takes it.
ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# Free text (error messages, build logs): the same, but tabs and line breaks are kept.
FREE_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
SURROGATES = re.compile(r"[\ud800-\udfff]")
# What one_line cuts to unless told otherwise: a REST error detail's bound.
MAX_LINE_CHARS = 500


def shown(text: str, limit: int = 60) -> str:
    """``repr`` of ``text`` cut to ``limit`` characters: error messages stay one short
    line whatever the input (``repr`` escapes control characters and surrogates)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def check_text(text: str, what: str, forbidden: re.Pattern[str] = ONE_LINE) -> str:
    """``text`` unless it holds a ``forbidden`` character; the message names ``what``."""
    bad = forbidden.search(text)
    if bad:
        char = bad.group()
        kind = "lone surrogate" if SURROGATES.match(char) else "control character"
        raise ValueError(f"{what} contains the {kind} {char!r}")
    return text


def check_strings(value: Any, what: str, forbidden: re.Pattern[str]) -> None:
    """check_text on every string (dict keys included) of a JSON value."""
    if isinstance(value, str):
        check_text(value, what, forbidden)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_strings(key, what, forbidden)
            check_strings(item, f"{what}.{str(key)[:40]}", forbidden)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_strings(item, what, forbidden)


def printable(text: str, limit: int, forbidden: re.Pattern[str] = FREE_TEXT) -> str:
    """``text`` with each ``forbidden`` character replaced by U+FFFD and cut to ``limit``
    characters: what a producer (a worker's failure message) makes of text it did not
    write, so that it passes check_text."""
    text = forbidden.sub("\ufffd", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters; a lone surrogate is escaped
    (``\\ud800``), so the line always encodes as UTF-8."""
    flat = " ".join(text.split())
    if SURROGATES.search(flat):
        flat = flat.encode("utf-8", "backslashreplace").decode("utf-8")
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def describe(error: Mapping[str, Any]) -> str:
    """One pydantic error (an item of ``errors()``) as "loc: msg", without pydantic's
    "Value error, " prefix; the message alone when it has no location."""
    where = ".".join(str(part) for part in error["loc"])
    msg = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def first_problem(err: ValidationError) -> str:
    """The first problem of ``err`` as "loc: msg": one sentence, not pydantic's
    multi-line dump with its documentation URLs."""
    return describe(err.errors(include_url=False, include_input=False)[0])

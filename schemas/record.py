"""One measured trial as one AutoTVM v0.2 JSON log line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from schemas.config import Config
from schemas.measure import MeasureErrorNo, MeasureInput, MeasureResult
from schemas.target import MAX_TARGET_CHARS, Target, parsed_target
from schemas.text import SURROGATES, check_strings, describe, one_line, shown
from schemas.workload import Workload

LOG_VERSION = 0.2
TVM_VERSION = "0.7.dev0"  # what AutoTVM readers expect to see beside version 0.2
# A record's info key, true where its trial ran with cold weights (a CPU device's
# ``MeasureOptions.enable_cpu_cache_flush``): the rule ranks such records apart.
COLD_INFO = "cpu_cache_flush"


def timed_cold(info: Any) -> bool:
    """Whether a record's ``info`` (a line's, any JSON) says it was timed with cold
    weights."""
    return isinstance(info, dict) and info.get(COLD_INFO) is True


def _known_target(value: Any) -> Target | None:
    """The Target a line's target text parses to (``parsed_target``); None for anything
    else, which the record's validation then refuses with its own message."""
    if type(value) is str and len(value) <= MAX_TARGET_CHARS:
        return parsed_target(value)
    return None


def line_of(target: str, workload: Workload, config: dict[str, Any], result: MeasureResult,
            info: dict[str, Any] | None = None, kwargs: dict[str, Any] | None = None,
            version: float = LOG_VERSION, tvm_version: str = TVM_VERSION) -> dict[str, Any]:
    """A record's AutoTVM line from its parts (``Record.to_json``; ``config`` as
    ``Config.to_json`` writes it): the server writes a trial's result this way, from
    parts it has checked already, without validating them again as a Record."""
    row: dict[str, Any] = {
        "input": [target, workload.template, workload.args_json(), {} if kwargs is None
                  else kwargs],
        "config": config,
        "result": [list(result.costs), int(result.error_no), result.all_cost,
                   result.timestamp],
        "version": version,
        "tvm_version": tvm_version,
    }
    info = dict(info or {})
    if result.error_msg and "error_msg" not in info:
        info["error_msg"] = result.error_msg
    if info:
        row["info"] = info
    return row


class RecordFormatError(ValueError):
    """A log line that is not a valid AutoTVM v0.2 record; the message names the field."""


class Record(BaseModel):
    """A measured trial; ``info`` carries worker and device facts AutoTVM readers ignore."""

    model_config = ConfigDict(frozen=True)

    target: Target
    workload: Workload
    kwargs: dict[str, Any] = {}
    config: Config
    result: MeasureResult
    version: float = LOG_VERSION
    tvm_version: str = TVM_VERSION
    info: dict[str, Any] | None = None

    @field_validator("kwargs", "tvm_version", "info")
    @classmethod
    def _encodable(cls, value: Any, where: ValidationInfo) -> Any:
        # The line is sent on as UTF-8 by every reader: a lone surrogate ("\ud800" in
        # JSON) could not be, and would break every answer holding this record.
        check_strings(value, str(where.field_name), SURROGATES)
        return value

    @property
    def input(self) -> MeasureInput:
        return MeasureInput(target=self.target, workload=self.workload, config=self.config)

    @classmethod
    def from_measure(
        cls, inp: MeasureInput, result: MeasureResult, info: dict[str, Any] | None = None
    ) -> Record:
        return cls(
            target=inp.target, workload=inp.workload, config=inp.config, result=result, info=info
        )

    @classmethod
    def from_line(cls, line: str) -> Record:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as err:  # or 4300+ digits, or nested too deep
            raise RecordFormatError(f"not JSON: {str(err)[:100]}") from None
        return cls.from_json(row)

    @classmethod
    def from_json(cls, row: Any) -> Record:
        if not isinstance(row, dict):
            raise RecordFormatError("a record line must be a JSON object")
        if "v" in row or "i" in row:
            raise RecordFormatError(
                f"AutoTVM log version {shown(str(row.get('v', '0.1')), 20)} is not supported: "
                "only v0.2 lines ({\"input\", \"config\", \"result\", \"version\": 0.2}) are read"
            )
        for field in ("input", "config", "result"):
            if field not in row:
                raise RecordFormatError(f"missing field {field!r}")
        version = row.get("version", LOG_VERSION)
        if version != LOG_VERSION:
            raise RecordFormatError(f"version: {shown(repr(version), 20)} is not {LOG_VERSION}")
        inp = row["input"]
        if not isinstance(inp, list) or len(inp) not in (3, 4):
            raise RecordFormatError("input: must be [target, template, args, kwargs]")
        res = row["result"]
        if not isinstance(res, list) or len(res) != 4:
            raise RecordFormatError("result: must be [costs, error_no, all_cost, timestamp]")
        costs, error_no, all_cost, timestamp = res
        info = row.get("info")  # a dict, else refused below
        try:
            return cls(
                target=_known_target(inp[0]) or inp[0],
                workload=Workload(template=inp[1], args=inp[2]),
                kwargs=inp[3] if len(inp) == 4 else {},
                config=row["config"],
                result=MeasureResult(
                    costs=costs,
                    error_no=error_no,
                    all_cost=all_cost,
                    timestamp=timestamp,
                    error_msg=info.get("error_msg") if isinstance(info, dict) else None,
                ),
                version=version,
                tvm_version=row.get("tvm_version", TVM_VERSION),
                info=info,
            )
        except ValidationError as err:
            first = err.errors(include_url=False, include_input=False)[0]
            problem = describe({**first, "loc": first["loc"] or ("record",)})
            raise RecordFormatError(one_line(problem, 400)) from None

    def to_json(self) -> dict[str, Any]:
        return line_of(str(self.target), self.workload, self.config.to_json(), self.result,
                       self.info, self.kwargs, self.version, self.tvm_version)

    def to_line(self) -> str:
        return json.dumps(self.to_json())


def read_lines(lines: Iterable[str]) -> Iterator[tuple[int, Record | RecordFormatError]]:
    """Yield (line number, record or error) for each non-blank, non-comment line."""
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            yield number, Record.from_line(text)
        except RecordFormatError as err:
            yield number, err


__all__ = ["MeasureErrorNo", "Record", "RecordFormatError", "read_lines"]

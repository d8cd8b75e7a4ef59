"""Argument parsing shared by command groups: JSON options with errors naming the flag,
and the one-line form every error takes (``error: <what was wrong>; <what to do>``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from pydantic import ValidationError

import tuner as api
from compiler.templates import (
    ConfigError,
    Template,
    UnknownTemplateError,
    WorkloadError,
    get_template,
)
from schemas import Config, MeasureOptions, Target, Workload
from schemas.text import first_problem, one_line

if TYPE_CHECKING:
    from compiler.ir import Graph

QUANTIZE = typer.Option(False, "--quantize",
                        help="int8 conv2d layers (TVM v0.5 quantization, see --qconfig)")
QCONFIG = typer.Option(
    None, "--qconfig", metavar="KEY=VALUE",
    help="a qconfig setting (TVM v0.5 names: nbit_input, nbit_weight, nbit_activation, "
         "dtype_input, dtype_weight, dtype_activation, global_scale, skip_k_conv, "
         "round_for_shift, store_lowbit_output); repeatable; needs --quantize")


MAX_ERROR = 600  # characters of an error line at most
_database = {"url": ""}  # the database URL the running command uses, for error lines


def fail(message: str, code: int = 2) -> NoReturn:
    """Exit ``code`` (2: a bad command line; 1: a failure) with one ``error:`` line."""
    typer.echo(one_line(f"error: {message}", MAX_ERROR), err=True)
    raise typer.Exit(code)


def error_text(err: Exception) -> str:
    """A pydantic error's first problem in plain words; another error's message."""
    return first_problem(err) if isinstance(err, ValidationError) else str(err)


def parse_target(text: str, flag: str = "--target") -> Target:
    try:
        return Target.parse(text)
    except ValueError as err:  # pydantic's ValidationError is one
        fail(f"{flag}: {error_text(err)}; write it like 'opencl -model=pocl-cpu' or "
             f"'cuda -model=h200 -arch=sm_90'")


MEASURE_FLAGS = {"number": "--number", "repeat": "--repeat",
                 "min_repeat_ms": "--min-repeat-ms", "timeout_s": "--timeout"}


def measure_options(number: int, repeat: int, min_repeat_ms: float,
                    timeout: float, cpu_cache_flush: bool = False) -> MeasureOptions:
    """The timing options, refused (exit 2, naming the flag) outside what a worker can
    honour."""
    try:
        return MeasureOptions(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                              timeout_s=timeout, enable_cpu_cache_flush=cpu_cache_flush)
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        fail(f"{MEASURE_FLAGS.get(name, name)}: {first['msg']}")


def note_database(url: str) -> str:
    """Remember the URL a command opens, so a database error can name it."""
    _database["url"] = url
    return url


def database_in_use() -> str:
    """The database URL of the running command, its password hidden."""
    url = _database["url"]
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as given
        return url


def check_server_url(url: str, flag: str = "--server") -> str:
    """A server URL must be http(s)://HOST[:PORT]: refused before anything starts."""
    import httpx

    if not url.startswith(("http://", "https://")):
        fail(f"{flag}: {url!r} is not an http:// or https:// URL; give the tuning "
             f"server's address, e.g. http://127.0.0.1:8600")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as err:
        fail(f"{flag}: {url!r}: {err}; give e.g. http://127.0.0.1:8600")
    if not parsed.host:
        fail(f"{flag}: {url!r} names no host; give e.g. http://127.0.0.1:8600")
    return url.rstrip("/")


def parse_json(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        fail(f"{flag}: not valid JSON ({err.msg} at column {err.colno})")


def load_template(name: str) -> Template:
    try:
        return get_template(name)
    except UnknownTemplateError as err:
        fail(f"TEMPLATE: {err}")


def load_workload(template: Template, text: str, flag: str = "--workload") -> Workload:
    """An AutoTVM args list; checked against the template at once."""
    args = parse_json(text, flag)
    try:
        workload = Workload(template=template.name, args=args)
        template.parse(workload)
    except ValidationError as err:
        fail(f"{flag}: {err.errors()[0]['msg']}")
    except WorkloadError as err:
        fail(f"{flag}: {err}")
    return workload


def load_config(template: Template, workload: Workload, config: str | None,
                index: int | None) -> Config:
    """``--config`` takes an AutoTVM ``config`` object; ``--index`` a point of the space."""
    if (config is None) == (index is None):
        fail("give exactly one of --config JSON or --index N")
    space = template.space(workload)
    if index is not None:
        try:
            return space.get(index)
        except ConfigError as err:
            fail(f"--index: {err}")
    raw = parse_json(config or "", "--config")
    try:
        cfg = Config.model_validate(raw)
        template.decode(workload, cfg)  # knob names and splits must fit this space
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"--config: {where}: {first['msg']}")
    except ConfigError as err:
        fail(f"--config: {err}")
    return cfg


def quantized(graph: Graph, quantize: bool, qconfig: list[str] | None) -> Graph:
    """``graph`` with its convs in int8 when ``--quantize`` asks for it."""
    if not quantize:
        if qconfig:
            fail("--qconfig: needs --quantize")
        return graph
    from compiler.passes.quantize import QConfig, QuantizeError

    try:
        config = QConfig.from_pairs(qconfig or [])
    except QuantizeError as err:
        fail(f"--qconfig: {err}")
    return api.quantized(graph, config)


def open_client(server: str, token: str | None, timeout: float = 30.0) -> api.Client:
    """The server at ``--server`` (checked first) as ``--token``."""
    return api.Client(check_server_url(server), token, timeout=timeout)


def with_hint(err: api.TunerError) -> str:
    """A ``tuner`` error's message with the flags that fix it."""
    if isinstance(err, api.Unreachable):
        return f"{err}; check --server (TUNER_SERVER) and that `tuner serve` runs there"
    if isinstance(err, api.Unauthorized):
        return (f"{err}: pass it with --token or TUNER_TOKEN (`tuner token create --role "
                f"client` makes one)")
    return str(err)

"""Argument parsing shared by command groups: JSON options with errors naming the flag."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from pydantic import ValidationError

from compiler.templates import (
    ConfigError,
    Template,
    UnknownTemplateError,
    WorkloadError,
    get_template,
)
from schemas import Config, Workload

if TYPE_CHECKING:
    from compiler.ir import Graph

QUANTIZE = typer.Option(False, "--quantize",
                        help="int8 conv2d layers (TVM v0.5 quantization, see --qconfig)")
QCONFIG = typer.Option(
    None, "--qconfig", metavar="KEY=VALUE",
    help="a qconfig setting (TVM v0.5 names: nbit_input, nbit_weight, nbit_activation, "
         "dtype_input, dtype_weight, dtype_activation, global_scale, skip_k_conv, "
         "round_for_shift, store_lowbit_output); repeatable; needs --quantize")


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


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
    from compiler.passes.quantize import quantize as run

    try:
        config = QConfig.from_pairs(qconfig or [])
    except QuantizeError as err:
        fail(f"--qconfig: {err}")
    return run(graph, config)

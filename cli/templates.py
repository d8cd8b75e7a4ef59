"""``tuner space`` and ``tuner codegen``: look inside a template without a device."""

from __future__ import annotations

import json

import typer

from cli.common import fail, load_config, load_template, load_workload
from compiler.templates import ConfigError, Epilogue


def space(
    template: str = typer.Argument(..., help="template name, e.g. conv2d_nchw.cuda"),
    workload: str = typer.Option(..., "--workload", help="AutoTVM args list as JSON"),
) -> None:
    """Size and knobs of a template's config space for one workload."""
    tmpl = load_template(template)
    wl = load_workload(tmpl, workload)
    try:
        sp = tmpl.space(wl)
    except ConfigError as err:
        fail(f"--workload: {err}")
    out = {
        "template": tmpl.name,
        "size": len(sp),
        "flops": tmpl.flops(wl),
        "knobs": sp.describe(),
        "default": tmpl.default_config(wl).to_json(),
    }
    typer.echo(json.dumps(out, indent=2))


def codegen(
    template: str = typer.Argument(..., help="template name"),
    workload: str = typer.Option(..., "--workload", help="AutoTVM args list as JSON"),
    config: str | None = typer.Option(None, "--config", help="AutoTVM config object as JSON"),
    index: int | None = typer.Option(None, "--index", help="config index in the space"),
    dialect: str = typer.Option("cuda", "--dialect", help="cuda or opencl"),
    epilogue: str = typer.Option(
        "", "--epilogue",
        help="fused ops in order, e.g. bias,relu,add or bias,clip:0:6 (ops: bias, add, relu, "
             "clip:LO:HI, leaky_relu:A, hard_sigmoid:A:B, hard_swish, silu)"),
) -> None:
    """Print the kernel source of one config as a trial times it, with its launch shape."""
    if dialect not in ("cuda", "opencl"):
        fail(f"--dialect: {dialect!r} is not cuda or opencl")
    tmpl = load_template(template)
    wl = load_workload(tmpl, workload)
    cfg = load_config(tmpl, wl, config, index)
    try:
        kernel = tmpl.codegen(wl, cfg, dialect, Epilogue.parse(epilogue),
                              tmpl.measure_io(wl, cfg))
    except ConfigError as err:
        fail(f"--config: {err}")
    except ValueError as err:
        fail(f"--epilogue: {err}")
    typer.echo(f"// entry {kernel.entry} grid {list(kernel.grid)} block {list(kernel.block)}")
    typer.echo(kernel.source, nl=False)

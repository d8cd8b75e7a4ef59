"""``tuner devices``: local devices, their target strings and limits."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from compiler.runtime import list_devices


def devices(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List local devices; the first of each target is what that target string opens."""
    found = list_devices()
    if as_json:
        typer.echo(json.dumps([d.to_json() for d in found], indent=2))
        return
    if not found:
        typer.echo("no devices: install an OpenCL driver (pocl-opencl-icd) or pycuda", err=True)
        raise typer.Exit(1)
    table = Table("device", "target", "name", "platform", "threads/block", "local mem",
                  "CUs", "default for")
    seen: set[str] = set()
    for d in found:
        target = str(d.target)
        default = target if target not in seen else ""
        seen.add(target)
        table.add_row(d.spec, target, d.name, d.platform.split(" Linux")[0],
                      str(d.limits.max_threads_per_block),
                      f"{d.limits.max_shared_memory_per_block // 1024} KiB",
                      str(d.limits.compute_units), default)
    Console(width=160).print(table)

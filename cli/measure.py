"""``tuner measure``: build one config on a local device, check it, time it, print a record."""

from __future__ import annotations

from typing import Any

import typer

from cli.common import fail, load_config, load_template, load_workload, measure_options
from compiler.runtime.isolate import IsolatedMeasurer
from compiler.runtime.measure import MeasureRequest, cold_weights
from compiler.templates import Epilogue
from schemas import MeasureInput, Record, Target
from schemas.record import COLD_INFO


def measure(
    template: str = typer.Argument(..., help="template name"),
    workload: str = typer.Option(..., "--workload", help="AutoTVM args list as JSON"),
    config: str | None = typer.Option(None, "--config", help="AutoTVM config object as JSON"),
    index: int | None = typer.Option(None, "--index", help="config index in the space"),
    target: str | None = typer.Option(None, "--target", help="e.g. 'opencl -model=pocl-cpu'"),
    device: str | None = typer.Option(None, "--device", help="device spec, e.g. opencl:0"),
    number: int = typer.Option(3, "--number", min=1, help="runs averaged per cost"),
    repeat: int = typer.Option(3, "--repeat", min=1, help="costs measured"),
    min_repeat_ms: float = typer.Option(0.0, "--min-repeat-ms", min=0),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="seconds for the trial"),
    cpu_cache_flush: bool = typer.Option(
        False, "--cpu-cache-flush", help="on a CPU device, each launch reads its weight "
                                         "from memory (as `tuner tune` times trials)"),
    epilogue: str = typer.Option("", "--epilogue", help="fused ops, e.g. bias,relu or bias,hard_swish (as tuner codegen --epilogue)"),
) -> None:
    """Measure one config; prints one AutoTVM record line (exit 1 if the trial failed)."""
    tmpl = load_template(template)
    wl = load_workload(tmpl, workload)
    cfg = load_config(tmpl, wl, config, index)
    if target is not None:
        try:
            Target.parse(target)
        except ValueError as err:
            fail(f"--target: {err}")
    try:
        fused = Epilogue.parse(epilogue)
    except ValueError as err:
        fail(f"--epilogue: {err}")
    options = measure_options(number, repeat, min_repeat_ms, timeout, cpu_cache_flush)
    request = MeasureRequest(tmpl.name, wl, cfg, options, fused)
    try:
        with IsolatedMeasurer(device, target) as measurer:
            result = measurer.measure(request)
            info = measurer.device_info
    except RuntimeError as err:
        fail(str(err), code=1)
    facts: dict[str, Any] = {"device": info.name, "platform": info.platform}
    if cold_weights(options, info):
        facts[COLD_INFO] = True
    record = Record.from_measure(
        MeasureInput(target=info.target, workload=wl, config=cfg), result, info=facts)
    typer.echo(record.to_line())
    if not result.ok:
        typer.echo(f"error_no {int(result.error_no)} ({result.error_no.name}): "
                   f"{result.error_msg}", err=True)
        raise typer.Exit(1)
    gflops = tmpl.flops(wl) / result.mean_cost / 1e9
    typer.echo(f"{result.mean_cost * 1e3:.4f} ms, {gflops:.2f} GFLOP/s on {info.name}", err=True)

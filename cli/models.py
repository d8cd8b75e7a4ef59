"""``tuner compile``, ``tuner run`` and ``tuner tasks``: build an ONNX model with the best
known configs, run it on an input, or list the tasks it would tune."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

import tuner as api
from cli.common import QCONFIG, QUANTIZE, fail, parse_target, quantized
from cli.db import DATABASE_URL, resolve_url
from compiler.ir import Graph, IRError, print_graph
from compiler.records import RecordsError, RecordSource
from compiler.runtime.device import BuildError, DeviceRuntimeError
from compiler.tasks import Task

if TYPE_CHECKING:
    from compiler.build_module import Module
    from compiler.hetero import HeteroModule
    from compiler.runtime import Device
    from compiler.runtime.executor import BenchmarkResult

MODEL = typer.Argument(..., exists=True, dir_okay=False, readable=True, help="an .onnx file")
TARGET = typer.Option(..., "--target", help="e.g. 'opencl -model=pocl-cpu'")
RECORDS = typer.Option(
    None, "--records",
    help="server URL, AutoTVM log file, or several comma-separated; default: the embedded "
         "database when it exists ('none': template defaults only)")
TOKEN = typer.Option(None, "--token", envvar="TUNER_TOKEN", help="bearer token for a server")
PLACE = typer.Option(
    None, "--place", metavar="OP=DEVICE",
    help="run the ops OP names (an op such as nn.relu, its last part such as conv2d, or a "
         "node name) on DEVICE (host, opencl:N, cuda:N); repeatable, the first match wins, "
         "other ops run on --device")
AUTO_PLACE = typer.Option(
    False, "--auto-place",
    help="time every op on the host and on --device, place each where the model runs "
         "fastest (measured against each device alone; never slower than the best)")


def import_model(path: Path) -> Graph:
    # onnx loads only for the commands that read a model, not at every `tuner` start
    from compiler.frontend import FrontendError, import_onnx

    try:
        return import_onnx(path)
    except (FrontendError, IRError) as err:
        fail(f"{path}: {err}", code=1)


def records_source(spec: str | None, token: str | None,
                   database_url: str | None) -> RecordSource | None:
    """``--records``: a server URL, log files, or ``none``; without it the database (the
    embedded one unless --database-url names another)."""
    if spec is None:
        return api.records.database(resolve_url(database_url))
    if spec.strip().lower() == "none":
        return None
    try:
        return api.records.source(spec, token=token)
    except ValueError as err:
        fail(str(err))


def print_tasks(tasks: list[Task]) -> None:
    table = Table(title=f"{len(tasks)} tasks")
    for col in ("#", "template", "workload", "layers", "GFLOP"):
        table.add_column(col, justify="right" if col in ("#", "layers", "GFLOP") else "left")
    for i, task in enumerate(tasks):
        args = task.workload.args_json()
        table.add_row(str(i), task.template, _short(args), str(len(task.layers)),
                      f"{task.total_flops / 1e9:.3f}")
    Console(width=200).print(table)


def _short(args: list) -> str:
    shapes = [str(a[1]) for a in args if isinstance(a, list) and a and a[0] == "TENSOR"]
    rest = [str(a) for a in args if not (isinstance(a, list) and a and a[0] == "TENSOR")]
    return " ".join(shapes + rest[:-1])


def tasks(model: Path = MODEL, target: str = TARGET, quantize: bool = QUANTIZE,
          qconfig: list[str] | None = QCONFIG) -> None:
    """List the conv2d/dense tasks of a model with their AutoTVM workloads."""
    tgt = parse_target(target)
    found = api.extract_tasks(quantized(import_model(model), quantize, qconfig), tgt)
    typer.echo(f"target {tgt}: a {tgt.device_class.upper()} device, so "
               f"{'CPU' if tgt.device_class == 'cpu' else 'GPU'} templates first "
               "(-device=cpu|gpu overrides)")
    print_tasks(found)
    for i, task in enumerate(found):
        typer.echo(f"{i}: {task.workload.key}")


def _prepare(model: Path, target: str, device: str | None, print_ir: bool,
             quantize: bool = False, qconfig: list[str] | None = None) -> tuple[Graph, Device]:
    """The model imported, quantized when asked, optimized (printed with --print-ir),
    and the device it builds for."""
    from compiler.passes import optimize
    from compiler.runtime import open_device

    tgt = parse_target(target)
    graph = import_model(model)
    rewritten = quantized(graph, quantize, qconfig)
    optimized = optimize(rewritten)
    if print_ir:
        typer.echo("// before passes")
        typer.echo(print_graph(graph))
        if quantize:
            typer.echo("// after quantize")
            typer.echo(print_graph(rewritten))
        typer.echo("// after passes")
        typer.echo(print_graph(optimized))
    try:
        dev = open_device(device, target=str(tgt))
    except (RuntimeError, ValueError) as err:
        fail(str(err), code=1)
    return optimized, dev


def _build(model: Path, target: str, records: str | None, token: str | None,
           database_url: str | None, device: str | None, print_ir: bool = False,
           quantize: bool = False, qconfig: list[str] | None = None,
           graph_tune: bool = False) -> Module:
    optimized, dev = _prepare(model, target, device, print_ir, quantize, qconfig)
    source = records_source(records, token, database_url)
    try:
        module = api.build(optimized, records=source, device=dev, optimized=True,
                           graph_tune=graph_tune)
    except RecordsError as err:
        fail(str(err), code=1)
    except (BuildError, DeviceRuntimeError, IRError) as err:
        fail(f"{model}: {err}", code=1)
    typer.echo(module.report())
    return module


def parse_place(items: list[str]) -> dict[str, str]:
    """``--place OP=DEVICE`` options as placement rules, in the order given."""
    from compiler.passes.annotate_device import parse_device_spec

    rules: dict[str, str] = {}
    for text in items:
        key, sep, spec = text.partition("=")
        key = key.strip()
        if not sep or not key or not spec.strip():
            fail(f"--place {text!r}: expected OP=DEVICE, e.g. conv2d=opencl:0 or nn.relu=host")
        try:
            device = parse_device_spec(spec)
        except ValueError as err:
            fail(f"--place {text!r}: {err}")
        if key in rules and rules[key] != device:
            fail(f"--place {key}: given twice ({rules[key]} and {device})")
        rules[key] = device
    return rules


def _build_hetero(model: Path, target: str, records: str | None, token: str | None,
                  database_url: str | None, device: str | None, print_ir: bool,
                  rules: dict[str, str], auto: bool, quantize: bool = False,
                  qconfig: list[str] | None = None) -> HeteroModule:
    """``_build`` across devices: ``rules`` (``--place``) or automatic placement."""
    from compiler.hetero import build_hetero
    from compiler.kernels import NoKernelError
    from compiler.passes.annotate_device import HOST, unmatched_rules
    from compiler.runtime import open_device

    optimized, dev = _prepare(model, target, device, print_ir, quantize, qconfig)
    devices: dict[str, Device] = {dev.info.spec: dev}
    for spec in dict.fromkeys(rules.values()):
        if spec != HOST and spec not in devices:
            try:
                devices[spec] = open_device(spec)
            except (RuntimeError, ValueError, ImportError) as err:
                fail(f"--place: device {spec}: {err}")
    for key in unmatched_rules(optimized, rules):
        typer.echo(f"note: --place {key}={rules[key]} matches no op of the optimized graph",
                   err=True)
    source = records_source(records, token, database_url)
    try:
        module = build_hetero(optimized, None if auto else rules, dev.info.spec,
                              records=source, devices=devices, auto=auto, optimized=True)
    except RecordsError as err:
        fail(str(err), code=1)
    except (BuildError, DeviceRuntimeError, IRError, NoKernelError) as err:
        fail(f"{model}: {err}", code=1)
    except ValueError as err:  # a placement the devices here cannot take
        fail(f"--place: {err}")
    if print_ir:
        typer.echo("// after device placement")
        typer.echo(print_graph(module.graph, module.placement))
    typer.echo(module.report())
    return module


def _latency(result: BenchmarkResult, how: str) -> str:
    return (f"latency: mean {result.mean * 1e3:.2f} ms, median {result.median * 1e3:.2f} ms, "
            f"std {result.std * 1e3:.2f} ms ({how})")


def compile_model(
    model: Path = MODEL,
    target: str = TARGET,
    records: str | None = RECORDS,
    token: str | None = TOKEN,
    database_url: str | None = DATABASE_URL,
    device: str | None = typer.Option(None, "--device", help="e.g. opencl:0"),
    print_ir: bool = typer.Option(False, "--print-ir", help="the IR before and after passes"),
    benchmark: bool = typer.Option(False, "--benchmark", help="time the whole model"),
    number: int = typer.Option(5, "--number", min=1),
    repeat: int = typer.Option(3, "--repeat", min=1),
    place: list[str] | None = PLACE,
    auto_place: bool = AUTO_PLACE,
    quantize: bool = QUANTIZE,
    qconfig: list[str] | None = QCONFIG,
    graph_tune: bool = typer.Option(
        False, "--graph-tune", help="choose CPU convs' records by dynamic programming over "
        "the graph, counting measured layout read costs (cached per device)"),
) -> None:
    """Build a model with the best known config of every task and print the report."""
    if place or auto_place:
        if place and auto_place:
            fail("--place and --auto-place: give one or the other")
        rules = parse_place(place or [])
        hetero = _build_hetero(model, target, records, token, database_url, device, print_ir,
                               rules, auto_place, quantize, qconfig)
        if benchmark:
            try:
                result = hetero.benchmark(number=number, repeat=repeat)
            except DeviceRuntimeError as err:
                fail(f"--benchmark: {err}", code=1)
            typer.echo(_latency(result, f"{repeat} x {number} runs, wall clock, "
                                f"{len(hetero.segments)} segment(s), "
                                f"{len(hetero.copies)} device_copy"))
        return
    module = _build(model, target, records, token, database_url, device, print_ir, quantize,
                    qconfig, graph_tune)
    if module.layout_tuning is not None:
        t = module.layout_tuning
        typer.echo(f"graph tuning: {t.changed} of {t.layers} layers changed, predicted "
                   f"{t.tuned_total * 1e3:.2f} ms against {t.greedy_total * 1e3:.2f} ms "
                   f"({t.measured} read costs measured)")
    if benchmark:
        if not module.program.steps:
            fail(f"{model}: nothing to time (the model runs no kernel)", code=1)
        try:
            result = module.benchmark(number=number, repeat=repeat)
        except DeviceRuntimeError as err:
            fail(f"--benchmark: {err}", code=1)
        typer.echo(_latency(result, f"{repeat} x {number} runs"))
        slowest = sorted(module.profile(), key=lambda s: -s.seconds)[:5]
        for step in slowest:
            typer.echo(f"  {step.seconds * 1e3:8.2f} ms  {step.share * 100:5.1f}%  {step.name}")


def run_model(
    model: Path = MODEL,
    target: str = TARGET,
    input_path: Path = typer.Option(..., "--input", exists=True, dir_okay=False,
                                    help=".npy for the model's (first) input"),
    output_path: Path = typer.Option(..., "--output", help=".npy written with the output"),
    records: str | None = RECORDS,
    token: str | None = TOKEN,
    database_url: str | None = DATABASE_URL,
    device: str | None = typer.Option(None, "--device", help="e.g. opencl:0"),
) -> None:
    """Build a model, run it on one input, save the (first) output."""
    if not output_path.parent.is_dir():
        fail(f"--output: folder {output_path.parent} does not exist")
    try:
        data = np.load(input_path, allow_pickle=False)
    except (ValueError, OSError) as err:
        fail(f"--input: {err}")
    module = _build(model, target, records, token, database_url, device)
    try:
        (out, *_rest) = module.run([data])
    except (ValueError, IRError) as err:
        fail(f"--input: {err}")
    except DeviceRuntimeError as err:
        fail(f"{model}: {err}", code=1)
    np.save(output_path, out)
    typer.echo(f"wrote {output_path}: shape {list(out.shape)}")

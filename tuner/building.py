"""Models as values: load one, list its tasks, build it with the best records known.

``with apply_history_best(records):`` makes ``records`` the source of every
``tuner.build`` inside the block that names none, as AutoTVM's context does for
``relay.build``. It is a ContextVar: a thread started inside the block does not see it
(pass ``records=`` to builds in other threads)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.ir import Graph
from compiler.records import RecordSource
from compiler.tasks import Task
from schemas import Target

if TYPE_CHECKING:
    from compiler.build_module import Module
    from compiler.passes.quantize import QConfig
    from compiler.runtime import Device

Model = Graph | str | Path | Any  # a Graph, an .onnx path or an onnx.ModelProto

_active: ContextVar[RecordSource | None] = ContextVar("tuner_records", default=None)


@contextmanager
def apply_history_best(records: RecordSource | str | Path | Sequence[str | Path]
                       ) -> Iterator[RecordSource]:
    """Builds inside the block that name no records use ``records`` (a source, or log
    files / a server URL as ``tuner.records.source`` takes them).

    The choice lives in a ContextVar, as AutoTVM's context does in a thread-local: it
    holds in this thread (and asyncio tasks started inside), not in threads started
    inside the block; give those builds ``records=``."""
    from tuner.records import source

    chosen = records if isinstance(records, RecordSource) else source(records)
    mark = _active.set(chosen)
    try:
        yield chosen
    finally:
        _active.reset(mark)


def current_records() -> RecordSource | None:
    """The source of the innermost ``apply_history_best`` block, if any."""
    return _active.get()


def _target(target: str | Target) -> Target:
    return target if isinstance(target, Target) else Target.parse(target)


def quantized(graph: Graph, qconfig: QConfig | Sequence[str] = ()) -> Graph:
    """``graph`` with its conv2d layers in int8 (TVM v0.5 quantization; ``qconfig``: a
    QConfig, or its settings as ``KEY=VALUE`` strings)."""
    from compiler.passes.quantize import QConfig, quantize

    config = qconfig if isinstance(qconfig, QConfig) else QConfig.from_pairs(list(qconfig))
    return quantize(graph, config)


def load(model: Model, quantize: bool = False, qconfig: Sequence[str] = ()) -> Graph:
    """A model as an optimized graph (int8 convs with ``quantize``, TVM v0.5's qconfig
    settings as ``KEY=VALUE`` strings), what tuning and building both start from."""
    from compiler.build_module import load_graph
    from compiler.passes import optimize

    graph = load_graph(model)
    if quantize:
        graph = quantized(graph, qconfig)
    elif qconfig:
        raise ValueError("qconfig: needs quantize=True")
    return optimize(graph)


def extract_tasks(model: Model, target: str | Target, quantize: bool = False,
                  qconfig: Sequence[str] = ()) -> list[Task]:
    """The model's conv2d/dense tasks for ``target``, in first-use order: each task's
    workload (what records are keyed by), template, layers and FLOPs; what ``tuner
    tasks`` prints and ``tuner.tune`` tunes."""
    from compiler.tasks import extract_tasks as extract

    return extract(load(model, quantize, qconfig), _target(target))


def build(model: Model, target: str | Target | None = None,
          records: RecordSource | None = None, device: Device | str | None = None,
          quantize: bool = False, qconfig: Sequence[str] = (),
          optimized: bool = False, graph_tune: bool = False) -> Module:
    """Build ``model`` for the local device matching ``target`` (or ``device``, e.g.
    ``opencl:0``) with the best config of every task from ``records`` (default: the
    enclosing ``apply_history_best``; without one, every template's default).
    ``optimized``: ``model`` is a graph :func:`load` already returned. ``graph_tune``:
    choose each CPU conv's record by dynamic programming over the whole graph, counting
    the measured cost of reading a neighbour's channel block (``compiler.layout_tune``;
    measures those read costs once per device, cached). A device this
    opens is the module's: ``module.close()`` (or ``with``) releases it; a
    :class:`Device` passed in stays the caller's."""
    from compiler.build_module import build as compile_graph
    from compiler.build_module import load_graph
    from compiler.runtime import open_device

    source = records if records is not None else current_records()
    graph = load_graph(model) if optimized else load(model, quantize, qconfig)
    if device is not None and not isinstance(device, str):
        return compile_graph(graph, records=source, device=device, optimized=True,
                             graph_tune=graph_tune)
    opened = open_device(device, target=str(target) if target is not None else None)
    try:
        module = compile_graph(graph, records=source, device=opened, optimized=True,
                               graph_tune=graph_tune)
    except BaseException:
        opened.close()
        raise
    module.owns_device = True
    return module

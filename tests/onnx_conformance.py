"""ONNX's own operator test cases (``onnx.backend.test.case.node``), generated in the
test session, run through ``compiler.build`` on a device and checked against the
expected outputs the cases carry.

The cases in scope: every node case whose operators are all in ``OPERATORS`` (the CNN
operator set the frontend promises) and whose tensors are float32 data, with int64 /
int32 / bool only where an operator takes indices, shapes or masks. Inputs that are
not float32, and inputs the frontend must know at import time (a shape fed as an
input), are bound as constants; the rest stay graph inputs.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from compiler.build_module import build
from compiler.frontend import FrontendError, import_onnx
from compiler.runtime import Device

OPERATORS = frozenset("""
Conv ConvTranspose Gemm MatMul Relu LeakyRelu PRelu Elu Selu Clip Sigmoid HardSigmoid
HardSwish Tanh Softplus Gelu Mish Erf Softmax LogSoftmax Add Sub Mul Div Pow Sqrt Exp
Log Abs Neg Sum Mean Max Min Concat Reshape Flatten Transpose Squeeze Unsqueeze Slice
Split Pad Expand Tile Gather Where Equal Greater Less Cast Shape Constant
ConstantOfShape Identity Dropout MaxPool AveragePool GlobalAveragePool GlobalMaxPool
ReduceMean ReduceMax ReduceSum BatchNormalization InstanceNormalization
LayerNormalization LRN Resize Upsample DepthToSpace SpaceToDepth
""".split())
INDEX_DTYPES = frozenset({"int64", "int32", "bool"})
RTOL, ATOL = 1e-3, 1e-4


@dataclass(frozen=True)
class Case:
    name: str
    model: onnx.ModelProto
    data_sets: list[tuple[list[np.ndarray], list[np.ndarray]]]

    @property
    def operators(self) -> list[str]:
        return sorted({node.op_type for node in self.model.graph.node})


def _in_scope(case: object) -> bool:
    model = case.model  # type: ignore[attr-defined]
    if {node.op_type for node in model.graph.node} - OPERATORS:
        return False
    dtypes = {str(np.asarray(a).dtype) for inputs, outputs in case.data_sets  # type: ignore
              for a in (*inputs, *outputs)}
    return "float32" in dtypes and dtypes <= INDEX_DTYPES | {"float32"}


def collect() -> list[Case]:
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"):  # some generators divide by zero on purpose
        cases = collect_testcases()
    return [Case(c.name, c.model, [(list(i), list(o)) for i, o in c.data_sets])
            for c in cases if c.kind == "node" and _in_scope(c)]


def _graph_inputs(model: onnx.ModelProto) -> list[str]:
    initialized = {init.name for init in model.graph.initializer}
    return [info.name for info in model.graph.input if info.name not in initialized]


def run(case: Case, device: Device) -> str | None:
    """None when every data set matches, else why not (one line)."""
    names = _graph_inputs(case.model)
    for inputs, expected in case.data_sets:
        feeds = dict(zip(names, inputs))
        bound = {k: v for k, v in feeds.items() if np.asarray(v).dtype != np.float32}
        try:
            try:
                graph = import_onnx(case.model, constants=bound)
            except FrontendError as err:
                if not err.needs_constant:
                    raise
                bound.update({k: feeds[k] for k in err.needs_constant})
                graph = import_onnx(case.model, constants=bound)
            module = build(graph, device=device)
            got = module.run({k: v for k, v in feeds.items() if k not in bound})
        except Exception as err:  # noqa: BLE001  (any failure is this case's result)
            return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if len(got) != len(expected):
            return f"{len(got)} outputs, expected {len(expected)}"
        for k, (g, e) in enumerate(zip(got, expected)):
            e = np.asarray(e)
            if g.shape != e.shape:
                return f"output {k}: shape {list(g.shape)}, expected {list(e.shape)}"
            if e.dtype.kind in "biu" and not np.array_equal(g.astype(e.dtype), e):
                return f"output {k}: {np.sum(g != e)} of {e.size} values differ"
            if e.dtype.kind == "f" and not np.allclose(g, e, rtol=RTOL, atol=ATOL,
                                                        equal_nan=True):
                worst = float(np.nanmax(np.abs(g.astype(np.float64) - e)))
                return f"output {k}: max abs error {worst:.3g}"
    return None


@dataclass
class Tally:
    passed: int = 0
    total: int = 0


def per_operator(cases: list[Case], failures: dict[str, str]) -> dict[str, Tally]:
    """Pass counts per operator (a case counts for every operator it uses)."""
    table: dict[str, Tally] = collections.defaultdict(Tally)
    for case in cases:
        for op in case.operators:
            table[op].total += 1
            table[op].passed += case.name not in failures
    return dict(sorted(table.items()))


def table_lines(table: dict[str, Tally]) -> Iterator[str]:
    yield "| operator | passed | cases |"
    yield "|---|---|---|"
    for op, tally in table.items():
        yield f"| {op} | {tally.passed} | {tally.total} |"

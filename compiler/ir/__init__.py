"""The compiler's IR: a typed dataflow graph with Relay-named ops, a printer and a
numpy interpreter."""

from compiler.ir.graph import CONST, INPUT, Graph, GraphBuilder, IRError, Node, rewrite
from compiler.ir.interpreter import bind_inputs, evaluate
from compiler.ir.ops import OPS, OpDef, get_op
from compiler.ir.printer import print_graph
from compiler.ir.types import TensorType

__all__ = [
    "CONST",
    "INPUT",
    "OPS",
    "Graph",
    "GraphBuilder",
    "IRError",
    "Node",
    "OpDef",
    "TensorType",
    "bind_inputs",
    "evaluate",
    "get_op",
    "print_graph",
    "rewrite",
]

"""Graph passes, each a function Graph -> Graph; ``optimize`` runs the standard pipeline."""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Graph
from compiler.passes.dead_code import eliminate_dead_code
from compiler.passes.fold_batch_norm import fold_batch_norm
from compiler.passes.fold_constant import fold_constant
from compiler.passes.fuse_elementwise import fuse_elementwise
from compiler.passes.fuse_ops import fuse_ops
from compiler.passes.pool_before_conv import pool_before_conv

Pass = Callable[[Graph], Graph]

# Constants first (ONNX weights are often computed), so batch-norm folding sees constant
# parameters; average pools moved before the 1x1 convs they read, before fusion turns
# those convs into fused ones; fusion last, over the simplified graph (conv/dense
# epilogues before element-wise chains); DCE drops what the rewrites left.
PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("fold_constant", fold_constant),
    ("fold_batch_norm", fold_batch_norm),
    ("pool_before_conv", pool_before_conv),
    ("fuse_ops", fuse_ops),
    ("fuse_elementwise", fuse_elementwise),
    ("eliminate_dead_code", eliminate_dead_code),
)


def optimize(graph: Graph) -> Graph:
    for _, run in PIPELINE:
        graph = run(graph)
    return graph


__all__ = ["PIPELINE", "eliminate_dead_code", "fold_batch_norm", "fold_constant",
           "fuse_elementwise", "fuse_ops", "optimize", "pool_before_conv"]

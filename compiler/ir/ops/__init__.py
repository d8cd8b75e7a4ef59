"""The operators of the IR, one module per family; importing this package registers
every one of them in ``OPS``."""

from compiler.ir.ops import elementwise, image, movement, nn, reduce  # noqa: F401  (registers)
from compiler.ir.ops.base import OPS, OpDef, check_axis, evaluate_op, get_op, register
from compiler.ir.ops.elementwise import batch_norm_scale_shift, round_half_away
from compiler.ir.ops.movement import ALIAS_OPS
from compiler.ir.ops.nn import apply_epilogue, conv2d_out_hw, node_epilogue, pool_out

__all__ = [
    "ALIAS_OPS",
    "OPS",
    "OpDef",
    "apply_epilogue",
    "batch_norm_scale_shift",
    "check_axis",
    "conv2d_out_hw",
    "evaluate_op",
    "get_op",
    "node_epilogue",
    "pool_out",
    "register",
    "round_half_away",
]

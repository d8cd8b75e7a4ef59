"""Each graph pass on small graphs: the numpy output before and after must agree, and
the rewrite must have happened (or, where it must not, not happened)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir import Graph, GraphBuilder, IRError, Node, evaluate, print_graph
from compiler.passes import (
    eliminate_dead_code,
    fold_batch_norm,
    fold_constant,
    fuse_elementwise,
    fuse_ops,
    optimize,
    pool_before_conv,
)

RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, size=shape).astype(np.float32)


def ops(graph: Graph) -> list[str]:
    live = graph.live()
    return [n.op for n in graph.ops() if id(n) in live]


def same_outputs(before: Graph, after: Graph, *inputs: np.ndarray) -> None:
    for want, got in zip(evaluate(before, list(inputs)), evaluate(after, list(inputs))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def bn_params(b: GraphBuilder, channels: int) -> list[Node]:
    return [b.const(rand(channels) + 1.5 * (name in "gv"), name) for name in "gbmv"]


def conv(b: GraphBuilder, x: Node, cin: int, cout: int, k: int = 3, **attrs: object) -> Node:
    pad = k // 2
    return b.call("nn.conv2d", [x, b.const(rand(cout, cin, k, k))],
                  padding=(pad, pad, pad, pad), **attrs)


def test_fold_constant_folds_computed_weights_and_keeps_data_ops() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 3, 6, 6))
    w = b.call("transpose", [b.const(rand(3, 3, 3, 4))], axes=(3, 2, 0, 1))
    filled = b.call("full", [], shape=(4,), fill_value=0.5)
    y = b.call("nn.bias_add", [b.call("nn.conv2d", [x, w], padding=(1, 1, 1, 1)), filled])
    graph = b.finish([y])
    folded = fold_constant(graph)
    assert ops(folded) == ["nn.conv2d", "nn.bias_add"]
    assert folded.outputs[0].inputs[1].is_const
    same_outputs(graph, folded, rand(1, 3, 6, 6))


def test_conv_bias_batch_norm_folds_into_weights_and_bias() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 7, 7))
    c = b.call("nn.bias_add", [conv(b, x, 4, 8), b.const(rand(8))])
    graph = b.finish([b.call("nn.batch_norm", [c, *bn_params(b, 8)], epsilon=1e-3)])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert ops(folded) == ["nn.conv2d", "nn.bias_add"]
    same_outputs(graph, folded, rand(1, 4, 7, 7))


def test_dense_batch_norm_folds_without_a_bias() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 16))
    d = b.call("nn.dense", [x, b.const(rand(5, 16))])
    graph = b.finish([b.call("nn.batch_norm", [d, *bn_params(b, 5)])])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert ops(folded) == ["nn.dense", "nn.bias_add"]
    same_outputs(graph, folded, rand(2, 16))


def test_batch_norm_that_cannot_fold_becomes_scale_and_shift() -> None:
    # DenseNet's pre-activation order: BN reads the block input, not a conv
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 5))
    bn = b.call("nn.batch_norm", [x, *bn_params(b, 6)])
    graph = b.finish([conv(b, b.call("nn.relu", [bn]), 6, 4)])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert "nn.batch_norm" not in ops(folded)
    assert ops(folded)[:2] == ["multiply", "nn.bias_add"]
    same_outputs(graph, folded, rand(1, 6, 5, 5))


def test_repeated_scale_and_shift_fold_to_one_bias() -> None:
    # DenseNet: conv -> batch-norm -> Mul(scale) -> Add(shift), all per channel
    b = GraphBuilder()
    x = b.input("x", (1, 3, 6, 6))
    bn = b.call("nn.batch_norm", [conv(b, x, 3, 5), *bn_params(b, 5)])
    scaled = b.call("multiply", [bn, b.const(rand(5, 1, 1))])
    graph = b.finish([b.call("nn.relu", [b.call("add", [scaled, b.const(rand(5, 1, 1))])])])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert ops(folded) == ["nn.conv2d", "nn.bias_add", "nn.relu"]
    same_outputs(graph, folded, rand(1, 3, 6, 6))


def test_pre_activation_scale_and_shift_pairs_merge() -> None:
    # DenseNet's pre-activation: BN then an explicit Mul and Add, with no conv before
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 5))
    bn = b.call("nn.batch_norm", [x, *bn_params(b, 6)])
    scaled = b.call("multiply", [bn, b.const(rand(6, 1, 1))])
    shifted = b.call("add", [scaled, b.const(rand(6, 1, 1))])
    graph = b.finish([conv(b, b.call("nn.relu", [shifted]), 6, 4)])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert ops(folded) == ["multiply", "nn.bias_add", "nn.relu", "nn.conv2d"]
    same_outputs(graph, folded, rand(1, 6, 5, 5))


def test_scale_of_a_conv_read_twice_is_not_folded() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 3, 5, 5))
    c = conv(b, x, 3, 3)
    scaled = b.call("multiply", [c, b.const(rand(3, 1, 1))])
    graph = b.finish([b.call("add", [scaled, c])])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert "multiply" in ops(folded)
    same_outputs(graph, folded, rand(1, 3, 5, 5))


def test_scale_after_a_bias_on_another_axis_is_not_folded() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 4))
    biased = b.call("nn.bias_add", [conv(b, x, 4, 4, k=1), b.const(rand(4))], axis=2)
    graph = b.finish([b.call("multiply", [biased, b.const(rand(1, 4, 1, 1))])])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert "multiply" in ops(folded)
    same_outputs(graph, folded, rand(1, 4, 4, 4))


def test_non_per_channel_multiply_is_left_alone() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 3, 5, 5))
    graph = b.finish([b.call("multiply", [conv(b, x, 3, 3), b.const(rand(1, 3, 5, 5))])])
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert ops(folded) == ["nn.conv2d", "multiply"]
    same_outputs(graph, folded, rand(1, 3, 5, 5))


def test_fuse_conv_bias_relu_and_residual_add() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 8, 6, 6))
    shortcut = b.call("nn.relu", [x])
    c = b.call("nn.bias_add", [conv(b, shortcut, 8, 8), b.const(rand(8))])
    y = b.call("nn.relu", [b.call("add", [shortcut, b.call("nn.relu", [c])])])
    graph = b.finish([y])
    fused = eliminate_dead_code(fuse_ops(graph))
    assert ops(fused) == ["nn.relu", "fused.conv2d"]
    (kernel,) = [n for n in fused.ops() if n.op == "fused.conv2d"]
    assert kernel.attr("epilogue") == ("bias", "relu", "add", "relu")
    assert kernel.inputs[3] is fused.ops()[0]  # the residual is the shortcut
    same_outputs(graph, fused, rand(1, 8, 6, 6))


def test_two_branches_meeting_in_one_add_fuse_both() -> None:
    # ResNet's projection block: shortcut conv + bn and main conv + bn meet in one add
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6))
    shortcut = b.call("nn.bias_add", [conv(b, x, 4, 8, k=1), b.const(rand(8))])
    main = b.call("nn.bias_add", [conv(b, x, 4, 8), b.const(rand(8))])
    graph = b.finish([b.call("nn.relu", [b.call("add", [main, shortcut])])])
    fused = eliminate_dead_code(fuse_ops(graph))
    assert ops(fused) == ["fused.conv2d", "fused.conv2d"]
    assert sorted(n.attr("epilogue") for n in fused.ops()) == [("bias",),
                                                               ("bias", "add", "relu")]
    same_outputs(graph, fused, rand(1, 4, 6, 6))


def test_fusion_stops_at_a_value_read_twice_or_returned() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 5))
    c = b.call("nn.bias_add", [conv(b, x, 4, 4), b.const(rand(4))])
    relu = b.call("nn.relu", [c])
    sig = b.call("sigmoid", [relu])
    graph = b.finish([b.call("add", [sig, relu]), c])
    fused = eliminate_dead_code(fuse_ops(graph))
    # c is a graph output: the chain ends there; relu and the add stay separate
    assert ops(fused) == ["fused.conv2d", "nn.relu", "sigmoid", "add"]
    assert fused.outputs[1].attr("epilogue") == ("bias",)
    same_outputs(graph, fused, rand(1, 4, 5, 5))


def test_fuse_dense_with_bias() -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 10))
    d = b.call("nn.bias_add", [b.call("nn.dense", [x, b.const(rand(4, 10))]), b.const(rand(4))])
    graph = b.finish([b.call("nn.softmax", [b.call("nn.relu", [d])], axis=1)])
    fused = eliminate_dead_code(fuse_ops(graph))
    assert ops(fused) == ["fused.dense", "nn.softmax"]
    same_outputs(graph, fused, rand(3, 10))


def test_dead_code_elimination_keeps_inputs_and_what_outputs_need() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    unused_input = b.input("unused", (4,))
    b.call("sigmoid", [x])  # dead
    y = b.call("nn.relu", [x])
    graph = b.finish([y])
    clean = eliminate_dead_code(graph)
    assert [n.op for n in clean.nodes] == ["input", "input", "nn.relu"]
    assert clean.inputs == [x, unused_input]
    same_outputs(graph, clean, rand(2, 3), rand(4))


@pytest.mark.parametrize("with_bias", [True, False])
def test_optimize_pipeline_on_a_small_residual_network(with_bias: bool) -> None:
    b = GraphBuilder()
    x = b.input("data", (1, 3, 10, 10))
    w = b.call("transpose", [b.const(rand(3, 3, 3, 8))], axes=(3, 2, 0, 1))
    c = b.call("nn.conv2d", [x, w], padding=(1, 1, 1, 1))
    if with_bias:
        c = b.call("nn.bias_add", [c, b.const(rand(8))])
    r = b.call("nn.relu", [b.call("nn.batch_norm", [c, *bn_params(b, 8)])])
    c2 = b.call("nn.batch_norm", [conv(b, r, 8, 8, k=1), *bn_params(b, 8)])
    r2 = b.call("nn.relu", [b.call("add", [c2, r])])
    pooled = b.call("nn.batch_flatten", [b.call("nn.global_avg_pool2d", [r2])])
    logits = b.call("add", [b.call("nn.dense", [pooled, b.const(rand(5, 8))]), b.const(rand(5))])
    graph = b.finish([b.call("nn.softmax", [logits], axis=1)])
    best = optimize(graph)
    assert ops(best) == ["fused.conv2d", "fused.conv2d", "nn.global_avg_pool2d",
                         "nn.batch_flatten", "fused.dense", "nn.softmax"]
    assert [n.attr("epilogue") for n in best.ops() if n.op.startswith("fused")] == [
        ("bias", "relu"), ("bias", "add", "relu"), ("bias",)]
    assert len(best.nodes) < len(graph.nodes)
    same_outputs(graph, best, rand(1, 3, 10, 10))
    text = print_graph(best)
    assert "fused.conv2d(%data" in text and "# ty=Tensor[(1, 8, 10, 10), float32]" in text


def test_elementwise_chain_fuses_into_one_kernel_op() -> None:
    # DenseNet after batch-norm folding: scale, shift, relu on the block input
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 5))
    scaled = b.call("multiply", [b.const(rand(6, 1, 1)), x])
    shifted = b.call("nn.bias_add", [scaled, b.const(rand(6))])
    act = b.call("nn.relu", [b.call("subtract", [shifted, b.const(rand(1))])])
    graph = b.finish([conv(b, act, 6, 4)])
    fused = eliminate_dead_code(fuse_elementwise(graph))
    assert ops(fused) == ["fused.elementwise", "nn.conv2d"]
    chain = fused.ops()[0].attr("chain")
    assert [op for op, _, _ in chain] == ["multiply", "nn.bias_add", "subtract", "nn.relu"]
    same_outputs(graph, fused, rand(1, 6, 5, 5))


def test_elementwise_chain_stops_at_broadcasts_order_and_shared_values() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    y = b.input("y", (4, 2, 3))
    relu = b.call("nn.relu", [x])
    grown = b.call("add", [relu, y])  # broadcasting grows the value: not in the chain
    flipped = b.call("subtract", [b.const(rand(2, 3)), relu])  # running value on the right
    graph = b.finish([grown, b.call("sigmoid", [flipped])])
    fused = eliminate_dead_code(fuse_elementwise(graph))
    assert ops(fused) == ["nn.relu", "add", "subtract", "sigmoid"]
    same_outputs(graph, fused, rand(2, 3), rand(4, 2, 3))


def test_elementwise_chain_gives_each_step_its_own_operand() -> None:
    # one vector as a channel bias and as a numpy-broadcast addend: two broadcasts
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 4))
    v = b.const(rand(4))
    y = b.call("add", [b.call("nn.bias_add", [b.call("nn.relu", [x]), v]), v])
    graph = b.finish([y])
    fused = eliminate_dead_code(fuse_elementwise(graph))
    (node,) = fused.ops()
    assert [op for op, _, _ in node.attr("chain")] == ["nn.relu", "nn.bias_add", "add"]
    assert [k for _, k, _ in node.attr("chain")] == [-1, 1, 2]
    same_outputs(graph, fused, rand(1, 4, 4, 4))


def test_out_of_range_axis_is_a_type_error() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 2, 2))
    for op, args, attrs in (("concatenate", [x, x], {"axis": 5}),
                            ("nn.bias_add", [x, b.const(rand(4))], {"axis": -5}),
                            ("nn.softmax", [x], {"axis": 4})):
        with pytest.raises(IRError, match="axis .* out of range"):
            b.call(op, args, "bad", **attrs)


POOLS = [{"pool_size": (2, 2), "strides": (2, 2)},  # DenseNet's transition
         {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1),
          "count_include_pad": True},
         {"pool_size": (3, 3), "strides": (2, 2), "padding": (0, 1, 1, 0), "ceil_mode": True}]


@pytest.mark.parametrize("pool", POOLS)
def test_average_pool_moves_before_the_1x1_conv_it_reads(pool: dict[str, object]) -> None:
    # DenseNet's transition after batch-norm folding: scale, shift, relu, conv, pool;
    # padded windows (counted or not) and ceil mode's overhang average the same pixels
    # for every channel, so they move too
    b = GraphBuilder()
    x = b.input("x", (1, 6, 9, 9))
    bn = b.call("nn.relu", [b.call("nn.batch_norm", [x, *bn_params(b, 6)])])
    graph = b.finish([b.call("nn.avg_pool2d", [conv(b, bn, 6, 4, k=1)], **pool)])
    moved = eliminate_dead_code(pool_before_conv(fold_batch_norm(graph)))
    assert ops(moved)[-2:] == ["nn.avg_pool2d", "nn.conv2d"]
    same_outputs(graph, moved, rand(1, 6, 9, 9))
    assert ops(optimize(graph)) == ["fused.elementwise", "nn.avg_pool2d", "nn.conv2d"]


def test_average_pool_stays_after_convs_it_does_not_commute_with() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    pool = {"pool_size": (2, 2), "strides": (2, 2)}
    convs = [conv(b, x, 4, 4, k=3),  # a window
             conv(b, x, 4, 4, k=1, strides=(2, 2)),  # a stride
             b.call("nn.conv2d", [x, b.const(rand(4, 4, 1, 1))], padding=(1, 1, 1, 1)),
             b.call("nn.bias_add", [conv(b, x, 4, 4, k=1), b.const(rand(4))])]  # a bias
    read_twice = conv(b, x, 4, 4, k=1)
    outs = [b.call("nn.avg_pool2d", [c], **pool) for c in (*convs, read_twice)]
    graph = b.finish([*outs, read_twice])
    kept = eliminate_dead_code(pool_before_conv(graph))
    assert [n.inputs[0].op for n in kept.ops() if n.op == "nn.avg_pool2d"] == [
        "nn.conv2d", "nn.conv2d", "nn.conv2d", "nn.bias_add", "nn.conv2d"]

"""int8 quantization with TVM v0.5's qconfig: the rewritten IR, its numpy semantics, the
fusion of each int8 conv's requantize steps into one kernel, and the CLI flags."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from compiler.ir import Graph, GraphBuilder, print_graph
from compiler.ir.interpreter import evaluate
from compiler.passes import optimize
from compiler.passes.quantize import QConfig, QuantizeError, quantize


def small_net(seed: int = 0, first_channels: int = 4) -> Graph:
    """conv+bias+relu, conv+bias+relu, conv+bias + residual add + relu, pool, dense."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, first_channels, 8, 8))

    def conv(data, ci: int, co: int, name: str):
        w = b.const(rng.normal(0, 0.3, (co, ci, 3, 3)).astype(np.float32), f"{name}.w")
        c = b.call("nn.conv2d", [data, w], name, padding=(1, 1, 1, 1))
        bias = b.const(rng.normal(0, 0.1, co).astype(np.float32), f"{name}.b")
        return b.call("nn.bias_add", [c, bias])

    c0 = b.call("nn.relu", [conv(x, first_channels, 8, "c0")])
    c1 = b.call("nn.relu", [conv(c0, 8, 8, "c1")])
    added = b.call("nn.relu", [b.call("add", [conv(c1, 8, 8, "c2"), c1])])
    pooled = b.call("nn.batch_flatten", [b.call("nn.global_avg_pool2d", [added])])
    dense = b.call("nn.dense", [pooled, b.const(rng.normal(0, 0.3, (5, 8)).astype(np.float32))])
    return b.finish([dense])


def ops(graph: Graph) -> Counter[str]:
    live = graph.live()
    return Counter(n.op for n in graph.nodes if id(n) in live)


def test_qconfig_has_tvm_v05_names_and_defaults() -> None:
    cfg = QConfig()
    assert (cfg.nbit_input, cfg.nbit_weight, cfg.nbit_activation) == (8, 8, 32)
    assert (cfg.dtype_input, cfg.dtype_weight, cfg.dtype_activation) == ("int8", "int8", "int32")
    assert cfg.global_scale == 8.0 and cfg.skip_k_conv == 1
    assert cfg.round_for_shift is True and cfg.store_lowbit_output is True
    assert cfg.input_scale == 8.0 / 128


def test_qconfig_from_pairs_parses_types_and_names_bad_keys() -> None:
    cfg = QConfig.from_pairs(["global_scale=4", "skip_k_conv=0", "round_for_shift=false",
                              "store_lowbit_output=False"])
    assert (cfg.global_scale, cfg.skip_k_conv) == (4.0, 0)
    assert not cfg.round_for_shift and not cfg.store_lowbit_output
    with pytest.raises(QuantizeError, match="nbits"):
        QConfig.from_pairs(["nbits=8"])
    with pytest.raises(QuantizeError, match="global_scale"):
        QConfig.from_pairs(["global_scale=big"])
    with pytest.raises(QuantizeError, match="global_scale"):
        QConfig(global_scale=0)
    with pytest.raises(QuantizeError, match="dtype_input"):
        QConfig(dtype_input="int4")
    with pytest.raises(QuantizeError, match="nbit_activation"):
        QConfig(nbit_activation=16)


def test_rewrite_puts_multiply_round_clip_cast_right_shift_around_int8_convs() -> None:
    q = quantize(small_net())
    counts = ops(q)
    convs = [n for n in q.nodes if n.op == "nn.conv2d" and id(n) in q.live()]
    # skip_k_conv=1: the first conv stays float; the other two take int8, give int32
    assert [c.ty.dtype for c in convs] == ["float32", "int32", "int32"]
    assert all(c.inputs[0].ty.dtype == c.inputs[1].ty.dtype == "int8" for c in convs[1:])
    assert all(c.attr("out_dtype") == "int32" for c in convs[1:])
    for op in ("multiply", "round", "clip", "cast", "right_shift"):
        assert counts[op] >= 1, op
    text = print_graph(q)
    assert 'out_dtype="int32"' in text and "right_shift(" in text and 'dtype="int8"' in text
    # the graph's output is float again (dequantized before the float pool and dense)
    assert q.outputs[0].ty.dtype == "float32"


def test_weights_use_power_of_two_scales_and_clip_to_127() -> None:
    g = small_net()
    q = quantize(g)
    int8_weights = [n for n in q.nodes if n.is_const and n.ty.dtype == "int8"]
    assert len(int8_weights) == 2
    for w in int8_weights:
        assert np.abs(w.value.astype(np.int32)).max() <= 127
        # max|w| / scale lands in (64, 128] for a power-of-two scale 2^ceil(log2 max) / 128
        assert np.abs(w.value.astype(np.int32)).max() > 63


def test_quantized_output_tracks_float_and_skip_k_conv_counts() -> None:
    g = small_net()
    x = np.random.default_rng(1).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
    ref = evaluate(g, [x])[0]
    got = evaluate(quantize(g), [x])[0]
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert 0 < rel < 0.05, rel
    none_skipped = quantize(g, QConfig(skip_k_conv=0))
    # the 4-channel first conv quantizes too once it is not skipped
    assert ops(none_skipped)["right_shift"] == ops(quantize(g))["right_shift"] + 1
    convs = [n for n in none_skipped.nodes if n.op == "nn.conv2d" and id(n) in
             none_skipped.live()]
    assert all(c.ty.dtype == "int32" for c in convs)


def test_convs_with_channels_not_a_multiple_of_four_stay_float() -> None:
    q = quantize(small_net(first_channels=3), QConfig(skip_k_conv=0))
    convs = [n for n in q.nodes if n.op == "nn.conv2d" and id(n) in q.live()]
    assert [c.ty.dtype for c in convs] == ["float32", "int32", "int32"]


def test_fusion_folds_requantize_into_int8_kernels_exactly() -> None:
    g = small_net()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
    q = quantize(g)
    fused = optimize(q)
    int_convs = [n for n in fused.nodes if n.op == "fused.conv2d" and id(n) in fused.live()
                 and n.attr("out_dtype") == "int32"]
    assert len(int_convs) == 2
    # conv + bias + relu + requantize, stored as int8
    assert int_convs[0].attr("epilogue") == ("bias", "relu", "shift")
    assert int_convs[0].ty.dtype == "int8"
    # conv + bias + shift to the residual's scale + int8 residual + relu, stored as int8
    assert int_convs[1].attr("epilogue") == ("bias", "shift", "add", "relu")
    assert int_convs[1].inputs[-1].ty.dtype == "int8"
    assert ops(fused)["right_shift"] == 0
    np.testing.assert_array_equal(evaluate(fused, [x])[0], evaluate(q, [x])[0])


def test_store_lowbit_output_off_keeps_int32_between_layers() -> None:
    g = small_net()
    x = np.random.default_rng(3).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
    low = quantize(g)
    wide = quantize(g, QConfig(store_lowbit_output=False))
    fused = optimize(wide)
    stored = [n.ty.dtype for n in fused.nodes if n.op == "fused.conv2d" and id(n) in
              fused.live() and n.attr("out_dtype") == "int32"]
    assert "int32" in stored  # the block output the residual add reads stays int32
    # same arithmetic up to where int8 rounding happens: close, not necessarily equal
    a, b = evaluate(low, [x])[0], evaluate(wide, [x])[0]
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()
    np.testing.assert_array_equal(evaluate(fused, [x])[0], b)


def test_round_for_shift_off_floors_instead_of_rounding() -> None:
    """TVM's round_for_shift=False still shifts, without the rounding bias."""
    on, off = quantize(small_net()), quantize(small_net(), QConfig(round_for_shift=False))
    assert ops(off)["right_shift"] == ops(on)["right_shift"] >= 2
    assert ops(off)["add"] == ops(on)["add"] - ops(on)["right_shift"]  # no "+ 2**(k-1)"
    x = np.random.default_rng(4).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
    ref = evaluate(small_net(), [x])[0]
    assert np.abs(evaluate(off, [x])[0] - ref).max() < 0.05 * np.abs(ref).max()


def test_two_int32_values_add_at_the_finer_scale_exactly() -> None:
    """A projection shortcut: the coarser accumulator is shifted left (exact) so the sum
    is rounded once, when it is requantized; the whole block still fuses."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 6, 6))
    first = b.call("nn.relu", [b.call("nn.conv2d", [x, b.const(
        rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32))], padding=(1, 1, 1, 1))])
    main = b.call("nn.conv2d", [first, b.const(
        rng.normal(0, 0.05, (8, 8, 3, 3)).astype(np.float32))], padding=(1, 1, 1, 1))
    short = b.call("nn.conv2d", [first, b.const(
        rng.normal(0, 0.5, (8, 8, 1, 1)).astype(np.float32))])
    out = b.call("nn.relu", [b.call("add", [main, short])])
    q = quantize(b.finish([b.call("nn.global_avg_pool2d", [out])]))
    added = next(n for n in q.nodes if n.op == "add" and n.inputs[0].op != "right_shift"
                 and n.inputs[1].op in ("multiply", "nn.conv2d"))
    assert {a.op for a in added.inputs} == {"nn.conv2d", "multiply"}  # one side << k
    fused = optimize(q)
    int8 = [n for n in fused.nodes if n.op == "fused.conv2d" and n.attr("out_dtype") == "int32"
            and id(n) in fused.live()]
    assert any(n.attr("epilogue") == ("add", "relu", "shift") for n in int8)


def test_ir_round_and_integer_clip_match_c() -> None:
    from compiler.ir.ops import evaluate_op

    x = np.array([0.49999997, -0.49999997, 0.5, -0.5, 2.5, 8388609.0], np.float32)
    np.testing.assert_array_equal(evaluate_op("round", [x], {}),
                                  [0.0, -0.0, 1.0, -1.0, 3.0, 8388609.0])
    ints = np.array([0, 2, 5], np.int32)
    np.testing.assert_array_equal(evaluate_op("clip", [ints], {"a_min": 0.5, "a_max": 3.7}),
                                  [1, 2, 3])


def test_tiny_weights_keep_their_conv_float() -> None:
    g = small_net()
    rewritten = quantize(g)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    c = b.call("nn.conv2d", [x, b.const(np.full((8, 4, 3, 3), 3e-9, np.float32))])
    tiny = quantize(b.finish([b.call("nn.conv2d", [c, b.const(
        np.full((8, 8, 1, 1), 3e-9, np.float32))])]))
    assert all(n.ty.dtype == "float32" for n in tiny.nodes if n.op == "nn.conv2d")
    assert ops(rewritten)["right_shift"] >= 2


def requantize_chain() -> Graph:
    """The realize steps alone, on no conv: quantize, widen, round-shift, clip, dequantize."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5, 7))
    q = b.call("cast", [b.call("clip", [b.call("round", [b.call("multiply", [
        x, b.const(np.float32(40.0))])])], a_min=-127, a_max=127)], dtype="int8")
    wide = b.call("cast", [q], dtype="int32")
    shifted = b.call("right_shift", [b.call("add", [wide, b.const(np.int32(4))]),
                                     b.const(np.int32(3))])
    relu = b.call("nn.relu", [b.call("clip", [shifted], a_min=-10, a_max=10)])
    back = b.call("multiply", [b.call("cast", [b.call("cast", [relu], dtype="int8")],
                                      dtype="float32"), b.const(np.float32(0.125))])
    return b.finish([back, q])


def test_plain_integer_kernels_match_numpy_exactly(device) -> None:  # type: ignore[no-untyped-def]
    from compiler.build_module import build

    graph = requantize_chain()
    x = np.random.default_rng(5).uniform(-4, 4, (2, 3, 5, 7)).astype(np.float32)
    x[0, 0, 0, :4] = [0.0125, -0.0125, 0.0375, 3.1875]  # x * 40 lands on .5: rounding ties
    want = evaluate(graph, [x])
    got = build(graph, device=device).run([x])
    assert got[1].dtype == np.int8 and want[1].dtype == np.int8
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_quantized_net_on_the_device_matches_numpy(device) -> None:  # type: ignore[no-untyped-def]
    """Every conv in int8 (skip_k_conv=0): input quantize, three int8 template kernels
    with fused requantize epilogues, dequantize, float pool and dense. The integer part
    is exact, so the device output equals the numpy interpreter's up to the float tail."""
    from compiler.build_module import build

    graph = quantize(small_net(), QConfig(skip_k_conv=0))
    module = build(graph, device=device)
    # three int8 layers; the two 8 -> 8 convs share one task (equal workloads)
    assert sum(len(t.layers) for t in module.tasks
               if t.template == "conv2d_nchw_int8.cuda") == 3
    int8_steps = [s for s in module.program.steps if "conv2d" in s.name]
    assert all("DP4A" in s.kernel.source for s in int8_steps)
    rng = np.random.default_rng(6)
    for _ in range(3):
        x = rng.uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
        (got,) = module.run([x])
        (want,) = evaluate(graph, [x])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_int8_elementwise_chains_wrap_like_numpy(device) -> None:  # type: ignore[no-untyped-def]
    """A fused int8 chain wraps at every step (100 + 100 -> -56, then relu -> 0)."""
    from compiler.build_module import build

    b = GraphBuilder()
    x = b.input("x", (4, 8), "int8")
    y = b.call("nn.relu", [b.call("add", [x, b.const(np.int8(100))])])
    graph = optimize(b.finish([b.call("multiply", [y, b.const(np.int8(3))])]))
    assert any(n.op == "fused.elementwise" for n in graph.nodes)
    data = np.random.default_rng(8).integers(-128, 128, (4, 8)).astype(np.int8)
    data[0, :2] = [100, 27]
    (got,) = build(graph, device=device, optimized=True).run([data])
    np.testing.assert_array_equal(got, evaluate(graph, [data])[0])

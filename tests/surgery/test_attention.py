"""The RK3566 attention form (issue #42) against a float64 numpy softmax attention: `squeeze_unit_batch` (heads at
rank 3), `softmax_as_exp_ratio` (exp as a Sigmoid ratio under each row's max or a logit bound, the row sum one more
value column) and their composition, on small self-attention graphs with MatMul+Add or Gemm projections and an
additive mask; the logits at the edges of [bound - EXP_WINDOW, bound]; the row-max shift on logits no bound holds
(far above it, rows spread wider than the window, finfo.min masks); and planted faults the reference comparison must
catch."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.core.onnx_graph import static_shapes
from rkaudio.gates.logit_bound import EXP_WINDOW, MASKED_LOGIT
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.attention import exp_ratio_attention, softmax_as_exp_ratio, squeeze_unit_batch

ROWS, HEADS, DEPTH = 6, 2, 8
CHANNELS = HEADS * DEPTH
SCALE = DEPTH ** -0.5
BOUND = 8.0
MASKED = -1.0e4  # masked_fill's value in the exporters (Piper's encoder, CosyVoice3)
# fp32 tolerances of a 16-channel projection around a softmax
RTOL, ATOL = 1e-4, 1e-5
# The exp-ratio form's, relative to the output's peak: onnxruntime's fp32 Sigmoid (1.26, MLAS) is accurate to
# 1.1e-7 absolute, not relative, so its Sigmoid(-r) / Sigmoid(r) is exp(-r) within 1.1e-3 (measured, 0 <= r <=
# EXP_WINDOW); a weighted mean of such weights within twice that.
EXP_RATIO_TOLERANCE = 2.5e-3


def attention_graph(rng, projection: str = "matmul", values_input: bool = False,
                    mask_heads: int = 1) -> tuple[onnx.ModelProto, dict]:
    """y = (softmax(Q K^T * scale + mask) V) Wo + bo on x [1, ROWS, CHANNELS], heads split as Reshape
    [1, ROWS, HEADS, DEPTH] + Transpose to [1, HEADS, ROWS, DEPTH]; projections as MatMul + Add, or as Gemm (transB)
    on x reshaped to [ROWS, CHANNELS]; with `values_input` the values are the input v [1, HEADS, ROWS, DEPTH] (no
    value projection); the additive mask is the input [1, mask_heads, ROWS, ROWS]. `projection` "gemm [1, C] bias"
    is a Gemm whose bias has a leading 1 (legal ONNX: Gemm broadcasts C to [ROWS, C])."""
    p = {name: rng.standard_normal(shape).astype(np.float32)
         for name, shape in (("wq", (CHANNELS, CHANNELS)), ("wk", (CHANNELS, CHANNELS)), ("wv", (CHANNELS, CHANNELS)),
                             ("wo", (CHANNELS, CHANNELS)), ("bq", (CHANNELS,)), ("bk", (CHANNELS,)),
                             ("bv", (CHANNELS,)), ("bo", (CHANNELS,)))}
    p = {name: value * (CHANNELS ** -0.5 if name[0] == "w" else 0.5) for name, value in p.items()}
    make, nodes = helper.make_node, []
    constants = {"scale": np.array(SCALE, np.float32), "heads_shape": np.array([1, ROWS, HEADS, DEPTH], np.int64),
                 "merged_shape": np.array([1, ROWS, CHANNELS], np.int64), "wo": p["wo"], "bo": p["bo"]}
    if projection.startswith("gemm"):
        constants["rows_shape"] = np.array([ROWS, CHANNELS], np.int64)
        nodes.append(make("Reshape", ["x", "rows_shape"], ["x_rows"]))
    for head in ("q", "k") if values_input else ("q", "k", "v"):
        if projection.startswith("gemm"):
            constants[f"w{head}_t"] = np.ascontiguousarray(p[f"w{head}"].T)
            constants[f"b{head}"] = p[f"b{head}"].reshape(1, -1) if projection.endswith("bias") else p[f"b{head}"]
            nodes.append(make("Gemm", ["x_rows", f"w{head}_t", f"b{head}"], [f"{head}_projected"], transB=1))
        else:
            constants[f"w{head}"], constants[f"b{head}"] = p[f"w{head}"], p[f"b{head}"]
            nodes += [make("MatMul", ["x", f"w{head}"], [f"{head}_unbiased"]),
                      make("Add", [f"{head}_unbiased", f"b{head}"], [f"{head}_projected"])]
        nodes += [make("Reshape", [f"{head}_projected", "heads_shape"], [f"{head}_split"]),
                  make("Transpose", [f"{head}_split"], [f"{head}_heads"],
                       perm=[0, 2, 3, 1] if head == "k" else [0, 2, 1, 3])]
    values = "v" if values_input else "v_heads"
    nodes += [make("MatMul", ["q_heads", "k_heads"], ["scores"]),
              make("Mul", ["scores", "scale"], ["scaled"]),
              make("Add", ["scaled", "mask"], ["logits"]),
              make("Softmax", ["logits"], ["weights"], axis=-1, name="attention_softmax"),
              make("MatMul", ["weights", values], ["attended"]),
              make("Transpose", ["attended"], ["attended_rows"], perm=[0, 2, 1, 3]),
              make("Reshape", ["attended_rows", "merged_shape"], ["merged"]),
              make("MatMul", ["merged", "wo"], ["out_unbiased"]),
              make("Add", ["out_unbiased", "bo"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, CHANNELS]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, mask_heads, ROWS, ROWS])]
    if values_input:
        inputs.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, HEADS, ROWS, DEPTH]))
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ROWS, CHANNELS])],
                              [numpy_helper.from_array(value, name) for name, value in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, p


def heads(p: dict, feeds: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, k, v) [HEADS, ROWS, DEPTH] in float64."""
    x = feeds["x"][0].astype(np.float64)

    def split(name):
        projected = x @ p[f"w{name}"].astype(np.float64) + p[f"b{name}"].astype(np.float64)
        return projected.reshape(ROWS, HEADS, DEPTH).transpose(1, 0, 2)

    v = feeds["v"][0].astype(np.float64) if "v" in feeds else split("v")
    return split("q"), split("k"), v


def reference_logits(p: dict, feeds: dict) -> np.ndarray:
    """Q K^T * scale + mask, [HEADS, ROWS, ROWS] in float64."""
    q, k, _ = heads(p, feeds)
    return q @ k.transpose(0, 2, 1) * SCALE + feeds["mask"][0].astype(np.float64)


def reference(p: dict, feeds: dict, empty_rows_zero: bool) -> np.ndarray:
    """Standard softmax attention in float64, y [1, ROWS, CHANNELS]. A query row whose keys are all masked is
    softmax over its masked logits (the exporter's graph; fp32 keeps 3 decimals of a logit near -1e4, so compare
    it with `open_rows`), or attends to nothing (0) with `empty_rows_zero`: the exp-ratio form's stated output."""
    logits = reference_logits(p, feeds)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    attended = weights @ heads(p, feeds)[2]
    if empty_rows_zero:
        attended[logits.max(axis=-1) < MASKED_LOGIT] = 0.0
    merged = attended.transpose(1, 0, 2).reshape(ROWS, CHANNELS)
    return (merged @ p["wo"].astype(np.float64) + p["bo"].astype(np.float64))[None]


def feeds_for(rng, values_input: bool = False, mask_heads: int = 1) -> dict:
    """x, a causal mask (-1e4 above the diagonal) with its last query row fully masked, and v when it is an input."""
    mask = np.where(np.triu(np.ones((ROWS, ROWS)), 1) > 0, MASKED, 0.0)
    mask[-1] = MASKED
    feeds = {"x": rng.standard_normal((1, ROWS, CHANNELS)).astype(np.float32),
             "mask": np.broadcast_to(mask, (1, mask_heads, ROWS, ROWS)).astype(np.float32)}
    if values_input:
        feeds["v"] = rng.standard_normal((1, HEADS, ROWS, DEPTH)).astype(np.float32)
    return feeds


def open_rows(y: np.ndarray) -> np.ndarray:
    """The query rows of y with an unmasked key (every one but the last, `feeds_for`)."""
    return y[:, :-1]


def assert_exp_ratio_close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=EXP_RATIO_TOLERANCE * np.abs(want).max())


def run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return OnnxBackend(model, threads=1).run(feeds)["y"]


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


@pytest.mark.parametrize("projection", ["matmul", "gemm", "gemm [1, C] bias"])
def test_passes_match_float64_softmax_attention(projection):
    rng = np.random.default_rng(0)
    model, p = attention_graph(rng, projection)
    feeds = feeds_for(rng)
    want = open_rows(reference(p, feeds, False))
    np.testing.assert_allclose(open_rows(run(model, feeds)), want, rtol=RTOL, atol=ATOL)

    squeezed = squeeze_unit_batch(model)
    onnx.checker.check_model(squeezed)
    np.testing.assert_allclose(open_rows(run(squeezed, feeds)), want, rtol=RTOL, atol=ATOL)
    shapes = static_shapes(squeezed)
    rank4 = sorted(out for node in squeezed.graph.node for out in node.output if len(shapes[out]) == 4)
    assert rank4 == []  # the mask input enters through one Reshape to [1, ROWS, ROWS]
    assert ops(squeezed).count("Softmax") == 1

    for rewritten in (softmax_as_exp_ratio(model, BOUND), exp_ratio_attention(model, BOUND)):
        onnx.checker.check_model(rewritten)
        assert "Softmax" not in ops(rewritten)
        got = run(rewritten, feeds)
        assert_exp_ratio_close(got, reference(p, feeds, True))
        # the fully masked last row attends to nothing: finite, the output bias alone
        np.testing.assert_allclose(got[0, -1], p["bo"], rtol=0, atol=1e-6)

    # At rank 3 the values are a head split of x @ W + b: the ones column is one more output column of the value
    # projection, a per-head [HEADS, CHANNELS, width] MatMul, width depth + 1 padded to a multiple of 8; no Concat.
    folded = exp_ratio_attention(model, BOUND)
    assert "Concat" not in ops(folded)
    value_heads = {init.name: numpy_helper.to_array(init) for init in folded.graph.initializer}
    widened = [value for name, value in value_heads.items() if name.endswith("value_weights_and_zeros")]
    assert len(widened) == 1 and widened[0].shape == (HEADS, CHANNELS, 16)
    assert not {"Softmax", "Exp", "ReduceMax"} & set(ops(folded))
    shapes = static_shapes(folded)
    assert all(len(shapes[out]) <= 3 for node in folded.graph.node for out in node.output)
    # Alone, on the rank-4 graph, softmax_as_exp_ratio falls back to a Concat (the fold reads rank-3 head splits).
    assert ops(softmax_as_exp_ratio(model, BOUND)).count("Concat") == 1


def test_values_from_an_input_take_a_concat_ones_column():
    rng = np.random.default_rng(1)
    model, p = attention_graph(rng, values_input=True)
    feeds = feeds_for(rng, values_input=True)
    rewritten = exp_ratio_attention(model, BOUND)
    onnx.checker.check_model(rewritten)
    assert ops(rewritten).count("Concat") == 1 and "Softmax" not in ops(rewritten)
    assert_exp_ratio_close(run(rewritten, feeds), reference(p, feeds, True))
    np.testing.assert_allclose(open_rows(run(squeeze_unit_batch(model), feeds)), open_rows(reference(p, feeds, False)),
                               rtol=RTOL, atol=ATOL)


def bounded_feeds(rng, p: dict, row_maxima: np.ndarray) -> dict:
    """Feeds whose logits have, per head and query row, the largest value row_maxima [HEADS, ROWS] (the mask shifts
    each row; its masked entries stay -1e4 under the shift); the last row fully masked."""
    feeds = feeds_for(rng, mask_heads=HEADS)
    feeds["mask"] = np.zeros_like(feeds["mask"])
    raw = reference_logits(p, feeds)
    causal = np.triu(np.ones((ROWS, ROWS)), 1) > 0
    shift = row_maxima - np.where(causal, -np.inf, raw).max(axis=-1)
    mask = np.where(causal, MASKED, shift[..., None])
    mask[:, -1] = MASKED
    feeds["mask"] = mask[None].astype(np.float32)
    return feeds


def test_logits_at_the_bound_and_at_the_window_floor_match():
    rng = np.random.default_rng(2)
    model, p = attention_graph(rng, mask_heads=HEADS)
    rewritten = exp_ratio_attention(model, BOUND)
    row_maxima = np.full((HEADS, ROWS), BOUND - 1.0)
    row_maxima[0, 1] = BOUND  # the largest logit is the bound itself
    row_maxima[1, :3] = BOUND - EXP_WINDOW + 0.05  # just inside the window: the row sum stays above its floor
    feeds = bounded_feeds(rng, p, row_maxima)
    logits = reference_logits(p, feeds)
    assert logits.max() == pytest.approx(BOUND)
    assert logits[1, :3].max(axis=-1) == pytest.approx(np.full(3, BOUND - EXP_WINDOW + 0.05))
    got = run(rewritten, feeds)
    assert np.all(np.isfinite(got))
    assert_exp_ratio_close(got, reference(p, feeds, True))
    np.testing.assert_allclose(got[0, -1], p["bo"], rtol=0, atol=1e-6)


def assert_departs(model: onnx.ModelProto, p: dict, feeds: dict) -> None:
    """The reference comparison fails on `model`."""
    with pytest.raises(AssertionError):
        assert_exp_ratio_close(run(model, feeds), reference(p, feeds, True))


def with_initializer(model: onnx.ModelProto, suffix: str, change) -> onnx.ModelProto:
    """A copy of `model` whose one initializer named *`suffix` is change(value)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    (tensor,) = [t for t in out.graph.initializer if t.name.endswith(suffix)]
    tensor.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(tensor).copy()), tensor.name))
    return out


def column_zeroed(column: int):
    """change(value) for `with_initializer`: the value with its last-axis `column` zeroed."""
    def change(value: np.ndarray) -> np.ndarray:
        value[..., column] = 0.0
        return value
    return change


def test_planted_faults_fail_the_reference_comparison():
    rng = np.random.default_rng(3)
    model, p = attention_graph(rng)
    feeds = feeds_for(rng)
    rewritten = exp_ratio_attention(model, BOUND)
    assert_exp_ratio_close(run(rewritten, feeds), reference(p, feeds, True))
    # a wrong scale constant
    assert_departs(with_initializer(rewritten, "scale", lambda value: value * 1.05), p, feeds)
    # the ones column of [V | 1] dropped: from the folded value bias, from the Concat fallback's ones
    assert_departs(with_initializer(rewritten, "value_biases_and_ones", column_zeroed(DEPTH)), p, feeds)
    values_model, values_p = attention_graph(rng, values_input=True)
    values_feeds = feeds_for(rng, values_input=True)
    concat = exp_ratio_attention(values_model, BOUND)
    assert_departs(with_initializer(concat, "/ones", column_zeroed(0)), values_p, values_feeds)
    # logits above the bound: the Relu saturates, every key above it weighs exp(0)
    multi_head, multi_p = attention_graph(np.random.default_rng(3), mask_heads=HEADS)
    above = bounded_feeds(np.random.default_rng(4), multi_p, np.full((HEADS, ROWS), BOUND + 4.0))
    assert reference_logits(multi_p, above).max() == pytest.approx(BOUND + 4.0)
    np.testing.assert_allclose(open_rows(run(multi_head, above)), open_rows(reference(multi_p, above, False)),
                               rtol=RTOL, atol=ATOL)
    assert_departs(exp_ratio_attention(multi_head, BOUND), multi_p, above)
    # a row whose largest logit sits 2 under the window: its row sum is under the floor, its output shrinks
    row_maxima = np.full((HEADS, ROWS), BOUND - 1.0)
    row_maxima[1, :3] = BOUND - EXP_WINDOW - 2.0
    assert_departs(exp_ratio_attention(multi_head, BOUND), multi_p,
                   bounded_feeds(np.random.default_rng(4), multi_p, row_maxima))


def wide_logit_feeds(rng, p: dict) -> dict:
    """Feeds whose rows' largest logits run from -20 to 40 (no bound holds them all: 60 > EXP_WINDOW), the causal
    mask at finfo(float32).min (an fp16 -inf), the last row fully masked."""
    row_maxima = np.linspace(-20.0, 40.0, HEADS * ROWS).reshape(HEADS, ROWS)
    feeds = bounded_feeds(rng, p, row_maxima)
    feeds["mask"] = np.where(feeds["mask"] == MASKED, np.finfo(np.float32).min, feeds["mask"]).astype(np.float32)
    return feeds


def test_row_max_shift_matches_float64_at_any_logit_scale():
    rng = np.random.default_rng(5)
    model, p = attention_graph(rng, mask_heads=HEADS)
    feeds = wide_logit_feeds(rng, p)
    logits = reference_logits(p, feeds)
    open_maxima = logits.max(axis=-1)[:, :-1]
    assert open_maxima.max() - open_maxima.min() > 2 * EXP_WINDOW and logits.max() > BOUND + 20
    rewritten = exp_ratio_attention(model)  # no bound: each row's max
    onnx.checker.check_model(rewritten)
    assert not {"Softmax", "Exp", "ReduceMax", "Max"} & set(ops(rewritten))
    # a tree over ROWS = 6 keys: 6 -> 3 -> 2 (overlapping halves) -> 1, one Sub/Relu/Add per level; no clamp after
    assert ops(rewritten).count("Relu") == 3
    got = run(rewritten, feeds)
    assert np.all(np.isfinite(got))
    assert_exp_ratio_close(open_rows(got), open_rows(reference(p, feeds, False)))
    # the constant-bound form cannot follow these rows
    assert_departs(exp_ratio_attention(model, BOUND), p, feeds)


def row_shifts(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    """The row-max form's shifts (each `row_max` tree's output), [HEADS, ROWS], as the rewritten graph computes them."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    (name,) = [node.output[0] for node in exposed.graph.node if node.output[0].endswith("/row_max")]
    exposed.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return OnnxBackend(exposed, threads=1).run(feeds)[name].reshape(HEADS, ROWS)


def assert_row_max_form_close(model: onnx.ModelProto, p: dict, feeds: dict) -> None:
    """The output within the exp ratio's tolerance of float64 softmax attention, and each open row's shift its
    largest logit: the ratio cancels any shift in fp32, but on the NPU's fp16 a shift under the max by more than
    EXP_WINDOW overflows (the tree's rounding at the clipped mask's -30000: under 2e-3)."""
    assert_exp_ratio_close(open_rows(run(model, feeds)), open_rows(reference(p, feeds, False)))
    np.testing.assert_allclose(open_rows(row_shifts(model, feeds)), open_rows(reference_logits(p, feeds).max(-1)),
                               rtol=0, atol=2e-3)


def test_row_max_planted_faults_fail_the_reference_comparison():
    rng = np.random.default_rng(6)
    model, p = attention_graph(rng, mask_heads=HEADS)
    feeds = wide_logit_feeds(rng, p)
    rewritten = exp_ratio_attention(model)
    assert_row_max_form_close(rewritten, p, feeds)
    for fault in (with_initializer(rewritten, "scale", lambda value: value * 1.05),
                  # the clip in front of the tree set inside the logits' range: rows above it flatten
                  with_initializer(rewritten, "logit_clip_high", lambda value: np.float32(10.0)),
                  # the tree's last level reads its lower half twice: a row whose max sits in the upper half shifts
                  # by less than its max (in fp16, past EXP_WINDOW, an overflow)
                  with_initializer(with_initializer(rewritten, "max1/upper_start", lambda value: value - 1),
                                   "max1/upper_end", lambda value: value - 1)):
        with pytest.raises(AssertionError):
            assert_row_max_form_close(fault, p, feeds)


def test_squeeze_leaves_rank4_tensors_outside_attention_alone():
    """A unit-batch rank-4 branch no activation MatMul joins (the Qwen3 step's [1, C, rows, L] row convs: squeezed,
    81 -> 88 CPU ops and a 24 MB engine on the RK3566) keeps its rank; the attention beside it runs at rank 3."""
    rng = np.random.default_rng(3)
    model, p = attention_graph(rng)
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 2, 3, 4])
    model.graph.input.append(image)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(2.0, np.float32), "gain"),
                                    numpy_helper.from_array(np.array(-1.0, np.float32), "offset")])
    model.graph.node.extend([helper.make_node("Mul", ["image", "gain"], ["image_gained"]),
                             helper.make_node("Add", ["image_gained", "offset"], ["image_shifted"]),
                             helper.make_node("Relu", ["image_shifted"], ["image_out"])])
    model.graph.output.append(helper.make_tensor_value_info("image_out", TensorProto.FLOAT, [1, 2, 3, 4]))
    feeds = {**feeds_for(rng), "image": rng.standard_normal((1, 2, 3, 4)).astype(np.float32)}
    squeezed = squeeze_unit_batch(model)
    onnx.checker.check_model(squeezed)
    got = OnnxBackend(squeezed, threads=1).run(feeds)
    np.testing.assert_allclose(got["image_out"], np.maximum(feeds["image"].astype(np.float64) * 2.0 - 1.0, 0.0),
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(open_rows(got["y"]), open_rows(reference(p, feeds, False)), rtol=RTOL, atol=ATOL)
    shapes = static_shapes(squeezed)
    rank4 = sorted(out for node in squeezed.graph.node for out in node.output if len(shapes[out]) == 4)
    assert rank4 == ["image_gained", "image_out", "image_shifted"]


# --- heads_apart ------------------------------------------------------------------------------------------------

SPLIT_HEADS, QUERIES, KEYS = 3, 10, 12


def rank3_attention() -> onnx.ModelProto:
    """y = softmax(q @ kt) @ v on rank-3 inputs q [H, T, d], kt [H, d, S], v [H, S, d]: the form the squeezed Whisper
    encoder has (its scale folded into q and k)."""
    make = helper.make_node
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in
              (("q", [SPLIT_HEADS, QUERIES, DEPTH]), ("kt", [SPLIT_HEADS, DEPTH, KEYS]),
               ("v", [SPLIT_HEADS, KEYS, DEPTH]))]
    graph = helper.make_graph(
        [make("MatMul", ["q", "kt"], ["scores"], name="Scores"), make("Softmax", ["scores"], ["weights"], axis=-1,
                                                                       name="Softmax"),
         make("MatMul", ["weights", "v"], ["y"], name="Weighted")],
        "rank3_attention", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SPLIT_HEADS, QUERIES,
                                                                                           DEPTH])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rank3_reference(feeds: dict) -> np.ndarray:
    scores = feeds["q"].astype(np.float64) @ feeds["kt"].astype(np.float64)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ feeds["v"].astype(np.float64)


def test_heads_apart_matches_float64_attention_per_head():
    from rkaudio.surgery.graph.attention import heads_apart

    rng = np.random.default_rng(7)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
             (("q", (SPLIT_HEADS, QUERIES, DEPTH)), ("kt", (SPLIT_HEADS, DEPTH, KEYS)),
              ("v", (SPLIT_HEADS, KEYS, DEPTH)))}
    model = rank3_attention()
    assert heads_apart(model, QUERIES * KEYS).graph == model.graph  # a plane within the limit stays as it is
    apart = heads_apart(model, QUERIES * KEYS - 1)
    assert ops(apart).count("Softmax") == SPLIT_HEADS and ops(apart).count("Split") == 3
    assert all(dims[0] == 1 for name, dims in static_shapes(apart).items() if "/scores" in name)
    want = rank3_reference(feeds)
    np.testing.assert_allclose(run(apart, feeds), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(run(softmax_as_exp_ratio(apart), feeds), want, rtol=0,
                               atol=EXP_RATIO_TOLERANCE * np.abs(want).max())
    planted = onnx.ModelProto()
    planted.CopyFrom(apart)
    concat = next(node for node in planted.graph.node if node.op_type == "Concat")
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]  # a slip: two heads in each other's place
    assert np.abs(run(planted, feeds) - want).max() > 100 * ATOL

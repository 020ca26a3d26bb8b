"""add_negated_broadcast: a computed subtrahend broadcast along an axis past the limit becomes Add(a, Neg(b)), exact
against a float64 numpy reference; constant, unbroadcast and short-axis Subs stay; a planted sign or operand
fault fails the same check."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from surgery.graph.broadcast_sub import add_negated_broadcast
from surgery.graph.fold import op_histogram

CHANNELS, LENGTH, LIMIT = 4, 40, 16  # the time axis (40) is past the limit, the channel axis (4) is not


def _model():
    """float64: x - its time mean (the instance norm's centring, broadcast along time), x - a constant [1, C, 1],
    x - x, and x - the channel mean (broadcast along the 4 channels only)."""
    dims = [1, CHANNELS, LENGTH]
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[2], keepdims=1),
             helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
             helper.make_node("Sub", ["x", "c"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["x", "x"], ["zero"], name="zero"),
             helper.make_node("ReduceMean", ["x"], ["across"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["x", "across"], ["channel_centred"], name="channel_centre")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, dims)
               for n in ("centred", "shifted", "zero", "channel_centred")]
    constant = numpy_helper.from_array(np.arange(CHANNELS, dtype=np.float64).reshape(1, CHANNELS, 1), "c")
    graph = helper.make_graph(nodes, "subs", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, dims)], outputs,
                              [constant])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _reference(x):
    """The four outputs in float64 numpy, written out independently of ONNX."""
    constant = np.arange(CHANNELS, dtype=np.float64).reshape(1, CHANNELS, 1)
    return [x - x.mean(axis=-1, keepdims=True), x - constant, np.zeros_like(x), x - x.mean(axis=1, keepdims=True)]


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _assert_matches_reference(model, x):
    for got, want in zip(_run(model, x), _reference(x)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((1, CHANNELS, LENGTH)) * 3 + 1


def test_only_the_long_computed_broadcast_becomes_an_add_of_its_negation_exactly(x):
    model = _model()
    rewritten = add_negated_broadcast(model, LIMIT)
    assert op_histogram(model)["Sub"] == 4
    assert op_histogram(rewritten)["Sub"] == 3 and op_histogram(rewritten)["Neg"] == 1
    add = next(n for n in rewritten.graph.node if n.op_type == "Add")
    assert list(add.output) == ["centred"] and add.input[0] == "x"
    _assert_matches_reference(rewritten, x)
    for before, after in zip(_run(model, x), _run(rewritten, x)):  # a + (-b) rounds as a - b: bit for bit
        np.testing.assert_array_equal(before, after)


def test_a_limit_past_the_axis_leaves_the_graph_alone():
    model = _model()
    assert add_negated_broadcast(model, LENGTH).graph == model.graph


@pytest.mark.parametrize("fault", ["sign dropped", "operands swapped"])
def test_the_reference_check_fails_on_a_planted_fault(x, fault):
    rewritten = add_negated_broadcast(_model(), LIMIT)
    neg = next(n for n in rewritten.graph.node if n.op_type == "Neg")
    add = next(n for n in rewritten.graph.node if n.op_type == "Add")
    if fault == "sign dropped":
        neg.op_type = "Identity"
    else:  # Add(Neg(a), b): b - a
        neg.input[0], add.input[0] = add.input[0], neg.input[0]
    with pytest.raises(AssertionError):
        _assert_matches_reference(rewritten, x)

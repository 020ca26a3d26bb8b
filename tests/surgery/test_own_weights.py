"""own_conv_weights: two ConvTranspose layers and two Conv layers that read one weight initializer each get their own
copy, and the graph computes what it did, against a float64 numpy reference of the grouped convs; a planted
off-by-one tap fails the same check."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from surgery.graph.own_weights import own_conv_weights

CHANNELS, TAPS = 4, 6  # a cache-tail selector's shape: [C*taps, 1, 1, taps], groups=C


def _selector() -> np.ndarray:
    return np.tile(np.eye(TAPS, dtype=np.float32).reshape(TAPS, 1, 1, TAPS), (CHANNELS, 1, 1, 1))


def _model():
    """Two tails read from two channel vectors by ConvTranspose with one shared weight, and written back by two
    Convs with another shared weight (the Qwen3 step's RowTail, twice at the same shape)."""
    vector = [1, CHANNELS * TAPS, 1, 1]
    row = [1, CHANNELS, 1, TAPS]
    nodes = [helper.make_node("ConvTranspose", [f"v{i}", "read"], [f"tail{i}"], name=f"read{i}", group=CHANNELS)
             for i in range(2)]
    nodes += [helper.make_node("Conv", [f"tail{i}", "write"], [f"back{i}"], name=f"write{i}", group=CHANNELS)
              for i in range(2)]
    inputs = [helper.make_tensor_value_info(f"v{i}", TensorProto.FLOAT, vector) for i in range(2)]
    outputs = [helper.make_tensor_value_info(f"tail{i}", TensorProto.FLOAT, row) for i in range(2)]
    outputs += [helper.make_tensor_value_info(f"back{i}", TensorProto.FLOAT, vector) for i in range(2)]
    weights = [numpy_helper.from_array(_selector(), "read"), numpy_helper.from_array(_selector(), "write")]
    graph = helper.make_graph(nodes, "tails", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _reference(vectors):
    """float64: the tail is channel c's TAPS samples of the channel vector, in order; written back, the vector."""
    tails = [v.astype(np.float64).reshape(1, CHANNELS, 1, TAPS) for v in vectors]
    return tails + [t.reshape(1, CHANNELS * TAPS, 1, 1) for t in tails]


def _run(model, vectors):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"v0": vectors[0], "v1": vectors[1]})


def test_each_conv_reads_its_own_weight_and_computes_the_same():
    model = _model()
    rewritten = own_conv_weights(model)
    weights = [node.input[1] for node in rewritten.graph.node]
    assert len(set(weights)) == 4 and len({node.input[1] for node in model.graph.node}) == 2
    values = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    assert all(np.array_equal(values[name], _selector()) for name in weights)
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal((1, CHANNELS * TAPS, 1, 1)).astype(np.float32) for _ in range(2)]
    for got, want in zip(_run(rewritten, vectors), _reference(vectors)):
        np.testing.assert_array_equal(got, want)  # 0/1 weights: exact in fp32


def test_a_planted_off_by_one_tap_fails_the_reference():
    model = own_conv_weights(_model())
    shifted = np.roll(_selector(), 1, axis=3)  # every slot lands one tap late
    for tensor in model.graph.initializer:
        if tensor.name == "read":
            tensor.CopyFrom(numpy_helper.from_array(shifted, "read"))
    vectors = [np.arange(CHANNELS * TAPS, dtype=np.float32).reshape(1, -1, 1, 1)] * 2
    assert not np.array_equal(_run(model, vectors)[0], _reference(vectors)[0])

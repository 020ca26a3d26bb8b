"""rkaudio.core.onnx_graph's shared lookups: positions agree with the node lookups, partial dims stay readable, and the
static shapes can leave out stale declared output shapes."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, constant_values, inferred_dims, static_shapes


def _model(output_dims):
    """x [1, 4, n] -> Mul(x, scale) -> Relu -> y, with a Constant node and y declared as `output_dims`."""
    nodes = [helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0))),
             helper.make_node("Mul", ["x", "scale"], ["scaled"]),
             helper.make_node("Mul", ["scaled", "two"], ["doubled"]),
             helper.make_node("Relu", ["doubled"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_dims)],
        [numpy_helper.from_array(np.ones((1, 4, 1), np.float32), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_positions_match_producers_and_consumers():
    index = GraphIndex(_model([1, 4, "n"]))
    for name, position in index.producer_position.items():
        assert index.producer[name] is index.nodes[position]
    assert index.consumer_positions["scaled"] == [2]
    assert [index.nodes[i] for i in index.consumer_positions["x"]] == index.consumers["x"]


def test_partial_dims_and_static_shapes():
    model = _model([1, 4, 9])  # a declared output shape the dynamic input does not back
    dims = dict(inferred_dims(model))
    assert dims["x"] == (1, 4, None) and dims["y"] == (1, 4, 9)
    assert "y" not in dict(inferred_dims(model, outputs=False))
    shapes = static_shapes(model)
    assert shapes["y"] == (1, 4, 9) and shapes["scale"] == (1, 4, 1) and shapes["two"] == ()
    assert "x" not in shapes
    assert set(static_shapes(model, constants=False, outputs=False)) == set()
    assert sorted(constant_values(model.graph)) == ["scale", "two"]

"""shape_generic: fixed-shape exports of one graph at several lengths become one graph that computes, at each
length, what a numpy float64 reference computes; what is not one graph is refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.shape_generic import NotOneGraph, shape_generic

CHANNELS = 3
LARGEST = 32
BROADCAST = np.arange(1, CHANNELS + 1, dtype=np.float32)[None]  # [1, C]


def _table(length: int, band: bool = False) -> np.ndarray:
    """Per-position rows: a prefix of the longest table (RoPE-like), or a band that moves with the length."""
    rows = np.arange(length if band else LARGEST, dtype=np.float32)[:, None] * np.arange(1, CHANNELS + 1)
    return np.sin(rows / (length if band else 7.0))[:length].astype(np.float32)


def _fixed(length: int, band: bool = False, extra_node: bool = False) -> onnx.ModelProto:
    """The graph as an exporter folds it at one length: every length-dependent constant spelled out."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, length])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [length, CHANNELS])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [CHANNELS])
    constants = {
        "rows_shape": np.array([CHANNELS, length], np.int64),           # a Reshape target (one entry varies)
        "tail_start": np.array([1], np.int64), "tail_end": np.array([length], np.int64),  # Slice to the axis end
        "last_start": np.array([length - 1], np.int64), "last_end": np.array([length], np.int64),
        "axis1": np.array([1], np.int64), "flat": np.array([CHANNELS], np.int64),
        "ones": np.ones((length, 1), np.float32),                       # a filled broadcast column
        "broadcast": BROADCAST, "table": _table(length, band),
    }
    nodes = [
        helper.make_node("Reshape", ["x", "rows_shape"], ["rows"]),
        helper.make_node("Transpose", ["rows"], ["cols"], perm=[1, 0]),
        helper.make_node("MatMul", ["ones", "broadcast"], ["spread"]),
        helper.make_node("Add", ["cols", "spread"], ["shifted"]),
        helper.make_node("Add", ["shifted", "table"], ["y"]),
        helper.make_node("Slice", ["rows", "tail_start", "tail_end", "axis1"], ["tail"]),
        helper.make_node("ReduceSum", ["tail", "axis1"], ["tail_sum"], keepdims=0),
        helper.make_node("Slice", ["rows", "last_start", "last_end", "axis1"], ["last"]),
        helper.make_node("Reshape", ["last", "flat"], ["last_flat"]),
        helper.make_node("Add", ["tail_sum", "last_flat"], ["z"]),
    ]
    if extra_node:
        nodes[-1:] = [helper.make_node("Add", ["tail_sum", "last_flat"], ["z0"]),
                      helper.make_node("Neg", ["z0"], ["z"])]
    graph = helper.make_graph(nodes, "g", [x], [y, z], [numpy_helper.from_array(v, k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _reference(x: np.ndarray) -> dict:
    rows = x.astype(np.float64)[0]
    length = rows.shape[1]
    return {"y": rows.T + BROADCAST.astype(np.float64) + _table(length).astype(np.float64),
            "z": rows[:, 1:].sum(axis=1) + rows[:, -1]}


def test_one_graph_computes_every_length_as_the_float64_reference():
    lengths = (8, 12, 20)
    generic = shape_generic([_fixed(length) for length in lengths])
    onnx.checker.check_model(generic)
    dims = [d.dim_param or d.dim_value for d in generic.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, CHANNELS, "s0"]
    rng = np.random.default_rng(0)
    with OnnxBackend(generic) as merged:
        for length in lengths:
            x = rng.standard_normal((1, CHANNELS, length)).astype(np.float32)
            got, want = merged.run({"x": x}), _reference(x)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_reshape_and_slice_constants_need_no_shape_arithmetic():
    """The Reshape target takes -1 and the Slices count from the axis end; only the ones column and the table
    read the length (Shape ops)."""
    generic = shape_generic([_fixed(length) for length in (8, 12)])
    values = {t.name: numpy_helper.to_array(t) for t in generic.graph.initializer}
    readers = {name: node for node in generic.graph.node for name in node.input}
    reshape_target = next(n for n in generic.graph.node if n.op_type == "Reshape" and n.input[0] == "x").input[1]
    assert values[reshape_target].tolist() == [CHANNELS, -1]
    last = next(n for n in generic.graph.node if n.op_type == "Slice" and n.output[0] == "last")
    assert values[last.input[1]].tolist() == [-1]
    tail = next(n for n in generic.graph.node if n.op_type == "Slice" and n.output[0] == "tail")
    assert values[tail.input[2]].tolist() == [np.iinfo(np.int64).max]
    assert "x" in readers and any(n.op_type == "Shape" for n in generic.graph.node)


def test_a_table_that_moves_with_the_length_is_refused():
    with pytest.raises(NotOneGraph, match="has to be a graph input"):
        shape_generic([_fixed(length, band=True) for length in (8, 12)])


def test_graphs_that_differ_in_nodes_are_refused():
    with pytest.raises(NotOneGraph, match="nodes"):
        shape_generic([_fixed(8), _fixed(12, extra_node=True)])


def test_one_shape_is_refused():
    with pytest.raises(NotOneGraph, match="at least two"):
        shape_generic([_fixed(8)])
    with pytest.raises(NotOneGraph, match="nothing to make dynamic"):
        shape_generic([_fixed(8), _fixed(8)])

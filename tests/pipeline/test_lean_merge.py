"""`--ladder dynamic` merges rungs holding their large initializers aside (`rkaudio.pipeline.ladder._lean_rungs`):
a weight every rung holds byte-identical is stored once and set aside while the graphs merge, a large table that
differs between rungs (a leading corner of the largest) stays in the merge, and the merged graph computes each
rung exactly."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkaudio.pipeline.ladder import LEAN_MIN_ELEMENTS, _lean_rungs
from rkaudio.core.onnx_graph import weights_back
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.shape_generic import shape_generic

WIDTH = 256  # the weight [WIDTH, WIDTH] is exactly LEAN_MIN_ELEMENTS: set aside
LENGTHS = (256, 384)  # the table [S, WIDTH] is large at every rung and differs between them
WEIGHT = np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32)
TABLE = np.sin(np.arange(max(LENGTHS) * WIDTH, dtype=np.float32) / 977).reshape(max(LENGTHS), WIDTH)


def _rung(length: int, path) -> None:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "weight"], ["mixed"]), helper.make_node("Add", ["mixed", "table"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [length, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [length, WIDTH])],
        [numpy_helper.from_array(WEIGHT, "weight"), numpy_helper.from_array(TABLE[:length], "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


def test_a_shared_weight_is_set_aside_once_and_a_differing_table_merges(tmp_path):
    assert WEIGHT.size == LEAN_MIN_ELEMENTS
    paths = [tmp_path / f"rung_{length}.onnx" for length in LENGTHS]
    for length, path in zip(LENGTHS, paths):
        _rung(length, path)
    graphs, weights = _lean_rungs(paths)
    assert list(weights) == ["weight"]
    for graph in graphs:
        assert [t.name for t in graph.graph.initializer] == ["table"]
        assert [i.name for i in graph.graph.input] == ["x", "weight"]
    merged = weights_back(shape_generic(graphs), weights)
    assert [i.name for i in merged.graph.input] == ["x"]
    assert sum(t.name == "weight" for t in merged.graph.initializer) == 1
    onnx.save(merged, str(tmp_path / "merged.onnx"))
    with OnnxBackend(tmp_path / "merged.onnx") as backend:
        for length in LENGTHS:
            x = np.random.default_rng(length).standard_normal((length, WIDTH)).astype(np.float32)
            expected = x.astype(np.float64) @ WEIGHT.astype(np.float64) + TABLE[:length]
            np.testing.assert_allclose(backend.run({"x": x})["y"], expected, rtol=0, atol=1e-3)

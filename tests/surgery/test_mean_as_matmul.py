"""mean_as_matmul: an RMSNorm's last-axis means become MatMuls by a 1/N column and compute what a numpy float64
reference computes; a mean over another axis or without keepdims is left alone."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from runtime.host.backends import OnnxBackend
from surgery.graph.mean_as_matmul import mean_as_matmul

FRAMES, WIDTH = 5, 12


def _graph() -> onnx.ModelProto:
    """y = x / sqrt(mean(x^2, last axis) + eps) (an RMSNorm), z = mean(x, axis 1) (a mean the pass leaves)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, FRAMES, WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FRAMES, WIDTH])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, WIDTH])
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["squares"]),
        helper.make_node("ReduceMean", ["squares"], ["mean_square"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["mean_square", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["y"]),
        helper.make_node("ReduceMean", ["x"], ["z"], axes=[1], keepdims=0),
    ]
    eps = helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-5])
    graph = helper.make_graph(nodes, "rms", [x], [y, z], initializer=[eps])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_last_axis_means_become_matmuls_that_compute_the_reference(tmp_path):
    x = np.random.default_rng(0).standard_normal((1, FRAMES, WIDTH)).astype(np.float32)
    rewritten = mean_as_matmul(_graph())
    assert [n.op_type for n in rewritten.graph.node].count("ReduceMean") == 1  # the axis-1 mean stays
    assert [n.op_type for n in rewritten.graph.node].count("MatMul") == 1
    path = tmp_path / "rms.onnx"
    onnx.save(rewritten, str(path))
    with OnnxBackend(path) as backend:
        got = backend.run({"x": x})
    exact = x.astype(np.float64)
    rms = np.sqrt(np.mean(exact**2, axis=-1, keepdims=True) + 1e-5)
    assert np.max(np.abs(got["y"] - exact / rms)) < 1e-6
    assert np.max(np.abs(got["z"] - exact.mean(axis=1))) < 1e-6

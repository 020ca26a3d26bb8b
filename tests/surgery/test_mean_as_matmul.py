"""mean_as_matmul: an RMSNorm's last-axis mean becomes a MatMul by a 1/N column and computes what a numpy float64
reference computes; a LayerNorm's means and a mean over another axis are left alone."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.mean_as_matmul import mean_as_matmul

FRAMES, WIDTH = 5, 12


def _graph() -> onnx.ModelProto:
    """y = x / sqrt(mean(x^2, last axis) + eps) (an RMSNorm); left: z = mean(x, axis 1), and the LayerNorm
    w = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, FRAMES, WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FRAMES, WIDTH])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, WIDTH])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, FRAMES, WIDTH])
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["squares"]),
        helper.make_node("ReduceMean", ["squares"], ["mean_square"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["mean_square", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["y"]),
        helper.make_node("ReduceMean", ["x"], ["z"], axes=[1], keepdims=0),
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["centred_squares"]),
        helper.make_node("ReduceMean", ["centred_squares"], ["variance"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["variance", "eps"], ["variance_shifted"]),
        helper.make_node("Sqrt", ["variance_shifted"], ["deviation"]),
        helper.make_node("Div", ["centred", "deviation"], ["w"]),
    ]
    eps = helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-5])
    graph = helper.make_graph(nodes, "rms", [x], [y, z, w], initializer=[eps])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_last_axis_means_become_matmuls_that_compute_the_reference(tmp_path):
    x = np.random.default_rng(0).standard_normal((1, FRAMES, WIDTH)).astype(np.float32)
    rewritten = mean_as_matmul(_graph())
    assert [n.op_type for n in rewritten.graph.node].count("ReduceMean") == 3  # axis 1, the LayerNorm's two
    assert [n.op_type for n in rewritten.graph.node].count("MatMul") == 1
    path = tmp_path / "rms.onnx"
    onnx.save(rewritten, str(path))
    with OnnxBackend(path) as backend:
        got = backend.run({"x": x})
    exact = x.astype(np.float64)
    rms = np.sqrt(np.mean(exact**2, axis=-1, keepdims=True) + 1e-5)
    assert np.max(np.abs(got["y"] - exact / rms)) < 1e-6
    assert np.max(np.abs(got["z"] - exact.mean(axis=1))) < 1e-6
    centred = exact - exact.mean(axis=-1, keepdims=True)
    assert np.max(np.abs(got["w"] - centred / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + 1e-5))) < 1e-5

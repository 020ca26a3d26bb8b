"""cap_conv_padding: the excess padding moves into a Concat of zeros, with the same output."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from rkaudio.surgery.graph.conv_pad import cap_conv_padding
from rkaudio.surgery.graph.fold import op_histogram


def _conv_model(weight, bias, dilation, pads, length):
    c_out, c_in, kernel = weight.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, length])
    out_len = length + sum(pads) - dilation * (kernel - 1)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, out_len])
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", dilations=[dilation], pads=pads,
                            kernel_shape=[kernel])
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(weight, "w"),
                                                      numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_reference(x, weight, bias, dilation, pads):
    """float64 dilated 1-D convolution with zero padding, written out tap by tap."""
    x = np.pad(x.astype(np.float64)[0], ((0, 0), (pads[0], pads[1])))
    c_out, _, kernel = weight.shape
    out_len = x.shape[1] - dilation * (kernel - 1)
    y = np.zeros((c_out, out_len)) + bias.astype(np.float64)[:, None]
    for k in range(kernel):
        y += weight[:, :, k].astype(np.float64) @ x[:, k * dilation : k * dilation + out_len]
    return y[None]


def test_large_pads_move_into_a_zero_concat_with_the_same_output():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((6, 4, 11)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    x = rng.standard_normal((1, 4, 70)).astype(np.float32)
    for pads in ([25, 25], [3, 25], [25, 3]):
        model = _conv_model(weight, bias, 5, pads, 70)
        capped = cap_conv_padding(model)
        conv = next(n for n in capped.graph.node if n.op_type == "Conv")
        assert max(next(a.ints for a in conv.attribute if a.name == "pads")) <= 15
        assert op_histogram(capped) == {"Concat": 1, "Conv": 1}
        got = ort.InferenceSession(capped.SerializeToString()).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, _conv_reference(x, weight, bias, 5, pads), rtol=1e-4, atol=1e-4)


def test_small_pads_are_left_alone():
    weight = np.ones((2, 2, 7), np.float32)
    model = _conv_model(weight, np.zeros(2, np.float32), 5, [15, 15], 40)
    assert cap_conv_padding(model).graph == model.graph
    onnx.checker.check_model(cap_conv_padding(model))

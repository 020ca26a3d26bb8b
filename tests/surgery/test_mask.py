"""mask_decoder (a Mul(mask) after every decoder conv, the mask brought to each level by an all-ones
ConvTranspose) on a 2-level HiFi-GAN shape against a float64 numpy masked decoder: the padding stays exactly zero,
the polyphase last level computes the same map, and with the mask all ones the pass changes nothing."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.mask import level_strides, mask_decoder
from rkaudio.surgery.graph.polyphase_levels import polyphase_levels
from tests.surgery.test_polyphase_levels import conv, conv_transpose, leaky


def tiny_decoder(rng):
    """x [1,3,N] -> Conv -> LeakyRelu -> ConvT(s2) -> Conv -> ConvT(s3) -> Conv(dilation 2) -> Tanh -> Conv -> y
    (a 2-level HiFi-GAN shape)."""
    p = {"w0": rng.standard_normal((4, 3, 3)), "b0": rng.standard_normal(4),
         "u1": rng.standard_normal((4, 3, 4)), "c1": rng.standard_normal(3),
         "w2": rng.standard_normal((3, 3, 3)), "b2": rng.standard_normal(3),
         "u3": rng.standard_normal((3, 2, 3)), "c3": rng.standard_normal(2),
         "w4": rng.standard_normal((2, 2, 3)), "b4": rng.standard_normal(2),
         "w5": rng.standard_normal((1, 2, 3)), "b5": rng.standard_normal(1)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["h0"], pads=[1, 1]),
             helper.make_node("LeakyRelu", ["h0"], ["a0"], alpha=0.1),
             helper.make_node("ConvTranspose", ["a0", "u1", "c1"], ["h1"], strides=[2], pads=[1, 1]),
             helper.make_node("Conv", ["h1", "w2", "b2"], ["h2"], pads=[1, 1]),
             helper.make_node("ConvTranspose", ["h2", "u3", "c3"], ["h3"], strides=[3]),
             helper.make_node("Conv", ["h3", "w4", "b4"], ["h4"], pads=[2, 2], dilations=[2]),
             helper.make_node("Tanh", ["h4"], ["a4"]),
             helper.make_node("Conv", ["a4", "w5", "b5"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(nodes, "dec", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, None]),
                                             helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in p.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), p


def reference(p, x, m):
    """Masked decoder in float64: every conv output times the mask repeated to its level's length."""
    m1, m2 = np.repeat(m, 2), np.repeat(m, 6)
    h = leaky(conv(x, p["w0"], p["b0"], (1, 1)) * m)
    h = conv_transpose(h, p["u1"], p["c1"], 2, 1) * m1
    h = conv(h, p["w2"], p["b2"], (1, 1)) * m1
    h = conv_transpose(h, p["u3"], p["c3"], 3, 0) * m2
    h = np.tanh(conv(h, p["w4"], p["b4"], (2, 2), dilation=2) * m2)
    return conv(h, p["w5"], p["b5"], (1, 1)) * m2


def test_mask_decoder_and_polyphase_match_float64_reference():
    rng = np.random.default_rng(0)
    model, params = tiny_decoder(rng)
    assert level_strides(model, "x") == [2, 3]
    masked = mask_decoder(model, "x", "m")
    x = rng.standard_normal((1, 3, 11))
    m = np.ones((1, 1, 11))
    m[..., 7:] = 0.0
    got = OnnxBackend(masked, threads=1).run({"x": x.astype(np.float32), "m": m.astype(np.float32)})["y"]
    want = reference(params, x[0], m[0, 0])
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
    assert np.all(got[0, :, 7 * 6 :] == 0.0)  # the padding stays exactly zero at the output rate
    # The polyphase last level (phases of the stride-3 ConvTranspose stacked on channels) is the same map.
    phased = polyphase_levels(masked, "x", 1)
    assert {n.op_type for n in phased.graph.node if n.output[0] == "h3_unmasked"} == {"Conv"}
    got = OnnxBackend(phased, threads=1).run({"x": x.astype(np.float32), "m": m.astype(np.float32)})["y"]
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
    # With the mask all ones the pass changes nothing.
    ones = {"x": x.astype(np.float32), "m": np.ones((1, 1, 11), np.float32)}
    plain, ones = OnnxBackend(model, threads=1).run(ones)["y"], OnnxBackend(masked, threads=1).run(ones)["y"]
    np.testing.assert_array_equal(plain, ones)

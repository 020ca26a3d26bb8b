"""stride_phase_upsample (a ConvTranspose as one phase Conv and a Split/Concat/Reshape interleave) against a float64
numpy transposed convolution written from its definition; a planted off-by-one tap fails the same comparison; the
layers it refuses are named."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.polyphase_levels import PolyphaseError
from rkaudio.surgery.graph.stride_phase import stride_phase_upsample
from tests.surgery.test_polyphase_levels import conv_transpose, leaky


def two_upsamplers(rng, kernels=(8, 6), strides=(4, 2), pads=(2, 2), channels=(6, 5, 3), length=11):
    """x [1,C0,N] -> ConvT(s0) -> LeakyRelu -> ConvT(s1) -> y, with the numpy float64 weights."""
    weights = {f"u{i}": rng.standard_normal((channels[i], channels[i + 1], kernels[i])).astype(np.float32)
               for i in range(2)}
    biases = {f"b{i}": rng.standard_normal(channels[i + 1]).astype(np.float32) for i in range(2)}
    nodes = [helper.make_node("ConvTranspose", ["x", "u0", "b0"], ["h0"], name="up0", kernel_shape=[kernels[0]],
                              strides=[strides[0]], pads=[pads[0], pads[0]]),
             helper.make_node("LeakyRelu", ["h0"], ["a0"], alpha=0.1),
             helper.make_node("ConvTranspose", ["a0", "u1", "b1"], ["y"], name="up1", kernel_shape=[kernels[1]],
                              strides=[strides[1]], pads=[pads[1], pads[1]])]
    out_length = length * strides[0] * strides[1]
    graph = helper.make_graph(nodes, "ups", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels[0],
                                                                                                     length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels[2], out_length])],
                              [numpy_helper.from_array(v, k) for k, v in {**weights, **biases}.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8

    def reference(x):
        h = conv_transpose(x[0].astype(np.float64), weights["u0"].astype(np.float64), biases["b0"], strides[0],
                           pads[0])
        return conv_transpose(leaky(h), weights["u1"].astype(np.float64), biases["b1"], strides[1], pads[1])[None]

    return model, reference


@pytest.mark.parametrize("names", [["up0"], ["up1"], ["up0", "up1"]])
def test_rewritten_upsamplers_match_a_float64_transposed_convolution(names):
    rng = np.random.default_rng(7)
    model, reference = two_upsamplers(rng)
    x = rng.standard_normal((1, 6, 11)).astype(np.float32)
    rewritten = stride_phase_upsample(model, names)
    assert sum(n.op_type == "ConvTranspose" for n in rewritten.graph.node) == 2 - len(names)
    assert sum(n.op_type == "Slice" for n in rewritten.graph.node) == 0  # no crop: the output is exactly s x input
    with OnnxBackend(rewritten) as backend:
        got = backend.run({"x": x})["y"]
    expected = reference(x)
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) < 1e-4 * np.max(np.abs(expected))


def test_an_off_by_one_tap_fails_the_reference():
    rng = np.random.default_rng(7)
    model, reference = two_upsamplers(rng)
    x = rng.standard_normal((1, 6, 11)).astype(np.float32)
    rewritten = stride_phase_upsample(model, ["up0"])
    weight = next(i for i in rewritten.graph.initializer if i.name == "up0_phase_w")
    shifted = np.roll(numpy_helper.to_array(weight), 1, axis=2)  # every tap one coarse frame late
    weight.CopyFrom(numpy_helper.from_array(shifted, weight.name))
    with OnnxBackend(rewritten) as backend:
        got = backend.run({"x": x})["y"]
    expected = reference(x)
    assert np.max(np.abs(got - expected)) > 0.1 * np.max(np.abs(expected))


def test_a_cropping_or_missing_upsampler_is_refused_by_name():
    rng = np.random.default_rng(7)
    model, _ = two_upsamplers(rng, kernels=(8, 7), pads=(2, 2))  # 7 - 4 != 2: the output is not 2 x input
    with pytest.raises(PolyphaseError, match="up1"):
        stride_phase_upsample(model, ["up1"])
    with pytest.raises(PolyphaseError, match="up9"):
        stride_phase_upsample(model, ["up9"])

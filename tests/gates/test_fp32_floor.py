"""rkaudio.gates.fp32_floor: the float64 run of an ONNX graph computes what onnxruntime computes in fp32 (its torch-backed
Conv / ConvTranspose with asymmetric pads, strides, dilations, groups and output padding included), and the
threshold rule keeps the fixed level unless the floor less its margin is lower."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.gates.fp32_floor import FLOOR_MARGIN_DB, float64_run, floor_threshold, floor_verdict
from rkaudio.board.numeric import snr_db
from rkaudio.host.backends import OnnxBackend

CONVS = {
    "conv asymmetric pads, dilation": ("Conv", [8, 4, 5], dict(pads=[3, 1], dilations=[2], strides=[1])),
    "conv strided, grouped": ("Conv", [8, 2, 4], dict(pads=[1, 2], strides=[3], group=2)),
    "conv transpose cropped": ("ConvTranspose", [4, 6, 8], dict(pads=[2, 3], strides=[4])),
    "conv transpose output padding": ("ConvTranspose", [4, 3, 5], dict(pads=[1, 1], strides=[3], output_padding=[2],
                                                                        group=2)),
}


def one_node_graph(op: str, weight_shape: list[int], attributes: dict) -> onnx.ModelProto:
    """x [1,4,37] -> op(x, W, b) -> LeakyRelu -> y, random weights (seed 0)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal(weight_shape).astype(np.float32)
    outputs = weight_shape[0] if op == "Conv" else weight_shape[1] * attributes.get("group", 1)
    bias = rng.standard_normal(outputs).astype(np.float32)
    nodes = [helper.make_node(op, ["x", "w", "b"], ["h"], **attributes),
             helper.make_node("LeakyRelu", ["h"], ["y"], alpha=0.1)]
    graph = helper.make_graph(nodes, "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 37])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", CONVS)
def test_float64_run_computes_what_onnxruntime_computes(case):
    model = one_node_graph(*CONVS[case])
    x = np.random.default_rng(1).standard_normal((1, 4, 37)).astype(np.float32)
    fp32 = OnnxBackend(model).run({"x": x})["y"]
    exact = float64_run(model, {"x": x})["y"]
    assert exact.dtype == np.float64 and exact.shape == fp32.shape
    assert snr_db(exact, fp32) > 120.0  # fp32 rounding only; a pad or crop one sample off lands under 10 dB


def test_threshold_is_the_fixed_level_unless_the_floor_is_lower():
    assert floor_threshold(90.0, math.inf) == 90.0
    assert floor_threshold(90.0, 110.0) == 90.0
    assert floor_threshold(90.0, 80.0) == 80.0 - FLOOR_MARGIN_DB
    low = floor_verdict("g", 80.0 - FLOOR_MARGIN_DB + 1, 90.0, 80.0, "what")
    assert low.passed and low.threshold == 80.0 - FLOOR_MARGIN_DB and "80.0 dB" in low.detail
    assert not floor_verdict("g", 80.0 - FLOOR_MARGIN_DB - 1, 90.0, 80.0, "what").passed

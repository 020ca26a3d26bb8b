"""The fp16 floor (issue 15): the floor graph against a numpy float64 model of fp16 storage, the gap gate, and
real builds where it tells a conversion fault (fails, naming the layers) from fp16-sensitive weights (the
absolute gate fails, the message says the weights are at fault, not the conversion)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.core.errors import GateFailure
from rkaudio.gates.fp16_floor import FLOOR_CAP_DB, FLOOR_MARGIN_DB, fp16_rounded, floor_gap, floor_gap_verdict, rounded_count
from rkaudio.host.backends import OnnxBackend


def r16(values):
    """float64 -> the nearest fp16, back in float64."""
    return np.asarray(values, dtype=np.float64).astype(np.float16).astype(np.float64)


def elementwise_graph() -> onnx.ModelProto:
    """y = Reshape(Relu(x * w + c) - c, Shape(x)): float ops plus an int64 Shape path the rewrite must leave."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((1, 16)) * 3).astype(np.float32)
    c = np.array([1536.0], np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "c"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Sub", ["r", "c"], ["s"], name="sub"),
             helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Reshape", ["s", "shape"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "floor", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_floor_graph_rounds_every_tensor_like_fp16_storage():
    model = elementwise_graph()
    x = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)
    w, c = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer)
    # float64 model: every stored tensor (input, weights, each op's output) rounded to fp16
    m = r16(r16(x) * r16(w))
    expected = r16(r16(np.maximum(r16(m + r16(c)), 0.0)) - r16(c))
    floor = fp16_rounded(model)
    onnx.checker.check_model(floor)
    got = OnnxBackend(floor).run({"x": x})["y"]
    np.testing.assert_array_equal(got.astype(np.float64), expected)
    plain = OnnxBackend(model).run({"x": x})["y"]
    assert np.abs(plain - got).max() > 0.1  # fp32 keeps what fp16 loses at 1536 (spacing 1)
    # names and I/O unchanged, the integer Shape output not rounded, the source model untouched
    assert [i.name for i in floor.graph.input] == ["x"] and [o.name for o in floor.graph.output] == ["y"]
    assert rounded_count(floor) == 6  # x, m, a, r, s, y; not shape
    assert not any(n.op_type == "Cast" for n in model.graph.node)


def test_x_plus_1536_minus_1536_comes_back_rounded():
    """The issue's probe: onnxruntime's own fp16 kernels would not round; the Cast pairs do."""
    c = numpy_helper.from_array(np.array([1536.0], np.float32), "c")
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Sub", ["a", "c"], ["y"])],
                              "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[0.1, 0.3, 0.7, 1.4]], np.float32)
    np.testing.assert_array_equal(OnnxBackend(fp16_rounded(model)).run({"x": x})["y"], [[0, 0, 1, 1]])


def test_gap_gate_passes_at_the_floor_and_fails_far_below_it():
    assert floor_gap_verdict("pcm", 30.03, 30.14).passed  # the Qwen3 figures
    assert floor_gap_verdict("y", 62.0, 95.0).passed  # both far past any gated level: capped
    assert floor_gap(62.0, 95.0) == FLOOR_CAP_DB - 62.0
    bad = floor_gap_verdict("y", 36.0, 60.67)
    assert not bad.passed and bad.name == "fp16_floor_gap[y]" and bad.value == pytest.approx(24.0)
    assert not floor_gap_verdict("y", -math.inf, 50.0).passed
    assert math.isnan(floor_gap(math.nan, 50.0)) and not floor_gap_verdict("y", math.nan, 50.0).passed


def folded_scale_graph(path: Path, scale: float, channels: int = 256, length: int = 64) -> Path:
    """The planted conversion fault: y = Conv(x, W) * scale with a per-tensor scale of 3e-5. Plain fp16 keeps
    W and y (y is an fp16 subnormal but fine-grained enough, ~60 dB); the toolkit folds the Mul into the
    fp16 conv weights, which then underflow (W*scale ~ 5e-7, spacing 6e-8): ~36 dB."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((channels, channels, 3)) / np.sqrt(3 * channels)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1], kernel_shape=[3]),
             helper.make_node("Mul", ["c", "s"], ["y"], name="scale")]
    shape = [1, channels, length]
    graph = helper.make_graph(nodes, "folded_scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(np.array([scale], np.float32), "s")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def subnormal_weights_graph(path: Path, weight_scale: float = 3e-7) -> Path:
    """fp16-sensitive weights, no conversion fault: a conv whose weights are fp16 subnormals (~25 dB in any
    fp16 arithmetic, the simulator included), fed inputs of ~1e3 so the output is well inside the fp16 range."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 8, 3)) * weight_scale).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1], kernel_shape=[3])],
                              "subnormal", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_clean_build_records_the_floor_beside_the_simulator(graph, inputs_npz, tmp_path, require_converter):
    require_converter()
    onnx_path = graph("clean", blocks=2)
    result = build_engine(onnx_path, tmp_path / "out", BuildOptions("rk3588"), selfcheck=inputs_npz(onnx_path))
    figures = result.manifest_data["simulator"]["y"]
    assert set(figures) == {"snr_db", "max_abs", "fp16_floor_snr_db", "fp16_floor_gap_db"}
    assert abs(figures["fp16_floor_snr_db"] - figures["snr_db"]) < 3.0
    gate = [g for g in result.manifest_data["gates"] if g["name"] == "fp16_floor_gap[y]"][0]
    assert gate["passed"] and gate["threshold"] == FLOOR_MARGIN_DB


def test_planted_conversion_fault_fails_the_gap_gate_naming_the_layers(tmp_path, require_converter):
    require_converter()
    onnx_path = folded_scale_graph(tmp_path / "folded.onnx", 3e-5)
    feeds = tmp_path / "folded.inputs.npz"
    np.savez(feeds, x=np.random.default_rng(1).standard_normal((1, 256, 64)).astype(np.float32))
    with pytest.raises(GateFailure) as failure:
        build_engine(onnx_path, tmp_path / "out", BuildOptions("rk3588"), selfcheck=feeds)
    failed = {v.name: v for v in failure.value.verdicts}
    assert "fp16_floor_gap[y]" in failed and failed["fp16_floor_gap[y]"].value > 15.0
    text = str(failure.value)
    print(text)
    assert "the conversion lost fidelity at scale (+conv)" in text
    assert "layers adding the most noise" in text and "scale +1 fused" in text
    figures = failure.value.extra["simulator"]["y"]
    assert figures["fp16_floor_snr_db"] > 55.0 > 45.0 > figures["snr_db"]
    assert not (tmp_path / "out" / "folded.rknn").exists()


def test_fp16_sensitive_weights_fail_the_floor_not_the_conversion(tmp_path, require_converter):
    require_converter()
    onnx_path = subnormal_weights_graph(tmp_path / "subnormal.onnx")
    feeds = tmp_path / "subnormal.inputs.npz"
    np.savez(feeds, x=(1e3 * np.random.default_rng(0).standard_normal((1, 8, 64))).astype(np.float32))
    with pytest.raises(GateFailure) as failure:
        build_engine(onnx_path, tmp_path / "out", BuildOptions("rk3588"), selfcheck=feeds)
    assert [v.name for v in failure.value.verdicts] == ["simulator_snr[y]"]  # the gap gate passed
    text = str(failure.value)
    print(text)
    assert "plain fp16 of this graph is already at" in text and "these weights are fp16-sensitive" in text
    assert "`convert check" in text and "min_simulator_snr_db" in text and "lost fidelity" not in text

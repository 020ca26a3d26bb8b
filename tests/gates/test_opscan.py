"""The problem-op scan names the nodes rknn.build rejects or runs on the CPU, and its gate fails on them."""
import io

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkaudio.gates import opscan


def _model(nodes, initializers=(), inputs=None) -> onnx.ModelProto:
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", inputs, [out], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def test_clean_conv_graph_has_no_problems_and_passes():
    w = numpy_helper.from_array(np.ones((4, 4, 3), np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1]),
                    helper.make_node("Relu", ["c"], ["y"], name="relu")], [w])
    assert opscan.scan(model) == []
    assert opscan.verdict([]).passed


def test_shape_glue_and_cpu_ops_are_named_with_reasons_and_fail_the_gate():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape_of_x"),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], name="ones_like_x"),
        helper.make_node("Floor", ["x"], ["f"], name="floor"),
        helper.make_node("Mul", ["f", "ones"], ["y"], name="mul"),
    ]
    problems = opscan.scan(_model(nodes))
    assert [(p.name, p.op_type) for p in problems] == [
        ("shape_of_x", "Shape"), ("ones_like_x", "ConstantOfShape"), ("floor", "Floor")]
    assert all(p.reason for p in problems)
    verdict = opscan.verdict(problems)
    assert not verdict.passed and verdict.value == 3
    assert "Shape:shape_of_x" in verdict.detail and "Floor:floor" in verdict.detail


def test_data_dependent_operands_are_flagged_but_constant_ones_are_not():
    pads_const = _const("pads", [0, 0, 1, 0, 0, 1])
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p_const"], name="pad_constant"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Concat", ["s", "s"], ["pads_dyn"], name="concat", axis=0),
        helper.make_node("Pad", ["x", "pads_dyn"], ["p_dyn"], name="pad_from_length"),
        helper.make_node("GatherElements", ["x", "idx_in"], ["g"], name="gather_dynamic", axis=2),
        helper.make_node("GatherElements", ["x", "idx_const"], ["g2"], name="gather_constant", axis=2),
        helper.make_node("Add", ["g", "g2"], ["y"], name="add"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
              helper.make_tensor_value_info("idx_in", TensorProto.INT64, [1, 4, 8])]
    idx = _const("idx_const", np.zeros((1, 4, 8)))
    names = [p.name for p in opscan.scan(_model(nodes, [pads_const, idx], inputs))]
    assert names == ["shape", "pad_from_length", "gather_dynamic"]


def test_negative_step_slice_is_a_cpu_flip():
    consts = [_const("st", [0]), _const("en", [-9]), _const("ax", [1]), _const("step_neg", [-1]),
              _const("step_pos", [1])]
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "step_neg"], ["a"], name="flip"),
             helper.make_node("Slice", ["x", "st", "en", "ax", "step_pos"], ["b"], name="forward"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    assert [p.name for p in opscan.scan(_model(nodes, consts))] == ["flip"]


def test_sin_is_a_problem_except_on_targets_that_place_it_on_the_npu():
    model = _model([helper.make_node("Sin", ["x"], ["y"], name="sine")])
    assert [p.name for p in opscan.scan(model, "rk3588")] == ["sine"]
    assert [p.name for p in opscan.scan(model, "rk3566")] == ["sine"]
    assert opscan.scan(model, "rk3576") == []


def test_warn_prints_one_line_per_node_and_nothing_for_a_clean_graph():
    stream = io.StringIO()
    opscan.warn([], stream)
    assert stream.getvalue() == ""
    problems = opscan.scan(_model([helper.make_node("Round", ["x"], ["y"], name="r")]))
    opscan.warn(problems, stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].strip().startswith("Round r:")

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from rkaudio.surgery.graph.fold import fold_fixed, op_histogram


def _shape_glue_model() -> onnx.ModelProto:
    """y = x * ones_like(x) built through Shape -> ConstantOfShape, the glue rknn.build chokes on."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "n"])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("Mul", ["x", "ones"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.metadata_props.add(key="rkaudio", value="{}")
    return model


def test_fold_removes_shape_glue_and_keeps_values_and_metadata():
    model = _shape_glue_model()
    folded = fold_fixed(model, {"x": [1, 4, 9]})
    ops = op_histogram(folded)
    assert "Shape" not in ops and "ConstantOfShape" not in ops
    x = np.random.default_rng(0).standard_normal((1, 4, 9)).astype(np.float32)
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x.astype(np.float64) * 1.0)
    assert [p.key for p in folded.metadata_props] == ["rkaudio"]
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [1, 4, 9]

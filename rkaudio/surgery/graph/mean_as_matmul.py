"""A ReduceMean over the last axis (keepdims) as a MatMul by a column of 1/N: what rknn-toolkit2 2.3.2 makes of
such a mean itself at fixed shapes (its `convert_reducemean_to_einsum`: a 1x1 Conv of 1/N weights), which its
dynamic-shape build does not do and runs the mean on the CPU instead (`rkaudio.toolkit.session.DYNAMIC_MEANS_ON_CPU`).
The same sum of the same products; only the fp32 summation order may differ. A LayerNorm's two means (mean(x)
taken from x, and the mean of the square of x - mean(x)) are left: 2.3.2 fuses that pattern into its NPU exNorm at
dynamic shapes too, and as MatMuls it does not (a [1,T,64] LayerNorm: 1 exNorm against 10 ops, measured)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, constant_values, node_attr, static_shapes


def _last_axis_mean_width(node: onnx.NodeProto, shapes: dict, constants: dict) -> int | None:
    """N of a keepdims ReduceMean over the last axis of a statically known shape, else None (left alone)."""
    shape = shapes.get(node.input[0])
    if node.op_type != "ReduceMean" or not shape or node_attr(node, "keepdims", 1) != 1:
        return None
    axes = node_attr(node, "axes")
    if axes is None and len(node.input) > 1:  # opset 18: the axes are an input
        axes = constants.get(node.input[1])
    if axes is None or [int(a) % len(shape) for a in np.ravel(axes)] != [len(shape) - 1]:
        return None
    return int(shape[-1])


def _layer_norm_means(index: GraphIndex) -> set[str]:
    """The outputs of the ReduceMeans of the LayerNorms written out elementwise: mean(x) subtracted from x, and
    the mean of (x - mean(x)) squared."""
    centring, centred = set(), set()
    for node in index.nodes:
        mean = index.producer.get(node.input[1]) if node.op_type == "Sub" else None
        if mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == node.input[0]:
            centring.add(mean.output[0])
            centred.add(node.output[0])
    variances = set()
    for node in index.nodes:
        square = index.producer.get(node.input[0]) if node.op_type == "ReduceMean" else None
        if square is not None and square.op_type in ("Pow", "Mul") and square.input[0] in centred:
            variances.add(node.output[0])
    return centring | variances


def mean_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every keepdims last-axis ReduceMean of a known width N written as MatMul(x, full([N, 1], 1/N))
    (one column per width and dtype, shared), a LayerNorm's means excepted."""
    shapes = static_shapes(model)
    layer_norm = _layer_norm_means(GraphIndex(model))
    constants = constant_values(model.graph)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in [*inferred.input, *inferred.value_info]}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    columns: dict[tuple[int, int], str] = {}
    nodes = []
    for node in out.graph.node:
        width = _last_axis_mean_width(node, shapes, constants)
        if width is None or node.input[0] not in dtypes or node.output[0] in layer_norm:
            nodes.append(node)
            continue
        key = (width, dtypes[node.input[0]])
        if key not in columns:
            columns[key] = f"mean_column_{width}_{helper.tensor_dtype_to_np_dtype(key[1]).name}"
            column = np.full((width, 1), 1.0 / width, helper.tensor_dtype_to_np_dtype(key[1]))
            out.graph.initializer.append(numpy_helper.from_array(column, columns[key]))
        nodes.append(helper.make_node("MatMul", [node.input[0], columns[key]], list(node.output), name=node.name))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out

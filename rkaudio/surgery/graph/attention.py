"""Attention in a form the RK3566 compiler keeps on its NPU, as ONNX graph passes.

Why (issue #42's probes, rknn-toolkit2 2.3.2, rk3566): the compiler wraps a MatMul of two rank-4 activations, and a
rank-4 head-split Transpose, in CPU Transposes, and keeps the same ops at rank 3 on the NPU; it runs Softmax and Exp
on the CPU (ReduceMax, MaxPool and Max too), and Sigmoid, Neg, Relu, Div, Slice on the NPU. So heads run at rank 3
(`squeeze_unit_batch`), exp is a ratio of two Sigmoids of logits shifted below each row's max (a Relu tree: `row_max`)
or a constant bound, and the row sum is one more column of the value MatMul (`softmax_as_exp_ratio`). A score
tensor of several heads whose plane is long (Whisper's 1,500 x 1,500) logs REGTASK lines at rank 3, so such heads
are computed apart (`heads_apart`).

The passes work on ONNX whose shapes are pinned (`rkaudio.surgery.graph.fold.fold_fixed`)."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import (GraphIndex, constant_values, drop_unused_initializers, live_nodes, node_attr,
                                    static_shapes)
from rkaudio.gates.logit_bound import ROW_MAX_LOGIT_CLIP

# Elementwise ops whose rank follows their inputs (numpy broadcasting: dropping a leading 1 changes nothing).
ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Neg", "Sigmoid", "Relu", "Where", "Equal", "Max", "Min", "Sqrt", "Pow",
               "Tanh", "Cast", "Erf")
# Ops with one axis attribute, and ops whose axes are an attribute (older opsets) or their second input.
AXIS_ATTRIBUTE = ("Softmax", "LogSoftmax", "Concat", "Split")
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")
SQUEEZABLE = (*ELEMENTWISE, *AXIS_ATTRIBUTE, *REDUCE, "MatMul", "Transpose", "Reshape", "Slice")

# The smallest normal fp16: the row sum is floored here, so a row with every key masked (a padded query of Piper's
# encoder: every exp is 0) gives 0 rather than 0/0; a row sum this small has lost its precision anyway.
ROW_SUM_FLOOR = 2.0 ** -14
# [values | 1] is padded with zero columns to a multiple of this: at depth + 1 = 17 the RK3566 compiler puts a
# Transpose around the per-head value MatMul on its CPU, at 24 it does not (CosyVoice3's tiny DiT, toolkit 2.3.2).
VALUE_WIDTH_MULTIPLE = 8


def widened_depth(depth: int) -> int:
    """Columns of [values | 1 | 0 ..]: depth + 1 rounded up to VALUE_WIDTH_MULTIPLE."""
    return -(-(depth + 1) // VALUE_WIDTH_MULTIPLE) * VALUE_WIDTH_MULTIPLE


def _axis_without_batch(axis: int, rank: int) -> int | None:
    """`axis` of a rank-`rank` tensor once its leading axis is gone, or None when it is that axis."""
    axis = axis % rank
    return None if axis == 0 else axis - 1


def _squeezable_node(node: onnx.NodeProto, shapes: dict, constants: dict) -> bool:
    """True when `node` computes the same at rank 3 with every rank-4 tensor's leading 1 dropped."""
    if node.op_type not in SQUEEZABLE or any(shapes.get(out, ())[:1] != (1,) or len(shapes.get(out, ())) != 4
                                             for out in node.output):
        return False
    rank4_inputs = [name for name in node.input if name and len(shapes.get(name, ())) == 4]
    if any(shapes[name][0] != 1 for name in rank4_inputs):
        return False
    if node.op_type == "Reshape":
        return True
    if any(name and name not in shapes for name in node.input):
        return False
    if node.op_type == "Transpose":
        return list(node_attr(node, "perm", []))[:1] == [0]
    if node.op_type in AXIS_ATTRIBUTE:
        return _axis_without_batch(node_attr(node, "axis", -1 if node.op_type != "Concat" else 0), 4) is not None
    if node.op_type in REDUCE:
        axes = _reduce_axes(node, constants)
        return axes is not None and all(_axis_without_batch(a, 4) is not None for a in axes)
    if node.op_type == "Slice":
        axes = constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        return axes is not None and all(_axis_without_batch(int(a), 4) is not None for a in axes)
    return True


def _reduce_axes(node: onnx.NodeProto, constants: dict) -> list[int] | None:
    axes = node_attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = constants.get(node.input[1])
    return None if axes is None else [int(a) for a in np.ravel(axes)]


def _data_inputs(node: onnx.NodeProto) -> int:
    """How many leading inputs of `node` are tensors of the region (the rest: shapes, axes, starts)."""
    return 1 if node.op_type in ("Reshape", "Slice", "Transpose", *REDUCE) else len(node.input)


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def squeeze_unit_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """Run attention's rank-4 tensors with a leading 1 ([1, heads, rows, depth]) at rank 3: the RK3566 compiler
    puts CPU Transposes around rank-4 activation MatMuls and head Transposes, and keeps rank-3 ones on the NPU."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    shapes, constants = static_shapes(out), constant_values(out.graph)
    region = _attention_parts([node for node in graph.node if _squeezable_node(node, shapes, constants)], constants)
    rank3 = {node.output[0]: f"{node.output[0]}/rank3" for node in region}
    in_region = {id(node) for node in region}
    added: dict[str, np.ndarray] = {}

    def int_const(values, tag: str) -> str:
        name = f"unit_batch/{tag}_" + "_".join(str(int(v)) for v in values)
        added.setdefault(name, np.array(values, dtype=np.int64))
        return name

    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) not in in_region:
            if node.op_type == "Reshape" and node.input[0] in rank3 and 0 not in constants.get(node.input[1], [0]):
                # a Reshape to explicit dims reads either rank alike
                node.input[0] = rank3[node.input[0]]
            nodes.append(node)
            continue
        inputs = list(node.input)
        for position, name in enumerate(inputs[:_data_inputs(node)]):
            shape = shapes.get(name, ())
            if name in rank3 or len(shape) != 4:
                inputs[position] = rank3.get(name, name)
            elif name in constants:
                inputs[position] = f"{name}/rank3"
                added.setdefault(inputs[position], constants[name].reshape(shape[1:]))
            else:  # a rank-4 activation from outside the region (a graph input, a mask)
                rank3[name] = inputs[position] = f"{name}/rank3"
                nodes.append(helper.make_node("Reshape", [name, int_const(shape[1:], "shape")], [rank3[name]],
                                              name=f"{name}/DropUnitBatch"))
        if node.op_type == "Reshape":
            inputs[1] = int_const(shapes[node.output[0]][1:], "shape")
        elif node.op_type == "Transpose":
            _set_attribute(node, "perm", [p - 1 for p in node_attr(node, "perm")[1:]])
        elif node.op_type in AXIS_ATTRIBUTE:
            default = 0 if node.op_type == "Concat" else -1
            _set_attribute(node, "axis", _axis_without_batch(node_attr(node, "axis", default), 4))
        elif node.op_type in REDUCE:
            axes = [_axis_without_batch(a, 4) for a in _reduce_axes(node, constants)]
            if node_attr(node, "axes") is not None:
                _set_attribute(node, "axes", axes)
            else:
                inputs[1] = int_const(axes, "axes")
        elif node.op_type == "Slice":
            inputs[3] = int_const([_axis_without_batch(int(a), 4) for a in constants[node.input[3]]], "axes")
        original = node.output[0]
        del node.input[:]
        node.input.extend(inputs)
        node.output[0] = rank3[original]
        nodes.append(node)
        # whoever outside the region still reads the rank-4 tensor gets it back through a Reshape (dropped below
        # when no one does)
        nodes.append(helper.make_node("Reshape", [rank3[original], int_const(shapes[original], "shape")],
                                      [original], name=f"{original}/AddUnitBatch"))
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, {o.name for o in graph.output}))
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in added.items())
    del graph.value_info[:]
    return drop_unused_initializers(out)


def _attention_parts(squeezable: list[onnx.NodeProto], constants: dict) -> list[onnx.NodeProto]:
    """The nodes of `squeezable` joined (through the tensors they pass each other) to a MatMul of two activations:
    the attention cores and their head layouts. Other rank-4 unit-batch tensors stay as they are: the Qwen3 step's
    [1, C, rows, L] row convs, squeezed around their Convs, took 81 -> 88 CPU ops and a 1.1 -> 24.3 MB engine on the
    RK3566 (tiny B=64 step)."""
    part = {id(node): id(node) for node in squeezable}

    def root(key: int) -> int:
        while part[key] != key:
            part[key] = part[part[key]]
            key = part[key]
        return key

    producer = {node.output[0]: node for node in squeezable}
    for node in squeezable:
        for name in node.input:
            if name in producer:
                part[root(id(node))] = root(id(producer[name]))
    cores = {root(id(node)) for node in squeezable
             if node.op_type == "MatMul" and not any(name in constants for name in node.input)}
    return [node for node in squeezable if root(id(node)) in cores]


def softmax_as_row_max_exp(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each Softmax as its unnormalised exp(s - row max), for a graph that divides by its row sum itself (RK3566)."""
    # the Audio8 RK3566 step (families/audio8/graphs.py `Layout.step_row_sum`): its Softmax over [own | cached], with
    # no Concat of the buffers, feeds no single MatMul that `exp_ratio_attention` could fold the row sum into
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes, nodes, added = static_shapes(out), [], {}
    for node in out.graph.node:
        if node.op_type != "Softmax":
            nodes.append(node)
            continue
        exp = exp_below_bound(node.input[0], None, node.name or node.output[0], added, keys=shapes[node.input[0]][-1])
        exp[-1].output[0] = node.output[0]
        nodes += exp
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in added.items())
    return drop_unused_initializers(out)


def softmax_as_exp_ratio(model: onnx.ModelProto, logit_bound: float | None = None) -> onnx.ModelProto:
    """Each Softmax over the last axis that feeds one MatMul (weights @ values) as exp(s - shift) = Sigmoid(-r) /
    Sigmoid(r), r = shift - s (`exp_below_bound`), times [values | 1], divided by that last column: the RK3566 runs
    Softmax and Exp on its CPU and these ops on its NPU. The shift is each row's max (`row_max`; exact up to fp16
    for any logits) or, given, the constant `logit_bound` (fewer ops; exact while every logit is at most it and each
    row's max within EXP_WINDOW under it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    shapes, constants, index = static_shapes(out), constant_values(out.graph), GraphIndex(out)
    added: dict[str, np.ndarray] = {}
    replaced: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for position, node in enumerate(index.nodes):
        site = _exp_ratio_site(node, index, shapes)
        if site is None:
            continue
        matmul_position, values = site
        matmul = index.nodes[matmul_position]
        logits, depth = node.input[0], shapes[values][-1]
        tag = node.name or node.output[0]
        make = helper.make_node
        new = exp_below_bound(logits, logit_bound, tag, added, keys=shapes[logits][-1])
        widened = values_and_ones(values, tag, index, shapes, constants, added, new)
        new.append(make("MatMul", [f"{tag}/exp", widened], [f"{tag}/weighted"], name=f"{tag}/WeightedAndSum"))
        new += divided_by_row_sum(f"{tag}/weighted", depth, len(shapes[values]), matmul.output[0], tag, added)
        replaced[matmul_position] = new
        removed |= {position, matmul_position}
    if not replaced:
        return out
    _splice(out.graph, index, replaced, removed)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in added.items())
    return drop_unused_initializers(out)


def _splice(graph: onnx.GraphProto, index: GraphIndex, replaced: dict[int, list[onnx.NodeProto]],
            removed: set[int]) -> None:
    """`graph`'s nodes with each position in `replaced` preceded by its new nodes and every `removed` one dropped."""
    nodes = []
    for position, node in enumerate(index.nodes):
        nodes.extend(replaced.get(position, []))
        if position not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def exp_below_bound(logits: str, logit_bound: float | None, tag: str, added: dict,
                    keys: int | None = None) -> list[onnx.NodeProto]:
    """Nodes computing `{tag}/exp` = exp(logits - shift) as Sigmoid(-r) / Sigmoid(r), r = shift - logits (ops the
    RK3566 runs on its NPU), with `logit_bound` the shift and r clamped at 0 (Relu: a logit past the bound weighs 1,
    not an fp16 overflow); with None each row's largest logit over its `keys` last-axis entries (`row_max`), r not
    clamped: the tree rounds its a - b at a mask fill's magnitude (-1e4: by up to 5e-4 in fp32), and a shift that
    lands under the row's true max must still weigh that logit e^(-r) > 1, or the ratio no longer cancels the shift
    (clamped, the tiny Audio8's decode steps reached 2.35e-4 logits relative L2 against a 1e-4 gate; unclamped
    3.7e-6). Their constants go into `added`."""
    make = helper.make_node
    if logit_bound is None:
        if keys is None:
            raise ValueError("exp_below_bound: the row-max shift needs the number of keys (the last axis' length)")
        shift_nodes = row_max(logits, keys, tag, added)
        shift = shift_nodes[-1].output[0]
        logits = shift_nodes[0].output[0]  # the clipped logits the tree saw
        depth = [make("Sub", [shift, logits], [f"{tag}/depth"], name=f"{tag}/Below")]
    else:
        shift_nodes, shift = [], f"{tag}/bound"
        added[shift] = np.array(logit_bound, dtype=np.float32)
        depth = [make("Sub", [shift, logits], [f"{tag}/below"], name=f"{tag}/Below"),
                 make("Relu", [f"{tag}/below"], [f"{tag}/depth"], name=f"{tag}/Depth")]
    return [
        *shift_nodes,
        *depth,
        make("Neg", [f"{tag}/depth"], [f"{tag}/shifted"], name=f"{tag}/Shifted"),
        make("Sigmoid", [f"{tag}/shifted"], [f"{tag}/numerator"], name=f"{tag}/Numerator"),
        make("Sigmoid", [f"{tag}/depth"], [f"{tag}/denominator"], name=f"{tag}/Denominator"),
        make("Div", [f"{tag}/numerator", f"{tag}/denominator"], [f"{tag}/exp"], name=f"{tag}/Exp"),
    ]


def row_max(logits: str, keys: int, tag: str, added: dict) -> list[onnx.NodeProto]:
    """Nodes computing each row's largest logit over the last axis ([..., 1]) as a tree of max(a, b) = b + Relu(a - b)
    over halves (ops the RK3566 runs on its NPU; ReduceMax, MaxPool and Max it runs on its CPU). The first node clips
    the logits to +-ROW_MAX_LOGIT_CLIP (its output is the clipped logits): a -inf or finfo.min mask would make a - b
    inf - inf in fp16. An odd width takes two overlapping halves (a max does not mind an entry counted twice)."""
    make = helper.make_node
    clipped = f"{tag}/clipped_logits"
    added.setdefault("exp_ratio/logit_clip_low", np.array(-ROW_MAX_LOGIT_CLIP, dtype=np.float32))
    added.setdefault("exp_ratio/logit_clip_high", np.array(ROW_MAX_LOGIT_CLIP, dtype=np.float32))
    added.setdefault("exp_ratio/last_axis", np.array([-1], dtype=np.int64))
    nodes = [make("Clip", [logits, "exp_ratio/logit_clip_low", "exp_ratio/logit_clip_high"], [clipped],
                  name=f"{tag}/ClipLogits")]
    current, width = clipped, keys
    while width > 1:
        half = (width + 1) // 2
        level = f"{tag}/max{half}"
        for name, value in ((f"{level}/lower_end", half), (f"{level}/upper_start", width - half),
                            (f"{level}/upper_end", width)):
            added[name] = np.array([value], dtype=np.int64)
        added.setdefault("exp_ratio/zero", np.array([0], dtype=np.int64))
        nodes += [
            make("Slice", [current, "exp_ratio/zero", f"{level}/lower_end", "exp_ratio/last_axis"], [f"{level}/lower"],
                 name=f"{level}/Lower"),
            make("Slice", [current, f"{level}/upper_start", f"{level}/upper_end", "exp_ratio/last_axis"],
                 [f"{level}/upper"], name=f"{level}/Upper"),
            make("Sub", [f"{level}/lower", f"{level}/upper"], [f"{level}/excess"], name=f"{level}/Excess"),
            make("Relu", [f"{level}/excess"], [f"{level}/lower_above"], name=f"{level}/LowerAbove"),
            make("Add", [f"{level}/upper", f"{level}/lower_above"], [f"{level}/max"], name=f"{level}/Max"),
        ]
        current, width = f"{level}/max", half
    if current == clipped:  # one key: its own max
        nodes.append(make("Identity", [clipped], [f"{tag}/row_max"], name=f"{tag}/RowMax"))
    else:
        nodes[-1].output[0] = f"{tag}/row_max"
    return nodes


def divided_by_row_sum(weighted: str, depth: int, rank: int, output: str, tag: str,
                       added: dict) -> list[onnx.NodeProto]:
    """Nodes computing `output` = weighted[..., :depth] / max(weighted[..., depth], ROW_SUM_FLOOR) (the row sum rides
    in column `depth` of the last axis); their constants go into `added`."""
    make = helper.make_node
    axes = f"{tag}/last_axis"
    added[axes] = np.array([rank - 1], dtype=np.int64)
    for name, value in ((f"{tag}/zero", 0), (f"{tag}/depth_end", depth), (f"{tag}/sum_end", depth + 1)):
        added[name] = np.array([value], dtype=np.int64)
    added.setdefault("exp_ratio/row_sum_floor", np.array(ROW_SUM_FLOOR, dtype=np.float32))
    return [
        make("Slice", [weighted, f"{tag}/zero", f"{tag}/depth_end", axes], [f"{tag}/weighted_values"],
             name=f"{tag}/WeightedValues"),
        make("Slice", [weighted, f"{tag}/depth_end", f"{tag}/sum_end", axes], [f"{tag}/row_sum"], name=f"{tag}/RowSum"),
        make("Clip", [f"{tag}/row_sum", "exp_ratio/row_sum_floor"], [f"{tag}/row_sum_floored"],
             name=f"{tag}/RowSumFloor"),
        make("Div", [f"{tag}/weighted_values", f"{tag}/row_sum_floored"], [output], name=f"{tag}/Normalise"),
    ]


def values_and_ones(values: str, tag: str, index: GraphIndex, shapes: dict, constants: dict, added: dict,
                     new: list) -> str:
    """Name of [values | 1 | 0 ..]: from the value projection itself when `values` is a head split of x @ W (+ b) (one
    more output column per head, weights 0 and bias 1: no Concat, whose head Transpose the RK3566 runs on its CPU),
    else a Concat with a ones column (a constant's is folded)."""
    widened, depth = f"{tag}/values_and_ones", shapes[values][-1]
    ones = np.zeros(shapes[values][:-1] + (widened_depth(depth) - depth,), np.float32)
    ones[..., 0] = 1.0
    if values in constants:
        added[widened] = np.concatenate([constants[values], ones], axis=-1)
        return widened
    chain = _head_split_projection(values, index, shapes, constants)
    if chain is None:
        added[f"{tag}/ones"] = ones
        new.append(helper.make_node("Concat", [values, f"{tag}/ones"], [widened], axis=-1, name=f"{tag}/ValuesAndOnes"))
        return widened
    weight, bias_values, projected_input, reshape, transpose = chain
    heads, depth = shapes[reshape.output[0]][-2:]
    rows = weight.shape[0]
    # per head: x @ [W_h | 0 ..] + [b_h | 1 0 ..], one batched MatMul [heads, in, width] (x broadcast over heads)
    pad = widened_depth(depth) - depth
    head_weights = np.concatenate([weight.reshape(rows, heads, depth).transpose(1, 0, 2),
                                   np.zeros((heads, rows, pad), np.float32)], axis=-1)
    head_biases = np.concatenate([bias_values.reshape(heads, 1, depth), np.ones((heads, 1, 1), np.float32),
                                  np.zeros((heads, 1, pad - 1), np.float32)], axis=-1)
    added[f"{tag}/value_weights_and_zeros"] = np.ascontiguousarray(head_weights)
    added[f"{tag}/value_biases_and_ones"] = head_biases
    make = helper.make_node
    new += [
        make("MatMul", [projected_input, f"{tag}/value_weights_and_zeros"], [f"{tag}/projected"],
             name=f"{tag}/ValueHeads"),
        make("Add", [f"{tag}/projected", f"{tag}/value_biases_and_ones"], [widened], name=f"{tag}/ValueBiasAndOnes"),
    ]
    return widened


def _head_split_projection(values: str, index: GraphIndex, shapes: dict, constants: dict):
    """(W [in, out], b [out], x, Reshape, Transpose) when `values` = Transpose(Reshape(x @ W + b)) splits the last
    axis into [heads, depth], with W and b (zeros when absent) constants of a MatMul (+ Add) or a plain Gemm, else
    None."""
    transpose = index.producer.get(values)
    if transpose is None or transpose.op_type != "Transpose":
        return None
    reshape = index.producer.get(transpose.input[0])
    if reshape is None or reshape.op_type != "Reshape" or reshape.input[0] not in shapes:
        return None
    projected, split = shapes[reshape.input[0]], shapes.get(reshape.output[0], ())
    if len(split) != 3 or list(node_attr(transpose, "perm")) != [1, 0, 2] or projected[-1] != split[1] * split[2] \
            or math.prod(projected[:-1]) != split[0]:
        return None  # only [rows, heads, depth] -> [heads, rows, depth]: the per-head MatMul computes that directly
    width = projected[-1]
    producer, bias = index.producer.get(reshape.input[0]), np.zeros(width, np.float32)
    if producer is not None and producer.op_type == "Gemm":
        plain = all(node_attr(producer, a, d) == d for a, d in (("alpha", 1.0), ("beta", 1.0), ("transA", 0)))
        if not plain or producer.input[1] not in constants or (len(producer.input) > 2 and producer.input[2]
                                                               and producer.input[2] not in constants):
            return None
        weight = constants[producer.input[1]]
        weight = weight.T if node_attr(producer, "transB", 0) else weight
        if len(producer.input) > 2 and producer.input[2]:
            given = constants[producer.input[2]]
            if given.size not in (1, width) or math.prod(given.shape[:-1]) != 1:
                return None  # a per-row bias is no column of the projection: the Concat form
            bias = np.broadcast_to(given.reshape(-1), (width,)).astype(np.float32)
        return weight, bias, producer.input[0], reshape, transpose
    if producer is not None and producer.op_type == "Add" and producer.input[1] in constants \
            and constants[producer.input[1]].shape == (width,):
        bias, producer = constants[producer.input[1]], index.producer.get(producer.input[0])
    if producer is None or producer.op_type != "MatMul" or producer.input[1] not in constants \
            or constants[producer.input[1]].ndim != 2:
        return None
    return constants[producer.input[1]], bias, producer.input[0], reshape, transpose


def _exp_ratio_site(node: onnx.NodeProto, index: GraphIndex, shapes: dict) -> tuple[int, str] | None:
    """(position of the weights @ values MatMul, the values tensor) for a last-axis Softmax that feeds only that
    MatMul's left operand, else None."""
    if node.op_type != "Softmax" or node.input[0] not in shapes:
        return None
    rank = len(shapes[node.input[0]])
    if node_attr(node, "axis", -1) % rank != rank - 1:
        return None
    users = index.consumer_positions.get(node.output[0], [])
    if len(users) != 1 or any(o.name == node.output[0] for o in index.model.graph.output):
        return None
    matmul = index.nodes[users[0]]
    if matmul.op_type != "MatMul" or matmul.input[0] != node.output[0] or matmul.input[1] not in shapes:
        return None
    return users[0], matmul.input[1]


def heads_apart(model: onnx.ModelProto, plane_limit: int) -> onnx.ModelProto:
    """Each rank-3 attention of h >= 2 heads, scores = MatMul(q [h, T, d], k [h, d, S]) -> last-axis Softmax -> one
    MatMul with v [h, S, e], whose T x S plane exceeds `plane_limit`, as h one-head attentions between a Split of q,
    k and v (axis 0) and a Concat of their outputs. Why: the RK3566 compiler logs REGTASK lines for a rank-3 score
    tensor of several heads from a smaller plane than for one head (`rkaudio.board.soc.HEADS_SCORE_PLANE_LIMIT`)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes, index = static_shapes(out), GraphIndex(out)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for position, softmax in enumerate(index.nodes):
        site = _exp_ratio_site(softmax, index, shapes)
        scores = index.producer.get(softmax.input[0])
        if site is None or scores is None or scores.op_type != "MatMul" \
                or len(index.consumers.get(softmax.input[0], [])) != 1:
            continue
        weighted_position, values = site
        operands = [scores.input[0], scores.input[1], values]
        dims = [shapes.get(name, ()) for name in operands]
        heads = dims[0][0] if all(len(d) == 3 for d in dims) else 0
        plane = math.prod(shapes[softmax.input[0]][-2:])
        if heads < 2 or any(d[0] != heads for d in dims) or plane <= plane_limit:
            continue
        tag, make = softmax.name or softmax.output[0], helper.make_node
        new = [make("Split", [name], [f"{tag}/{part}{head}" for head in range(heads)], axis=0,
                    name=f"{tag}/Split_{part}") for name, part in zip(operands, ("q", "k", "v"))]
        for head in range(heads):
            new += [make("MatMul", [f"{tag}/q{head}", f"{tag}/k{head}"], [f"{tag}/scores{head}"],
                         name=f"{tag}/Scores{head}"),
                    make("Softmax", [f"{tag}/scores{head}"], [f"{tag}/weights{head}"], name=f"{tag}/Softmax{head}",
                         axis=-1),
                    make("MatMul", [f"{tag}/weights{head}", f"{tag}/v{head}"], [f"{tag}/weighted{head}"],
                         name=f"{tag}/Weighted{head}")]
        weighted = index.nodes[weighted_position]
        new.append(make("Concat", [f"{tag}/weighted{head}" for head in range(heads)], [weighted.output[0]], axis=0,
                        name=f"{tag}/Heads"))
        replaced[weighted_position] = new
        removed |= {index.producer_position[softmax.input[0]], position, weighted_position}
    if replaced:
        _splice(out.graph, index, replaced, removed)
    return out


def exp_ratio_attention(model: onnx.ModelProto, logit_bound: float | None = None) -> onnx.ModelProto:
    """The RK3566 attention form: heads at rank 3, then each softmax-weighted sum as an exp ratio over [values | 1]."""
    return softmax_as_exp_ratio(squeeze_unit_batch(model), logit_bound)

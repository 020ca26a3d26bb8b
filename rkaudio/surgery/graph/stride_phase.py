"""Upsampling ConvTransposes as one Conv that makes every stride phase, then a Split/Concat/Reshape interleave.

Why: rknn.build costs a ConvTranspose of stride s on its zero-stuffed input, about s times the MACs it does
(measured on the Piper medium decoder, rk3588, W=301: its three upsamplers hold 0.79 GMAC and are estimated at
9.9 M of the engine's 26.7 M cycles). The stride-phase Conv reads the coarse input once: the first two levels fall
from 2.47 M and 4.93 M cycles to 0.31 M and 0.62 M. The interleave is elementwise traffic, which the board-time
model (rkaudio/gates/board_time.py) prices; at the third level (64 -> 32 channels, 77,056 samples) it costs more than the
cycles save, so a family rewrites only the levels where the model predicts a saving. Output length must be exactly
stride x input (kernel - 2*pad = stride): no crop is needed, and a Slice on the long axis is what logged REGTASK
lines on rk3588 in a cropped form. The phase weights are the polyphase pass's own formula
(`rkaudio.surgery.graph.polyphase_levels.phase_conv`). Exact: only weights are rearranged."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, constant_value, node_attr
from rkaudio.surgery.graph.mask import upsample_levels
from rkaudio.surgery.graph.polyphase_levels import PolyphaseError, decoder_in_phases, phase_conv


def stride_phase_upsample(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The ConvTranspose nodes named `names` (1-D, groups 1, kernel - 2*pad = stride) rewritten as a phase Conv and a
    Split/Unsqueeze/Concat/Reshape interleave: the compiler stops costing their zero-stuffed inputs."""
    index = GraphIndex(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    wanted = set(names)
    found = {node.name for node in graph.node if node.op_type == "ConvTranspose"} & wanted
    if found != wanted:
        raise PolyphaseError(f"no ConvTranspose named {sorted(wanted - found)} in the graph")
    new_nodes: list[onnx.NodeProto] = []

    def initializer(name: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    for node in graph.node:
        if node.name not in wanted:
            new_nodes.append(node)
            continue
        weight = constant_value(index, node.input[1])  # [cin, cout, K]
        stride = int(node_attr(node, "strides", [1])[0])
        pads = list(node_attr(node, "pads", [0, 0]))
        if weight.ndim != 3 or pads[0] != pads[1] or weight.shape[2] - 2 * pads[0] != stride \
                or int(node_attr(node, "group", 1)) != 1 or any(node_attr(node, "output_padding", [0])) \
                or any(d != 1 for d in node_attr(node, "dilations", [1])):
            raise PolyphaseError(f"{node.name!r}: a 1-D ConvTranspose whose output is exactly stride x input (kernel "
                                 "- 2*pad = stride, no groups, dilation or output padding) is needed")
        bias = constant_value(index, node.input[2]) if len(node.input) > 2 and node.input[2] else None
        cout = weight.shape[1]
        conv_weight, conv_bias, conv_pads = phase_conv(weight.transpose(1, 0, 2), [pads[0] - j for j in
                                                                                  range(weight.shape[2])], stride, 1,
                                                       bias)
        stem, result = node.name, node.output[0]
        phases = f"{stem}_phases"
        new_nodes.append(helper.make_node(
            "Conv", [node.input[0], initializer(f"{stem}_phase_w", conv_weight.astype(np.float32)),
                     initializer(f"{stem}_phase_b", conv_bias.astype(np.float32))],
            [phases], name=f"{stem}_phase_conv", pads=conv_pads))
        parts = [f"{stem}_phase{p}" for p in range(stride)]
        new_nodes.append(helper.make_node("Split", [phases, initializer(f"{stem}_split", np.full(stride, cout,
                                                                                                   np.int64))],
                                          parts, name=f"{stem}_split", axis=1))
        last_axis = initializer(f"{stem}_last_axis", np.array([-1], np.int64))
        for part in parts:
            new_nodes.append(helper.make_node("Unsqueeze", [part, last_axis], [f"{part}_t"], name=f"{part}_t"))
        new_nodes.append(helper.make_node("Concat", [f"{part}_t" for part in parts], [f"{stem}_interleaved"],
                                          name=f"{stem}_interleave", axis=-1))
        # [1, cout, T, s] -> [1, cout, T*s]: sample s*t + p is phase p at t
        new_nodes.append(helper.make_node("Reshape", [f"{stem}_interleaved", initializer(
            f"{stem}_shape", np.array([0, cout, -1], np.int64))], [result], name=f"{stem}_reshape"))
    del graph.node[:]
    graph.node.extend(new_nodes)
    return out


def leading_upsamplers(model: onnx.ModelProto, decoder_input: str, levels: int) -> list[str]:
    """The names of the ConvTransposes of the first `levels` upsampling levels below `decoder_input`."""
    depth = upsample_levels(model, decoder_input)
    return [node.name for node in model.graph.node
            if node.op_type == "ConvTranspose" and 1 <= depth.get(node.output[0], 0) <= levels]


def upsamplers_in_phase_forms(model: onnx.ModelProto, decoder_input: str, strides: list[int], phase_levels: int,
                              stride_phase_levels: int):
    """A windowed decoder's upsampling levels in the phase forms the vocoder families share: the last `phase_levels`
    in polyphase form (the target's time field), the first `stride_phase_levels` as stride-phase Convs (where the
    board-time model predicts them faster); returns (model, the polyphase phase count or None)."""
    from rkaudio.core.errors import SetupError

    # Past the polyphase levels only their interleave's 0/1 ConvTransposes are left to rewrite.
    if stride_phase_levels + phase_levels > len(strides):
        raise SetupError(f"{stride_phase_levels} stride-phase and {phase_levels} polyphase levels overlap in a "
                         f"decoder of {len(strides)} upsampling levels")
    model, phases = decoder_in_phases(model, decoder_input, strides, phase_levels)
    return stride_phase_upsample(model, leading_upsamplers(model, decoder_input, stride_phase_levels)), phases

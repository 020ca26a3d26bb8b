"""Run a decoder's last upsampling level in polyphase form: the stride's phases stacked on channels.

Why the NPU needs it: a window's full-rate axis (93 latent slices x 256 = 23,808 samples for a medium
Piper voice) exceeds the time field of the op registers on rk3576 (0x3fff) and rk3566 (0x1fff): the
compiler logs REGTASK field overflows for every full-rate layer. With the last ConvTranspose's stride s,
sample s*t + p of a full-rate tensor becomes channel block p at time t: the ConvTranspose turns into a
Conv, every full-rate conv into a conv over phase-stacked channels (weights rearranged, zeros where a
tap falls in another phase), element-wise ops are unchanged, and the phases are interleaved back (a 0/1
ConvTranspose) only where the graph leaves this form. Exact: only weights are rearranged."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from core.onnx_graph import GraphIndex, constant_value, node_attr

UNARY = {"LeakyRelu", "Tanh", "Relu", "Sigmoid", "Neg", "Exp", "Abs"}
BINARY = {"Add", "Sub", "Mul", "Div"}


class PolyphaseError(ValueError):
    """The level below the upsampler has an op this pass cannot rewrite exactly."""


def _upsampler_as_conv(weight: np.ndarray, bias: np.ndarray | None, stride: int, pad: int):
    """ConvTranspose1d (weight [Cin, Cout, K]) -> Conv over the coarse input whose output channel
    p*Cout + co is phase p: y[s*t + p] = sum_j x[t + (p + pad - j)/s] w[:, co, j]."""
    c_in, c_out, k = weight.shape
    taps = [(p, j, (p + pad - j) // stride) for p in range(stride) for j in range(k) if (p + pad - j) % stride == 0]
    low, high = min(o for *_, o in taps), max(o for *_, o in taps)
    out = np.zeros((stride * c_out, c_in, high - low + 1), dtype=weight.dtype)
    for p, j, offset in taps:
        out[p * c_out : (p + 1) * c_out, :, offset - low] += weight[:, :, j].T
    return out, _tiled(bias, stride, c_out), (-low, high)


def _conv_in_phases(weight: np.ndarray, bias: np.ndarray | None, stride: int, dilation: int, pad: int):
    """Conv1d (weight [Cout, Cin, K], 'same' padding) on a full-rate signal -> Conv on its phases:
    out[s*t + p] reads in[s*t + p + j*d - pad] = phase (p + j*d - pad) mod s at t + floor(...)."""
    c_out, c_in, k = weight.shape
    taps = [(p, j, (p + j * dilation - pad) % stride, (p + j * dilation - pad) // stride)
            for p in range(stride) for j in range(k)]
    low, high = min(t[3] for t in taps), max(t[3] for t in taps)
    out = np.zeros((stride * c_out, stride * c_in, high - low + 1), dtype=weight.dtype)
    for p, j, q, offset in taps:
        out[p * c_out : (p + 1) * c_out, q * c_in : (q + 1) * c_in, offset - low] += weight[:, :, j]
    return out, _tiled(bias, stride, c_out), (-low, high)


def _tiled(bias, stride, channels):
    return np.tile(bias, stride) if bias is not None else np.zeros(stride * channels, dtype=np.float32)


def _nearest_upsampled(index: GraphIndex, name: str, stride: int) -> str | None:
    """The coarse input of an all-ones ConvTranspose with kernel = stride (exact nearest upsampling)."""
    node = index.producer.get(name)
    if node is None or node.op_type != "ConvTranspose" or int(node_attr(node, "strides", [1])[0]) != stride:
        return None
    weight = constant_value(index, node.input[1])
    unpadded = not any(node_attr(node, "pads", [0, 0]))
    if weight is None or weight.shape != (1, 1, stride) or not np.all(weight == 1) or not unpadded or len(node.input) > 2:
        return None
    return node.input[0]


def polyphase_tail(model: onnx.ModelProto, upsampler_output: str) -> onnx.ModelProto:
    """Rewrite the ConvTranspose producing `upsampler_output` and every layer below it to run on the
    stride's phases at the coarse rate (exact), interleaving back where the graph leaves that form."""
    index = GraphIndex(model)
    upsampler = index.producer.get(upsampler_output)
    if upsampler is None or upsampler.op_type != "ConvTranspose":
        raise PolyphaseError(f"{upsampler_output} is not produced by a ConvTranspose")
    stride = int(node_attr(upsampler, "strides", [1])[0])
    pads = list(node_attr(upsampler, "pads", [0, 0]))
    weight = constant_value(index, upsampler.input[1])
    kernel = weight.shape[2]
    if pads[0] != pads[1] or kernel - 2 * pads[0] != stride or int(node_attr(upsampler, "group", 1)) != 1:
        raise PolyphaseError(f"{upsampler.name!r}: output length must be exactly stride x input "
                             "(kernel - 2*pad = stride)")

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    channels: dict[str, int] = {}  # phase-layout tensors -> channels per phase
    new_nodes: list[onnx.NodeProto] = []

    def initializer(name: str, value: np.ndarray) -> str:
        value = value.astype(np.float32) if value.dtype.kind == "f" else value
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def interleave(name: str) -> str:
        """Phase layout [1, s*C, L] -> [1, C, s*L] by a 0/1 ConvTranspose (kernel = stride = s): exact,
        and an op the NPU runs at full rate where a Reshape/Transpose interleave becomes a long Gather."""
        c = channels[name]
        select = np.zeros((stride * c, c, stride), dtype=np.float32)
        for p in range(stride):
            select[p * c + np.arange(c), np.arange(c), p] = 1.0
        new_nodes.append(helper.make_node(
            "ConvTranspose", [name, initializer(f"{name}_interleave_w", select)], [f"{name}_interleaved"],
            name=f"{name}_interleave", kernel_shape=[stride], strides=[stride]))
        return f"{name}_interleaved"

    interleaved: dict[str, str] = {}
    for original in graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        if original.output[0] == upsampler_output:
            bias = constant_value(index, node.input[2]) if len(node.input) > 2 else None
            w, b, (left, right) = _upsampler_as_conv(weight, bias, stride, pads[0])
            node = helper.make_node("Conv", [node.input[0], initializer(f"{upsampler_output}_polyphase_w", w),
                                             initializer(f"{upsampler_output}_polyphase_b", b)],
                                    [upsampler_output], name=f"{original.name or upsampler_output}_polyphase",
                                    pads=[left, right])
            channels[upsampler_output] = weight.shape[1]
            new_nodes.append(node)
            continue
        phased = [i for i in node.input if i in channels]
        if not phased:
            new_nodes.append(node)
            continue
        if node.op_type == "Conv" and node.input[0] in channels and int(node_attr(node, "group", 1)) == 1 \
                and int(node_attr(node, "strides", [1])[0]) == 1:
            conv_pads = list(node_attr(node, "pads", [0, 0]))
            conv_weight = constant_value(index, node.input[1])
            dilation = int(node_attr(node, "dilations", [1])[0])
            if conv_pads[0] + conv_pads[1] != dilation * (conv_weight.shape[2] - 1):
                raise PolyphaseError(f"conv {node.name!r} does not keep its length ('same' padding needed)")
            bias = constant_value(index, node.input[2]) if len(node.input) > 2 and node.input[2] else None
            w, b, (left, right) = _conv_in_phases(conv_weight, bias, stride, dilation, conv_pads[0])
            result = node.output[0]
            new_nodes.append(helper.make_node(
                "Conv", [node.input[0], initializer(f"{result}_polyphase_w", w), initializer(f"{result}_polyphase_b", b)],
                [result], name=f"{node.name or result}_polyphase", pads=[left, right]))
            channels[result] = conv_weight.shape[0]
            continue
        if node.op_type in UNARY or node.op_type in BINARY:
            rewritten = []
            for name in node.input:
                if name in channels:
                    rewritten.append(name)
                    continue
                value = constant_value(index, name)
                coarse = _nearest_upsampled(index, name, stride)
                if value is not None and value.size == 1:
                    rewritten.append(name)
                elif coarse is not None:
                    rewritten.append(coarse)  # every phase of a nearest-upsampled signal is the coarse signal
                else:
                    rewritten = None
                    break
            if rewritten is not None:
                node.input[:] = rewritten
                channels[node.output[0]] = channels[phased[0]]
                new_nodes.append(node)
                continue
        # Leaving the polyphase form: interleave the phases back into the full-rate layout.
        for name in phased:
            if name not in interleaved:
                interleaved[name] = interleave(name)
        node.input[:] = [interleaved.get(i, i) for i in node.input]
        new_nodes.append(node)
    for output in graph.output:
        if output.name in channels:
            inner = f"{output.name}_polyphase"
            for node in new_nodes:
                node.input[:] = [inner if i == output.name else i for i in node.input]
                node.output[:] = [inner if o == output.name else o for o in node.output]
            channels[inner] = channels.pop(output.name)
            final = interleave(inner)
            new_nodes.append(helper.make_node("Identity", [final], [output.name]))
    del graph.node[:]
    graph.node.extend(new_nodes)
    return out

"""A waveform input fed in phases: the strided Conv that first reads a [1, T] (or [1, 1, T]) input reads
[1, P, T/P] instead (P = its stride), as a stride-1 Conv of kernel ceil(K/P) over the P phase channels.

Why: an encoder on raw samples (Wav2Vec2: 64,000 at 4 s of 16 kHz) holds the whole waveform on one axis, 3.91x the
RK3576's 0x3fff time field (32 REGTASK lines on the reduced Wav2Vec2 encoder), and no pass inside the graph can
shorten an axis the graph is fed. The caller splits the samples instead (`rkaudio.board.shapes.in_phases`: sample
P*j + p goes to [p, j]), named by the contract's `input_phases`. The first Conv downsamples by P at once, so every
tensor after it keeps its shape. Exact: the Conv's taps are only rearranged, W'[o, p, j] = W[o, 0, P*j + p]
(zero past K), and its output length T/P - ceil(K/P) + 1 equals floor((T - K)/P) + 1 whenever P divides T."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.contract import contract_of, store_contract
from rkaudio.core.onnx_graph import GraphIndex, constant_value, drop_unused_initializers, node_attr, static_shapes

SHAPE_ONLY = ("Unsqueeze", "Reshape")


def _matches(model: onnx.ModelProto) -> list[tuple[str, list[onnx.NodeProto], onnx.NodeProto, int]]:
    """(graph input, the shape-only nodes between it and its Conv, the Conv, its stride) for every input of
    [1, T] or [1, 1, T] read by exactly one chain of single-consumer Unsqueeze/Reshape into a 1-D Conv with one
    input channel, stride P > 1 dividing T, no padding, dilation or groups."""
    index = GraphIndex(model)
    shapes = static_shapes(model)
    found = []
    for name in index.graph_inputs:
        dims = list(shapes.get(name) or ())
        if len(dims) not in (2, 3) or dims[0] != 1 or (len(dims) == 3 and dims[1] != 1):
            continue
        chain, tensor = [], name
        while len(index.consumers.get(tensor, [])) == 1 and index.consumers[tensor][0].op_type in SHAPE_ONLY:
            chain.append(index.consumers[tensor][0])
            tensor = chain[-1].output[0]
        readers = index.consumers.get(tensor, [])
        if len(readers) != 1 or readers[0].op_type != "Conv" or readers[0].input[0] != tensor:
            continue
        conv = readers[0]
        weight = constant_value(index, conv.input[1])
        strides = list(node_attr(conv, "strides", [1]))
        plain = (int(node_attr(conv, "group", 1)) == 1 and not any(node_attr(conv, "pads", [0, 0]))
                 and all(d == 1 for d in node_attr(conv, "dilations", [1]))
                 and node_attr(conv, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"))
        if not plain or weight is None or weight.ndim != 3 or weight.shape[1] != 1 or strides[0] < 2 \
                or list(shapes.get(tensor) or ()) != [1, 1, dims[-1]] or dims[-1] % strides[0]:
            continue
        found.append((name, chain, conv, strides[0]))
    return found


def find_input_phases(model: onnx.ModelProto) -> list[str]:
    """Names of the Convs whose waveform input the pass feeds in phases (an unnamed one by its output)."""
    return [conv.name or conv.output[0] for _, _, conv, _ in _matches(model)]


def phase_taps(weight: np.ndarray, phases: int) -> np.ndarray:
    """[C_out, 1, K] taps of a stride-P Conv as [C_out, P, ceil(K/P)]: tap P*j + p at [:, p, j], zeros past K."""
    out_channels, _, kernel = weight.shape
    padded = np.zeros((out_channels, phases * math.ceil(kernel / phases)), weight.dtype)
    padded[:, :kernel] = weight[:, 0]
    return np.ascontiguousarray(padded.reshape(out_channels, -1, phases).transpose(0, 2, 1))


def input_phases(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every matched waveform input as [1, P, T/P] and its Conv as the stride-1 phase Conv; the contract's
    `input_phases` records P per input, for the caller's split."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    matches = _matches(out)  # nodes of the copy: the rewrite drops and replaces them by identity
    if not matches:
        return out
    index = GraphIndex(out)
    graph = out.graph
    dropped = {id(node) for _, chain, _, _ in matches for node in chain}
    replaced = {}
    phases_of = {}
    for name, chain, conv, phases in matches:
        weight = constant_value(index, conv.input[1])
        taps = f"{conv.name or conv.output[0]}/phase_taps"
        phase_weight = phase_taps(weight, phases)
        graph.initializer.append(numpy_helper.from_array(phase_weight, taps))
        attributes = {a.name: helper.get_attribute_value(a) for a in conv.attribute
                      if a.name not in ("strides", "kernel_shape")}
        replaced[id(conv)] = helper.make_node("Conv", [name, taps, *conv.input[2:]], list(conv.output),
                                              name=conv.name, kernel_shape=[phase_weight.shape[2]],
                                              strides=[1], **attributes)
        graph_input = next(i for i in graph.input if i.name == name)
        samples = graph_input.type.tensor_type.shape.dim[-1].dim_value
        graph_input.type.CopyFrom(helper.make_tensor_type_proto(
            graph_input.type.tensor_type.elem_type, [1, phases, samples // phases]))
        phases_of[name] = phases
    kept = [replaced.get(id(node), node) for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    stale = {node.output[0] for _, chain, _, _ in matches for node in chain}
    kept_info = [info for info in graph.value_info if info.name not in stale]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    contract = contract_of(out)
    store_contract(out, contract.replace(input_phases={**(contract.input_phases or {}), **phases_of}))
    return drop_unused_initializers(out)

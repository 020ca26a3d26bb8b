"""Mask the decoder half: `Mul(mask)` after every decoder Conv/ConvTranspose (and after every Add of
something from outside the decoder, such as a speaker-conditioning term).

Why the NPU needs it: a fixed-window engine zero-pads a short latent, but the HiFi-GAN decoder is
unmasked, so the padding's conv outputs (biases) leak into the last real slices and a tail window
lands 20-40 dB off a full-length decode. Masking after every conv keeps the padding at zero, as the
implicit zeros past the end of a full-length tensor are. The mask reaches each upsampling level
through an all-ones ConvTranspose1d with kernel = stride = that level's stride: exact nearest
upsampling with an op the decoder already runs on the NPU (a Resize does not lower on the board).
Strides are read from the decoder's own ConvTranspose nodes."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, node_attr


def upsample_levels(model: onnx.ModelProto, decoder_input: str) -> dict[str, int]:
    """Upsampling level (number of ConvTransposes passed) of every tensor computed from `decoder_input`."""
    level = {decoder_input: 0}
    for node in model.graph.node:
        seen = [level[i] for i in node.input if i in level]
        if not seen:
            continue
        value = max(seen) + (1 if node.op_type == "ConvTranspose" else 0)
        for out in node.output:
            level[out] = value
    return level


def level_strides(model: onnx.ModelProto, decoder_input: str) -> list[int]:
    """The stride of each upsampling level below `decoder_input` (e.g. [8, 8, 4] for a medium Piper voice)."""
    level = upsample_levels(model, decoder_input)
    strides: dict[int, int] = {}
    for node in model.graph.node:
        if node.op_type != "ConvTranspose" or node.output[0] not in level:
            continue
        stride = int(node_attr(node, "strides", [1])[0])
        depth = level[node.output[0]]
        if strides.setdefault(depth, stride) != stride:
            raise ValueError(f"upsampling level {depth} has ConvTransposes with strides {strides[depth]} and {stride}")
    if sorted(strides) != list(range(1, len(strides) + 1)):
        raise ValueError(f"upsampling levels are not a chain: {sorted(strides)}")
    return [strides[d] for d in range(1, len(strides) + 1)]


def _makes_padding_nonzero(node: onnx.NodeProto, level: dict[str, int]) -> bool:
    """Convs (bias, and reads across the boundary) and additions of a term from outside the decoder
    (speaker conditioning g broadcast over time) turn zero padding nonzero; activations keep zero at zero."""
    if node.output[0] not in level:
        return False
    if node.op_type in ("Conv", "ConvTranspose"):
        return True
    return node.op_type in ("Add", "Sub") and any(i not in level for i in node.input)


def mask_decoder(model: onnx.ModelProto, decoder_input: str, mask: str) -> onnx.ModelProto:
    """Multiply every decoder Conv/ConvTranspose output (and every Add of an outside term) computed from
    `decoder_input` by `mask` [1,1,N] brought to that level's length (all-ones ConvTranspose1d per level),
    so the padding stays zero as the implicit zeros past a full-length tensor are."""
    index = GraphIndex(model)
    if mask not in index.producer and mask not in index.graph_inputs:
        raise ValueError(f"no mask tensor named {mask!r}")
    level = upsample_levels(model, decoder_input)
    strides = level_strides(model, decoder_input)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    level_masks = [mask]
    upsamplers: list[onnx.NodeProto] = []
    for depth, stride in enumerate(strides, start=1):
        weight = f"{mask}_ones_stride{stride}_level{depth}"
        graph.initializer.append(numpy_helper.from_array(np.ones((1, 1, stride), dtype=np.float32), weight))
        level_masks.append(f"{mask}_level{depth}")
        upsamplers.append(helper.make_node("ConvTranspose", [level_masks[-2], weight], [level_masks[-1]],
                                          name=f"{mask}_upsample_level{depth}", kernel_shape=[stride],
                                          strides=[stride]))
    # Each level's upsampler goes right before its first use: node order stays topological and the
    # toolkit keeps its input rank adapters next to the inputs in the layer table.
    new_nodes, emitted = [], 0
    for original in graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        new_nodes.append(node)
        if not _makes_padding_nonzero(node, level):
            continue
        result, depth = node.output[0], level[node.output[0]]
        new_nodes.extend(upsamplers[emitted:depth])
        emitted = max(emitted, depth)
        node.output[0] = f"{result}_unmasked"
        new_nodes.append(helper.make_node("Mul", [node.output[0], level_masks[depth]], [result],
                                          name=f"{node.name or result}_mask"))
    del graph.node[:]
    graph.node.extend(new_nodes)
    return out

"""InstanceNormalization of any ONNX graph through GlobalAveragePool (torch exports GroupNorm(G, C) as Reshape ->
InstanceNormalization -> Reshape -> Mul -> Add; Wav2Vec2's feature extractor has GroupNorm(512, 512) over 12,799
frames): the NPU lowers the norm's reduction over the frames to a 13-bit register field, GAP is its pooling engine's
own reduction.

The graph-level twin of `rkaudio.surgery.modules.instance_norm` (no mask), in its measured ops:
mean = GAP(x), centred = x + Neg(mean), var = GAP(Pow(centred, 2)), y = centred * (scale * Pow(var + eps, -0.5)) + B.
Pow(., -0.5) because a per-channel Div or Reciprocal lands on the rk3588's CPU; an Add of the negated mean because a
Sub by a computed [N, C, 1] mean lowers as an Expand whose length field overflows on rk3566; Pow(., 2) is one unary
pass where a Mul reads two tensors; the variance of the centred x because E[x^2] - mean^2 cancels in fp32. The
output multiplies the centred x already at hand (two full-tensor passes, as the module's x*s + (B - mean*s), without
its cancellation), and drops the Mul by a scale of ones and the Add of a zero B (GroupNorm's: its affine follows)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import (GraphIndex, constant_value, drop_unused_initializers, inferred_dims, live_nodes,
                                     node_attr)


def _matches(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, int, np.ndarray, np.ndarray]]:
    """(node, rank of its input, scale, B) of each InstanceNormalization with a known input rank and constant
    scale and B."""
    index = GraphIndex(model)
    ranks = {name: len(dims) for name, dims in inferred_dims(model)}
    found = []
    for node in index.nodes:
        if node.op_type != "InstanceNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        scale, bias = constant_value(index, node.input[1]), constant_value(index, node.input[2])
        if ranks.get(node.input[0], 0) >= 3 and scale is not None and bias is not None:
            found.append((node, ranks[node.input[0]], scale, bias))
    return found


def find_instance_norm(model: onnx.ModelProto) -> list[str]:
    """Names of the InstanceNormalization nodes the pass replaces (an unnamed one by its output): the NPU lowers
    their reduction over the frames to a 13-bit register field, where GlobalAveragePool is its own reduction."""
    return [node.name or node.output[0] for node, *_ in _matches(model)]


def _gap_nodes(node: onnx.NodeProto, rank: int, scale: np.ndarray,
               bias: np.ndarray) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes and constants replacing one InstanceNormalization (named after its output)."""
    out = node.output[0]
    prefix = f"{out}/gap_norm"
    nodes, constants = [], []
    channel = (-1,) + (1,) * (rank - 2)  # [C] -> [C, 1, ..]: broadcasts against [N, C, 1, ..] and [N, C, T, ..]

    def name(step: str) -> str:
        return f"{prefix}/{step}"

    def constant(step: str, value: np.ndarray) -> str:
        constants.append(numpy_helper.from_array(np.asarray(value, scale.dtype), name(step)))
        return name(step)

    def op(kind: str, inputs: list[str], step: str, output: str | None = None) -> str:
        nodes.append(helper.make_node(kind, inputs, [output or name(step)], name=name(step)))
        return output or name(step)

    x = node.input[0]
    trivial_scale, zero_bias = bool(np.all(scale == 1)), not np.any(bias)
    centred = op("Add", [x, op("Neg", [op("GlobalAveragePool", [x], "mean")], "negated_mean")], "centred")
    variance = op("GlobalAveragePool", [op("Pow", [centred, constant("two", 2.0)], "squared")], "variance")
    shifted = op("Add", [variance, constant("epsilon", node_attr(node, "epsilon", 1e-5))], "shifted")
    gain = op("Pow", [shifted, constant("minus_half", -0.5)], "inverse_deviation")
    if not trivial_scale:
        gain = op("Mul", [gain, constant("scale", scale.reshape(channel))], "gain")
    normalised = op("Mul", [centred, gain], "normalised", out if zero_bias else None)
    if not zero_bias:
        op("Add", [normalised, constant("bias", bias.reshape(channel))], "shifted_output", out)
    return nodes, constants


def instance_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every InstanceNormalization (constant scale and B, input rank >= 3) computed through
    GlobalAveragePool: the NPU lowers the norm's reduction to a 13-bit register field, GAP is its own reduction."""
    matches = _matches(model)
    if not matches:
        raise ValueError("no InstanceNormalization with constant scale and B and an input of known rank >= 3 in the "
                         "graph: nothing for instance_norm to rewrite")
    replaced, initializers = {}, []
    for node, rank, scale, bias in matches:
        nodes, constants = _gap_nodes(node, rank, scale, bias)
        replaced[node.output[0]] = nodes
        initializers += constants
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rewritten = []
    for node in out.graph.node:
        rewritten += replaced.get(node.output[0], [node]) if node.output else [node]
    del out.graph.node[:]
    out.graph.node.extend(live_nodes(rewritten, {o.name for o in out.graph.output}))
    out.graph.initializer.extend(initializers)
    return drop_unused_initializers(out)

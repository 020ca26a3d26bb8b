"""Fold every node computed from constants alone (initializers, Constant nodes) into an initializer: a weight norm
exported without constant folding (g * v / ||v|| in the graph: ReduceL2 -> Div -> Mul, or a Pow -> ReduceSum -> Sqrt
chain) leaves ReduceL2 nodes that `rknn.build` aborts on, and any other such node is work the NPU repeats per call.

The graph-level twin of `rkaudio.surgery.modules.weight_norm`, for a user ONNX without its model source. The values
are computed by onnx's reference evaluator in each tensor's own dtype (float32 arithmetic for a float32 weight, as
onnxruntime does it, within rounding). Only the tensors a remaining node (or a graph output) reads are stored; a
tensor that is a mere Identity of a constant is read under the constant's name (exporters write shared weights so),
so no weight is stored twice."""
from __future__ import annotations

import onnx
from onnx import numpy_helper

from rkaudio.core.onnx_graph import drop_unused_initializers, live_nodes

# Constant inputs, yet a new value on every call: never folded.
RANDOM_OPS = {"RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}


def _foldable(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes (in graph order) every input of which is a constant or computed from constants only; Constant
    nodes themselves are constants already."""
    constants = {tensor.name for tensor in model.graph.initializer}
    found = []
    for node in model.graph.node:  # topological order: a node's inputs are classified before it
        if node.op_type == "Constant":
            constants.update(node.output)
        elif (node.input and all(name == "" or name in constants for name in node.input)
              and node.domain in ("", "ai.onnx") and node.op_type not in RANDOM_OPS):
            constants.update(node.output)
            found.append(node)
    return found


def find_weight_fold(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes the pass folds (an unnamed one by its first output): a weight norm left in the graph
    traces to ReduceL2 nodes that `rknn.build` aborts on."""
    return [node.name or node.output[0] for node in _foldable(model)]


def weight_fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every node computed from constants alone replaced by its value as an initializer: a weight norm
    left in the graph traces to ReduceL2 nodes that `rknn.build` aborts on."""
    from onnx.reference import ReferenceEvaluator

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    folded = _foldable(out)
    if not folded:
        raise ValueError("no node computed from constants alone in the graph: nothing for weight_fold to fold")
    folded_outputs = {name for node in folded for name in node.output}
    kept = [node for node in graph.node if not any(name in folded_outputs for name in node.output)]
    graph_outputs = {o.name for o in graph.output}
    read = {name for node in kept for name in node.input} | graph_outputs
    stored = [name for node in folded for name in node.output if name in read]
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    sources = {name for node in folded for name in node.input}
    fed = sorted(sources & initializers.keys())
    constant_nodes = [node for node in graph.node if node.op_type == "Constant" and node.output[0] in sources]
    evaluator = ReferenceEvaluator(onnx.helper.make_model(
        onnx.helper.make_graph(constant_nodes + folded, "weight_fold",
                               [onnx.helper.make_empty_tensor_value_info(name) for name in fed],
                               [onnx.helper.make_empty_tensor_value_info(name) for name in stored]),
        opset_imports=list(out.opset_import)))
    results = evaluator.run(None, {name: numpy_helper.to_array(initializers[name]) for name in fed})

    constants = initializers.keys() | {node.output[0] for node in graph.node if node.op_type == "Constant"}
    aliases = _identity_aliases(folded, constants, graph_outputs)
    for node in kept:
        node.input[:] = [aliases.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(live_nodes(kept, graph_outputs))
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in zip(stored, results)
                             if name not in aliases)
    used = {tensor.name for tensor in drop_unused_initializers(out).graph.initializer}
    stale = [value for value in graph.input if value.name in initializers and value.name not in used]
    for value in stale:  # an old exporter lists initializers as graph inputs too: drop the ones folded away
        graph.input.remove(value)
    return out


def _identity_aliases(folded: list[onnx.NodeProto], constants, graph_outputs: set[str]) -> dict[str, str]:
    """Output of a folded Identity chain -> the constant it copies (outputs of the graph keep their own name)."""
    aliases: dict[str, str] = {}
    for node in folded:
        source = aliases.get(node.input[0], node.input[0]) if node.input else None
        if node.op_type == "Identity" and source in constants and node.output[0] not in graph_outputs:
            aliases[node.output[0]] = source
    return aliases

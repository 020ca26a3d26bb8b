"""Cut a graph at named tensors, and find the VITS decoder-half seam by structure.

The runtime of a VITS-style TTS (Piper, Inflect) hands the NPU the pre-flow latent `z [1,C,N]`,
its frame mask `y_mask [1,1,N]` and, for multi-speaker voices, `g [1,gin,1]`; the engine runs the
reverse flow and the waveform decoder. Exporters name those tensors differently (and leave flow
nodes unnamed), so the seam is located from the graph's shape: the decoder's first ConvTranspose,
the conv (`conv_pre`) in front of it, and the chain of coupling layers (Split -> ... -> Concat,
with channel flips in between) that produces the decoder's input."""
from __future__ import annotations

from dataclasses import dataclass

import onnx


class SeamError(ValueError):
    """The graph does not have the structure the seam finder looks for."""


@dataclass(frozen=True)
class Seam:
    latent: str             # pre-flow latent z: input of the reverse flow's first op
    mask: str               # frame mask multiplied into every coupling layer
    cond: str | None        # speaker conditioning g (None for single-speaker graphs)
    decoder_input: str      # input of the decoder's first conv (post-flow samples: the wrong seam)
    output: str             # waveform
    coupling_layers: int


class GraphIndex:
    """Producer/consumer lookups for one graph."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.model = model
        self.nodes = list(graph.node)
        self.producer = {out: node for node in self.nodes for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {init.name for init in graph.initializer}
        self.graph_inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self._constants = set(self.initializers)
        for node in self.nodes:  # topological order: a node's inputs are classified before it
            if node.op_type == "Constant" or (node.input and all(i == "" or i in self._constants for i in node.input)):
                self._constants.update(node.output)

    def is_constant(self, name: str) -> bool:
        """True for initializers, Constant outputs and tensors computed from constants only."""
        return name == "" or name in self._constants

    def descendants(self, sources: set[str]) -> set[str]:
        """Every tensor computed (transitively) from `sources`, sources included."""
        reached = set(sources)
        for node in self.nodes:  # nodes are topologically sorted in a valid ONNX graph
            if any(i in reached for i in node.input):
                reached.update(node.output)
        return reached

    def ancestor_nodes(self, outputs: list[str], stop: set[str]) -> list[onnx.NodeProto]:
        """Nodes needed to compute `outputs` when the `stop` tensors are given."""
        needed, stack = set(), [o for o in outputs if o not in stop]
        while stack:
            node = self.producer.get(stack.pop())
            if node is None or id(node) in needed:
                continue
            needed.add(id(node))
            stack.extend(i for i in node.input if i and i not in stop)
        return [n for n in self.nodes if id(n) in needed]


def node_attr(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def constant_value(index: GraphIndex, name: str):
    """Value of a constant tensor (initializer or Constant node), else None."""
    from onnx import numpy_helper

    for init in index.model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = index.producer.get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def is_reversal(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """A channel flip as exporters write `torch.flip`: a Slice with a negative constant step."""
    if node.op_type != "Slice" or len(node.input) < 5:
        return False
    steps = constant_value(index, node.input[4])
    return steps is not None and bool((steps < 0).any())


def find_decoder_input(index: GraphIndex) -> tuple[str, onnx.NodeProto]:
    """The input tensor of the conv in front of the first upsampling ConvTranspose (HiFi-GAN's conv_pre)."""
    upsamplers = [n for n in index.nodes if n.op_type == "ConvTranspose"]
    if not upsamplers:
        raise SeamError("graph has no ConvTranspose: not a VITS/HiFi-GAN decoder (no upsampling layer found)")
    tensor = upsamplers[0].input[0]
    for _ in range(16):  # conv_pre -> [+cond] -> LeakyRelu -> ups.0: a few element-wise steps at most
        node = index.producer.get(tensor)
        if node is None:
            break
        if node.op_type == "Conv":
            return node.input[0], node
        data = [i for i in node.input if i and not index.is_constant(i)]
        if not data:
            break
        tensor = data[0]
    raise SeamError("no Conv (conv_pre) in front of the first ConvTranspose: not a VITS/HiFi-GAN decoder")


def find_vits_seam(model: onnx.ModelProto) -> Seam:
    """Locate z, y_mask, g and the waveform output of a VITS graph by structure; SeamError if absent."""
    index = GraphIndex(model)
    if len(model.graph.output) < 1:
        raise SeamError("graph has no output")
    output = model.graph.output[0].name
    decoder_input, _ = find_decoder_input(index)

    # The decoder input is Mul(flow_out, mask) in VITS; walk back through the coupling chain.
    head = index.producer.get(decoder_input)
    flow_out, mask = decoder_input, None
    if head is not None and head.op_type == "Mul":
        concat_side = [i for i in head.input if (p := index.producer.get(i)) is not None and p.op_type == "Concat"]
        if concat_side:
            flow_out = concat_side[0]
            mask = next(i for i in head.input if i != flow_out)
    tensor, couplings = flow_out, 0
    while True:
        node = index.producer.get(tensor)
        if node is None:
            break
        if is_reversal(index, node):
            tensor = node.input[0]
            continue
        if node.op_type == "Concat" and len(node.input) == 2:
            split = index.producer.get(node.input[0])
            if split is None or split.op_type not in ("Split", "Slice"):
                break
            couplings += 1
            if mask is None:
                mask = _coupling_mask(index, node, split)
            tensor = split.input[0]
            continue
        break
    if couplings == 0:
        raise SeamError("no reverse-flow coupling layers (Split -> ... -> Concat) feed the decoder: "
                        "not a VITS graph, or the flow is already cut away")
    if mask is None:
        raise SeamError("found the flow but no frame mask multiplying its coupling layers")
    latent = tensor
    cond = _find_cond(index, latent, mask, output)
    return Seam(latent, mask, cond, decoder_input, output, couplings)


def _coupling_mask(index: GraphIndex, concat: onnx.NodeProto, split: onnx.NodeProto) -> str | None:
    """The mask operand of the Mul that produces the coupling layer's transformed half."""
    mul = index.producer.get(concat.input[1])
    if mul is None or mul.op_type != "Mul":
        return None
    from_split = index.descendants(set(split.output))
    others = [i for i in mul.input if i not in from_split and not index.is_constant(i)]
    return others[0] if len(others) == 1 else None


def _find_cond(index: GraphIndex, latent: str, mask: str, output: str) -> str | None:
    """The one non-constant tensor besides z and mask the decoder half reads (speaker embedding g)."""
    region = index.ancestor_nodes([output], stop={latent, mask})
    inside = index.descendants({latent, mask})
    frontier = set()
    for node in region:
        if not any(o in inside for o in node.output):
            continue
        for name in node.input:
            if name and name not in inside and not index.is_constant(name):
                frontier.add(name)
    if not frontier:
        return None
    # The speaker embedding reaches the flow and decoder through their own cond convs and slices, so
    # the frontier holds many tensors; g is their latest common ancestor.
    common = set.intersection(*(_ancestor_tensors(index, name) for name in frontier))
    if not common:
        raise SeamError(f"decoder half reads outside tensors {sorted(frontier)} with no common origin; "
                        "expected only a speaker embedding")
    position = {out: i for i, node in enumerate(index.nodes) for out in node.output}
    return max(common, key=lambda name: position.get(name, -1))


def _ancestor_tensors(index: GraphIndex, name: str) -> set[str]:
    """`name` and every non-constant tensor it is computed from."""
    found, stack = set(), [name]
    while stack:
        tensor = stack.pop()
        if tensor in found or index.is_constant(tensor):
            continue
        found.add(tensor)
        node = index.producer.get(tensor)
        if node is not None:
            stack.extend(i for i in node.input if i)
    return found


def cut(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """The subgraph from the `inputs` tensors to the `outputs` tensors; raises SeamError if the outputs
    need any other non-constant tensor. The new inputs are float with no shape (set them after the cut);
    metadata and value_info are not carried over (stale shapes would override pinned ones)."""
    index = GraphIndex(model)
    missing = [n for n in inputs + outputs if n not in index.producer and n not in index.graph_inputs]
    if missing:
        raise SeamError(f"no tensor named {missing} in the graph")
    needed = index.ancestor_nodes(outputs, stop=set(inputs))
    leaks = sorted({i for n in needed for i in n.input if i and i in index.graph_inputs and i not in inputs})
    if leaks:
        raise SeamError(f"cutting at {inputs} still needs graph inputs {leaks}: the cut does not separate the graph")
    used = {i for n in needed for i in n.input}
    graph_outputs = {o.name: o for o in model.graph.output}
    graph = onnx.helper.make_graph(
        needed, model.graph.name or "cut",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs],
        [graph_outputs.get(name) or onnx.helper.make_empty_tensor_value_info(name) for name in outputs],
        [init for init in model.graph.initializer if init.name in used])
    extracted = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    extracted.ir_version = model.ir_version
    return extracted


def cut_at_seam(model: onnx.ModelProto, seam: Seam) -> onnx.ModelProto:
    """The reverse flow + decoder: inputs (z, y_mask[, g]) -> waveform."""
    inputs = [seam.latent, seam.mask] + ([seam.cond] if seam.cond else [])
    return cut(model, inputs, [seam.output])


def rename_tensors(model: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    """Rename tensors everywhere they appear (graph inputs/outputs, node inputs/outputs, value_info)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for node in graph.node:
        node.input[:] = [names.get(i, i) for i in node.input]
        node.output[:] = [names.get(o, o) for o in node.output]
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        info.name = names.get(info.name, info.name)
    return out

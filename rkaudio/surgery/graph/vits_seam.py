"""Find the VITS decoder-half seam by structure, and cut a graph there.

The runtime of a VITS-style TTS (Piper, Inflect) hands the NPU the pre-flow latent `z [1,C,N]`,
its frame mask `y_mask [1,1,N]` and, for multi-speaker voices, `g [1,gin,1]`; the engine runs the
reverse flow and the waveform decoder. Exporters name those tensors differently (and leave flow
nodes unnamed), so the seam is located from the graph's shape: the decoder's first ConvTranspose,
the conv (`conv_pre`) in front of it, and the chain of coupling layers (Split -> ... -> Concat,
with channel flips in between) that produces the decoder's input."""
from __future__ import annotations

from dataclasses import dataclass

import onnx

from rkaudio.core.onnx_graph import CutError, GraphIndex, cut, is_reversal


class SeamError(CutError):
    """The graph does not have the structure the seam finder looks for."""


@dataclass(frozen=True)
class Seam:
    latent: str             # pre-flow latent z: input of the reverse flow's first op
    mask: str               # frame mask multiplied into every coupling layer
    cond: str | None        # speaker conditioning g (None for single-speaker graphs)
    decoder_input: str      # input of the decoder's first conv (post-flow samples: the wrong seam)
    output: str             # waveform
    coupling_layers: int


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
    return max(common, key=lambda name: index.producer_position.get(name, -1))


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


def cut_at_seam(model: onnx.ModelProto, seam: Seam) -> onnx.ModelProto:
    """The reverse flow + decoder: inputs (z, y_mask[, g]) -> waveform."""
    inputs = [seam.latent, seam.mask] + ([seam.cond] if seam.cond else [])
    return cut(model, inputs, [seam.output])

"""A VITS decoder (reverse flow + HiFi-GAN) as a fixed-window engine graph: the export half of the VITS window kind
Piper and Inflect share (rkaudio.board.vits.VitsWindow, its contract).

Why the NPU needs it: RKNN has no dynamic shapes, so the engine is the decoder compiled for one latent window, which
the runtime walks along the latent (rkaudio.board.window_walk). `slice_at_flow` cuts the graph at its reverse flow's
input (the latent z, its frame mask y_mask and, for a multi-speaker voice, the speaker embedding g) with the length
left dynamic: that slice is also the full-length reference a family can judge the window against. `fixed_window`
folds the flow's channel flips (rkaudio.surgery.graph.flip_fold), optionally masks the decoder half
(rkaudio.surgery.graph.mask), puts the upsampling levels in the phase forms the target needs
(rkaudio.surgery.graph.stride_phase) and pins the shapes at the window. Each step is exact."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkaudio.board.vits import VitsWindow
from rkaudio.board.window_walk import WindowSpan
from rkaudio.core.errors import SetupError

# onnx and the passes are imported where a graph is rewritten: a family's declaration imports this module's names,
# and a command's --help should not load onnx.

LATENT, MASK, COND = "z", "y_mask", "g"  # the engine's inputs: the latent, its frame mask, the speaker embedding


@dataclass(frozen=True)
class Refusals:
    """What a family says when its graph is not the VITS decoder it slices: `str.format` templates."""

    no_seam: str             # {error}: the graph has no reverse-flow seam
    cond: str | None = None  # {cond}: the graph reads a speaker embedding, which the family refuses (None: kept)
    flip: str | None = None  # {error}: a channel flip that cannot be folded (None: the FlipFoldError itself)


@dataclass(frozen=True)
class VitsSlice:
    """The dynamic-length slice (z, y_mask[, g]) -> waveform of a VITS graph, and what was learnt from it."""

    model: "onnx.ModelProto"   # N dynamic, the flips not folded: the full-length decode of the graph's own nodes
    seam: "Seam"               # where it was cut (names in the original graph)
    channels: int              # the latent's width C
    cond_channels: int | None  # the speaker embedding's width (None: one speaker)
    strides: list[int]         # the stride of each upsampling level
    hop: int                   # waveform samples per latent slice
    decoder_input: str         # conv_pre's input inside the slice: where the decoder half starts


@dataclass(frozen=True)
class FixedWindow:
    """The engine graph of one window (its contract not set: the family states it from `window`)."""

    model: "onnx.ModelProto"  # shapes pinned at the window
    window: VitsWindow        # the window contract's fields
    nodes_before_fold: int    # nodes of the rewritten slice before its shapes were pinned and folded


def slice_at_flow(model: "onnx.ModelProto", refusals: Refusals, channels: int | None = None,
                  hop: int | None = None) -> VitsSlice:
    """Cut a VITS graph at its reverse flow's input, found by structure: inputs z [1,C,N], y_mask [1,1,N] and a
    speaker embedding g [1,G,1] (unless `refusals.cond` refuses it). `channels` (C) and `hop` where the family
    knows them from its own files, else conv_pre's input width and the product of the upsampling strides."""
    import onnx

    from rkaudio.core.onnx_graph import GraphIndex, rename_tensors
    from rkaudio.surgery.graph.mask import level_strides
    from rkaudio.surgery.graph.vits_seam import SeamError, cut_at_seam, find_decoder_input, find_vits_seam

    try:
        seam = find_vits_seam(model)
        sliced = cut_at_seam(model, seam)
    except SeamError as error:
        raise SetupError(refusals.no_seam.format(error=error)) from None
    if seam.cond is not None and refusals.cond is not None:
        raise SetupError(refusals.cond.format(cond=seam.cond))
    if channels is None:
        _, conv_pre = find_decoder_input(GraphIndex(sliced))
        channels = int(next(init for init in sliced.graph.initializer if init.name == conv_pre.input[1]).dims[1])
    names = {seam.latent: LATENT, seam.mask: MASK, **({seam.cond: COND} if seam.cond else {})}
    sliced = rename_tensors(sliced, names)
    cond_channels = _cond_channels(sliced) if seam.cond else None
    shapes = {LATENT: [1, channels, "N"], MASK: [1, 1, "N"], COND: [1, cond_channels, 1]}
    for graph_input in sliced.graph.input:  # the cut leaves them shapeless
        graph_input.CopyFrom(onnx.helper.make_tensor_value_info(graph_input.name, onnx.TensorProto.FLOAT,
                                                                shapes[graph_input.name]))
    decoder_input = names.get(seam.decoder_input, seam.decoder_input)
    strides = level_strides(sliced, decoder_input)
    return VitsSlice(sliced, seam, channels, cond_channels, strides, int(np.prod(strides)) if hop is None else hop,
                     decoder_input)


def _cond_channels(model: "onnx.ModelProto") -> int:
    """Input channels of the convs that read g (the speaker embedding's width)."""
    weights = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[0] == COND:
            return int(weights[node.input[1]].dims[1])
    raise SetupError("the multi-speaker slice has a g input but no conv reads it directly")


def fixed_window(piece: VitsSlice, window: int, context: int, refusals: Refusals, *, sample_rate: int,
                 dec_mask: bool, target: str | None, stride_phase_levels: int = 0,
                 cap_padding: bool = False) -> FixedWindow:
    """The engine graph of `window` latent slices walked with `context` on each side: the flips folded, the decoder
    half masked with `dec_mask`, the upsampling levels whose full-rate axis overflows `target`'s time field in
    polyphase form and the first `stride_phase_levels` as stride-phase Convs (rkaudio.surgery.graph.stride_phase),
    the shapes pinned at the window, and with `cap_padding` every wide conv padding as zeros concatenated
    (rkaudio.surgery.graph.conv_pad; the engines of a family that shipped without it stay as they were)."""
    from rkaudio.surgery.graph.conv_pad import cap_conv_padding
    from rkaudio.surgery.graph.flip_fold import FlipFoldError, fold_flips
    from rkaudio.surgery.graph.fold import fold_fixed
    from rkaudio.surgery.graph.mask import mask_decoder
    from rkaudio.surgery.graph.polyphase_levels import overflowing_levels
    from rkaudio.surgery.graph.stride_phase import upsamplers_in_phase_forms

    if WindowSpan.two_sided(window, context).emitted < 1:
        raise SetupError(f"--window {window} leaves no emitted slices with --context {context} on each side "
                         f"(need window > 2*context)")
    try:
        model = fold_flips(piece.model)
    except FlipFoldError as error:
        if refusals.flip is None:
            raise
        raise SetupError(refusals.flip.format(error=error)) from None
    if dec_mask:
        model = mask_decoder(model, piece.decoder_input, MASK)
    model, phases = upsamplers_in_phase_forms(model, piece.decoder_input, piece.strides,
                                              overflowing_levels(target, window, piece.strides), stride_phase_levels)
    shapes = {LATENT: [1, piece.channels, window], MASK: [1, 1, window]}
    if piece.cond_channels:
        shapes[COND] = [1, piece.cond_channels, 1]
    folded = fold_fixed(model, shapes)
    if cap_padding:
        folded = cap_conv_padding(folded)
    fields = VitsWindow.two_sided(window, context, hop=piece.hop, latent_input=LATENT,
                                  output=folded.graph.output[0].name, mask_input=MASK, latent_channels=piece.channels,
                                  sample_rate=sample_rate, dec_mask=dec_mask, strides=piece.strides, polyphase=phases,
                                  stride_phase_levels=stride_phase_levels)
    return FixedWindow(folded, fields, len(model.graph.node))

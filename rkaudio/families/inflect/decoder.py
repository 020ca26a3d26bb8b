"""Inflect v2 decoder slice: check the official files, cut decode.onnx at the pre-flow latent, mask
the decoder half, fold at the window, and gate the windowed decode against a full-length one.

The noise head of decode.onnx (`z = m_p + exp(logs_p) * zp_noise * noise_scale`) stays outside the
slice: the runtime draws the noise itself (`noise_head`) and hands the engine the finished latent."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rkaudio.families.inflect.defaults import FAMILY, MIN_INTERIOR_DB, MIN_TAIL_DB
from rkaudio.core.errors import SetupError
from rkaudio.board.inflect import (DEFAULT_VARIATION, OFFICIAL_HINT, InflectModel, config_beside, config_values,
                                   noise_head, prior_stats)
from rkaudio.host.inflect import check_duration, io_names, latent_channels, load_official

COMPONENT = "decoder"
ROLE = "main"
EXEC_PLAN_OPTION = "inflect_v2.exec_plan"
DECODE_INPUTS = ("m_p_exp", "logs_p_exp", "y_mask", "zp_noise", "noise_scale")
DECODE_OUTPUT = "waveform"
LATENT_INPUT, MASK_INPUT = "z", "y_mask"
N_SYMBOLS = 178  # token vocabulary of both sizes (0 is the blank)
TAIL_LENGTHS = (30, 47, 91, 210)
# Full scale of every comparison (rkaudio.board.numeric.degenerate_reference): the waveform, tanh-bounded audio.
FULL_SCALE = 1.0
INTERIOR_LENGTH = 480  # slices, as the spec measured: first, one interior and a last window at 256/32


def load_decode(path: Path):
    """decode.onnx checked for the official I/O; returns (ModelProto, latent channels). A missing, truncated or
    non-ONNX file (or one with a NaN/Inf constant) is refused in one line naming it (`load_official`)."""
    path = Path(path)
    model = load_official(path, "decode.onnx")
    inputs, outputs = io_names(model.graph.input), io_names(model.graph.output)
    missing = [name for name in DECODE_INPUTS if name not in inputs]
    if missing or DECODE_OUTPUT not in outputs:
        raise SetupError(
            f"{path} is not an Inflect v2 decode.onnx: it has inputs {inputs} and outputs {outputs}, "
            f"expected inputs {list(DECODE_INPUTS)} and output '{DECODE_OUTPUT}' "
            f"(missing: {missing or [DECODE_OUTPUT]}); {OFFICIAL_HINT}")
    m_p = next(v for v in model.graph.input if v.name == "m_p_exp")
    return model, latent_channels(m_p, path, "decode.onnx")


def decode_feeds(latent: np.ndarray) -> dict[str, np.ndarray]:
    """decode.onnx's inputs for a finished latent: the noise head made the identity, the mask all ones."""
    latent = np.asarray(latent, dtype=np.float32)
    zeros = np.zeros_like(latent)
    mask = np.ones((1, 1, latent.shape[2]), dtype=np.float32)
    return {"m_p_exp": latent, "logs_p_exp": zeros, "y_mask": mask, "zp_noise": zeros,
            "noise_scale": np.array(0.0, np.float32)}


def full_decode(decode, latent: np.ndarray) -> np.ndarray:
    """decode.onnx (a backend) on a finished latent: the full-length fp32 reference."""
    return decode.run(decode_feeds(latent), [DECODE_OUTPUT])[DECODE_OUTPUT]


def decode_floor(decode_model, latent: np.ndarray, reference: np.ndarray) -> float:
    """The checkpoint's fp32 floor on `latent`: `reference` (decode.onnx's fp32 full decode) against decode.onnx
    run in float64 (rkaudio.gates.fp32_floor.float64_run), in dB."""
    from rkaudio.gates.fp32_floor import float64_run
    from rkaudio.board.numeric import snr_db

    return snr_db(float64_run(decode_model, decode_feeds(latent))[DECODE_OUTPUT], reference)


def describe(decode_path: Path, duration_path: Path | None) -> tuple["onnx.ModelProto", InflectModel]:
    """Load and cross-check the official files; the hop is measured by decoding a short latent."""
    from rkaudio.host.backends import OnnxBackend

    model, channels = load_decode(decode_path)
    if duration_path is not None:
        check_duration(duration_path, channels)
    probe_slices = 4
    samples = full_decode(OnnxBackend(model), np.zeros((1, channels, probe_slices), np.float32)).shape[-1]
    return model, InflectModel(channels, samples // probe_slices, config_values(config_beside(decode_path))[1])


def _declare_inputs(model, channels: int):
    """Type the cut's inputs (it leaves them shapeless): z [1,C,N], y_mask [1,1,N]."""
    import onnx

    shapes = {LATENT_INPUT: [1, channels, "N"], MASK_INPUT: [1, 1, "N"]}
    for graph_input in model.graph.input:
        graph_input.CopyFrom(onnx.helper.make_tensor_value_info(graph_input.name, onnx.TensorProto.FLOAT,
                                                                shapes[graph_input.name]))
    return model


def slice_decoder(decode_model, model: InflectModel, window: int, context: int, dec_mask: bool = True,
                  target: str | None = None, stride_phase_levels: int = 0):
    """decode.onnx -> fixed-window engine graph z [1,C,W], y_mask [1,1,W] -> waveform, folded, with its contract;
    the upsampling levels whose full-rate axis overflows `target`'s time field run in polyphase form, the first
    `stride_phase_levels` as a stride-phase Conv and an interleave (rkaudio.surgery.graph.stride_phase)."""
    from rkaudio.core.contract import make_contract
    from rkaudio.surgery.graph.conv_pad import cap_conv_padding
    from rkaudio.board.window_walk import WindowContract
    from rkaudio.surgery.graph.flip_fold import FlipFoldError, fold_flips
    from rkaudio.surgery.graph.fold import fold_fixed
    from rkaudio.surgery.graph.mask import level_strides, mask_decoder
    from rkaudio.surgery.graph.polyphase_levels import overflowing_levels
    from rkaudio.surgery.graph.stride_phase import upsamplers_in_phase_forms
    from rkaudio.core.contract import set_contract
    from rkaudio.surgery.graph.vits_seam import SeamError, cut_at_seam, find_vits_seam
    from rkaudio.core.onnx_graph import rename_tensors

    walk_contract = WindowContract(window=window, context=context, emitted=window - 2 * context, hop=model.hop,
                                   latent_input=LATENT_INPUT, output=DECODE_OUTPUT, mask_input=MASK_INPUT,
                                   latent_channels=model.channels)
    try:
        seam = find_vits_seam(decode_model)
        sliced = cut_at_seam(decode_model, seam)
    except SeamError as error:
        raise SetupError(f"decode.onnx has no reverse-flow seam to cut at: {error}; {OFFICIAL_HINT}") from None
    if seam.cond is not None:
        raise SetupError(f"decode.onnx reads a conditioning tensor {seam.cond!r} besides the latent and mask: "
                         f"Inflect v2 is single-speaker; {OFFICIAL_HINT}")
    sliced = _declare_inputs(rename_tensors(sliced, {seam.latent: LATENT_INPUT, seam.mask: MASK_INPUT}),
                             model.channels)
    try:
        sliced = fold_flips(sliced)
    except FlipFoldError as error:
        raise SetupError(f"decode.onnx's reverse flow has a channel flip that cannot be folded: {error}") from None
    if dec_mask:
        sliced = mask_decoder(sliced, seam.decoder_input, MASK_INPUT)
    strides = level_strides(sliced, seam.decoder_input)
    sliced, phases = upsamplers_in_phase_forms(sliced, seam.decoder_input, strides,
                                               overflowing_levels(target, window, strides), stride_phase_levels)
    folded = cap_conv_padding(fold_fixed(sliced, {LATENT_INPUT: [1, model.channels, window],
                                                  MASK_INPUT: [1, 1, window]}))
    contract = make_contract(FAMILY, COMPONENT, ROLE, EXEC_PLAN_OPTION, **walk_contract.fields(),
                             sample_rate=model.sample_rate, dec_mask=dec_mask, strides=strides,
                             polyphase=phases, stride_phase_levels=stride_phase_levels,
                             nodes_before_fold=len(sliced.graph.node), nodes_after_fold=len(folded.graph.node))
    return set_contract(folded, contract)


# ---------------------------------------------------------------- self-check gates

def prior_latent(duration, slices: int, variation: float = DEFAULT_VARIATION, seed: int = 0) -> np.ndarray:
    """The model's own prior sample of `slices` slices: duration.onnx (a backend) on random
    blank-interleaved tokens, then the noise head; cropped to `slices`."""
    rng = np.random.default_rng(seed)
    symbols = 8
    while True:
        phonemes = rng.integers(1, N_SYMBOLS, symbols)
        tokens = np.zeros((1, 2 * symbols + 1), dtype=np.int64)
        tokens[0, 1::2] = phonemes  # blank (0) between and around the symbols
        m_p, logs_p = prior_stats(duration, tokens)
        if m_p.shape[2] >= slices:
            return noise_head(m_p, logs_p, variation, rng)[:, :, :slices]
        symbols *= 2


def windowed_decode(backend, latent: np.ndarray, window: int, context: int, hop: int):
    """The runtime's walk of `latent` over a fixed-window backend at `context` (emitted = window - 2*context)."""
    from rkaudio.board.window_walk import WindowContract, walk

    contract = WindowContract(window=window, context=context, emitted=window - 2 * context, hop=hop,
                              latent_input=LATENT_INPUT, output=DECODE_OUTPUT, mask_input=MASK_INPUT)
    return walk(backend, latent, contract)


def tail_figures(backend, decode, latents: dict[int, np.ndarray], window: int, context: int,
                 hop: int) -> dict[int, tuple[float, np.ndarray]]:
    """Per short latent: (SNR in dB of its windowed decode against a full-length decode.onnx decode, that
    full-length decode, the reference the gate judges)."""
    from rkaudio.board.numeric import snr_db

    out = {}
    for n, z in latents.items():
        reference = full_decode(decode, z)
        out[n] = (snr_db(reference, windowed_decode(backend, z, window, context, hop).output), reference)
    return out


def interior_figures(backend, decode, latent: np.ndarray, window: int, context: int,
                     hop: int) -> tuple[dict[int, float], np.ndarray]:
    """(SNR in dB per interior window (neither first nor last) against a full-length decode, that whole
    full-length decode: the reference the gate judges once, never one window of it)."""
    from rkaudio.board.numeric import snr_db

    reference = full_decode(decode, latent)
    result = windowed_decode(backend, latent, window, context, hop)
    return {w.index: snr_db(reference[..., result.span(w)], result.output[..., result.span(w)])
            for w in result.windows if w.kind == "interior"}, reference


def context_table(backend, decode, latent: np.ndarray, window: int, contexts, hop: int) -> dict[int, float]:
    """Global SNR of the whole windowed decode against a full-length decode, per context width."""
    from rkaudio.board.numeric import snr_db

    reference = full_decode(decode, latent)
    return {c: snr_db(reference, windowed_decode(backend, latent, window, c, hop).output) for c in contexts}


def optional_backend(path: Path | None):
    """onnxruntime over an official file, or None when it was not given."""
    from rkaudio.host.backends import OnnxBackend

    return None if path is None else OnnxBackend(path)


def selfcheck_latent(duration, channels: int, slices: int, seed: int) -> np.ndarray:
    """The model's own prior sample when duration.onnx (a backend) is at hand, else a white-noise latent."""
    if duration is not None:
        return prior_latent(duration, slices, seed=seed)
    return np.random.default_rng(seed).standard_normal((1, channels, slices)).astype(np.float32)


def selfcheck_verdicts(onnx_path: Path, decode_path: Path | None, duration_path: Path | None,
                       min_tail_db: float = MIN_TAIL_DB, min_interior_db: float = MIN_INTERIOR_DB,
                       say=print) -> list:
    """Windowed decode through the fixed-window slice against a full-length decode.onnx decode.

    Tails are gated only with the decoder-half mask (without it their deficit is the documented
    trade and is only reported). Each gate is held to its level, or to the checkpoint's fp32 floor on the same
    latent (`decode_floor`) less the margin where that is lower (rkaudio.gates.fp32_floor). Without decode.onnx the check
    degrades, and says so."""
    from rkaudio.core.contract import get_contract
    from rkaudio.gates.fp32_floor import floor_verdict
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.board.verdict import judged
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.window_walk import WindowContract

    contract = get_contract(onnx_path)
    walk = WindowContract.from_contract(contract)
    channels = walk.latent_channels
    decode_model, decode_channels = load_decode(decode_path) if decode_path is not None else (None, channels)
    if decode_channels != channels:
        raise SetupError(f"{decode_path} takes latents of {decode_channels} channels but the slice "
                         f"{Path(onnx_path).name} was cut for {channels}: give the decode.onnx it was made from")
    if duration_path is not None:
        check_duration(duration_path, channels)
    backend = OnnxBackend(onnx_path)
    duration = optional_backend(duration_path)
    if decode_model is None:
        say("note: no decode.onnx given, so there is no full-length reference: the self-check degrades to one "
            "window-length latent decoded against itself (seams and tails are not checked)")
        latent = selfcheck_latent(duration, channels, walk.window, seed=1)
        direct = backend.run({walk.latent_input: latent,
                              walk.mask_input: np.ones((1, 1, walk.window), np.float32)})[walk.output]
        walked = windowed_decode(backend, latent, walk.window, walk.context, walk.hop).output
        return [snr_verdict("window_self_snr", direct, walked, min_interior_db,
                            "one window-length latent, walk vs direct run (degraded: no decode.onnx)", FULL_SCALE)]
    verdicts, decode = [], OnnxBackend(decode_model)
    # Long enough for at least one interior window at any context.
    length = max(INTERIOR_LENGTH, 2 * (walk.window - walk.context) + 1)
    latent = selfcheck_latent(duration, channels, length, seed=INTERIOR_LENGTH)
    interior, reference = interior_figures(backend, decode, latent, walk.window, walk.context, walk.hop)
    # One floor for every gate, on the longest latent: the tails' latents are drawn from the same prior and
    # measure within 0.2 dB of it (Nano 131.1-131.3 dB, Micro 135.3-135.5), and each float64 decode costs about
    # ten times its fp32 one (31 s for these 480 slices).
    floor = decode_floor(decode_model, latent, reference)
    latents = {n: selfcheck_latent(duration, channels, n, seed=n) for n in TAIL_LENGTHS}
    tails = tail_figures(backend, decode, latents, walk.window, walk.context, walk.hop)
    for n, (snr, tail_reference) in tails.items():
        if contract.get("dec_mask"):
            verdicts.append(judged(floor_verdict(f"tail_snr[{n}]", snr, min_tail_db, floor,
                                                 f"{n}-slice latent vs full-length decode.onnx"),
                                   tail_reference, FULL_SCALE))
        else:
            say(f"note: tail {n} slices: {snr:.1f} dB vs full-length decode (--no-dec-mask: not gated)")
    # The worst window is the figure; the whole full-length decode is what is judged for silence.
    verdicts.append(judged(floor_verdict("interior_snr_min", min(interior.values()), min_interior_db, floor,
                                         f"{len(interior)} interior window(s) of a {length}-slice latent"),
                           reference, FULL_SCALE))
    return verdicts


"""Inflect v2 decoder slice: check the official files, cut decode.onnx at the pre-flow latent, mask
the decoder half, fold at the window (the VITS window kind, rkaudio.surgery.graph.vits_window), and gate the
windowed decode against a full-length one (rkaudio.gates.walk_vs_full).

The noise head of decode.onnx (`z = m_p + exp(logs_p) * zp_noise * noise_scale`) stays outside the
slice: the runtime draws the noise itself (`noise_head`) and hands the engine the finished latent."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rkaudio.families.inflect.defaults import MIN_INTERIOR_DB, MIN_TAIL_DB
from rkaudio.core.errors import SetupError
from rkaudio.board.inflect import (DEFAULT_VARIATION, OFFICIAL_HINT, InflectModel, InflectWindow, config_beside,
                                   config_values, noise_head, prior_stats)
from rkaudio.board.window_walk import WindowContract, walk
from rkaudio.host.inflect import check_duration, io_names, latent_channels, load_official
from rkaudio.surgery.graph.vits_window import Refusals, fixed_window, slice_at_flow

DECODE_INPUTS = ("m_p_exp", "logs_p_exp", "y_mask", "zp_noise", "noise_scale")
DECODE_OUTPUT = "waveform"
REFUSALS = Refusals(
    no_seam="decode.onnx has no reverse-flow seam to cut at: {error}; " + OFFICIAL_HINT,
    cond="decode.onnx reads a conditioning tensor {cond!r} besides the latent and mask: Inflect v2 is single-speaker; "
    + OFFICIAL_HINT,
    flip="decode.onnx's reverse flow has a channel flip that cannot be folded: {error}")
N_SYMBOLS = 178  # token vocabulary of both sizes (0 is the blank)
TAIL_LENGTHS = (30, 47, 91, 210)
# Full scale of the degraded self-check's comparison (rkaudio.board.numeric.degenerate_reference): the waveform,
# tanh-bounded audio, as the walk-vs-full gates judge it (rkaudio.gates.walk_vs_full).
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
    run in float64, in dB."""
    from rkaudio.gates.walk_vs_full import decode_floor as float64_floor

    return float64_floor(decode_model, decode_feeds(latent), DECODE_OUTPUT, reference)


def describe(decode_path: Path, duration_path: Path | None) -> tuple["onnx.ModelProto", InflectModel]:
    """Load and cross-check the official files; the hop is measured by decoding a short latent."""
    from rkaudio.host.backends import OnnxBackend

    model, channels = load_decode(decode_path)
    if duration_path is not None:
        check_duration(duration_path, channels)
    probe_slices = 4
    samples = full_decode(OnnxBackend(model), np.zeros((1, channels, probe_slices), np.float32)).shape[-1]
    return model, InflectModel(channels, samples // probe_slices, config_values(config_beside(decode_path))[1])


def slice_decoder(decode_model, model: InflectModel, window: int, context: int, dec_mask: bool = True,
                  target: str | None = None, stride_phase_levels: int = 0):
    """(decode.onnx as the fixed-window engine graph z [1,C,W], y_mask [1,1,W] -> waveform, its window contract):
    the upsampling levels whose full-rate axis overflows `target`'s time field run in polyphase form, the first
    `stride_phase_levels` as a stride-phase Conv and an interleave (rkaudio.surgery.graph.stride_phase), and every
    wide conv padding as zeros concatenated (rkaudio.surgery.graph.conv_pad)."""
    piece = slice_at_flow(decode_model, REFUSALS, channels=model.channels, hop=model.hop)
    fixed = fixed_window(piece, window, context, REFUSALS, sample_rate=model.sample_rate, dec_mask=dec_mask,
                         target=target, stride_phase_levels=stride_phase_levels, cap_padding=True)
    return fixed.model, InflectWindow.extended(fixed.window, nodes_before_fold=fixed.nodes_before_fold,
                                               nodes_after_fold=len(fixed.model.graph.node))


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


def context_table(backend, decode, latent: np.ndarray, window: WindowContract, contexts) -> dict[int, float]:
    """Global SNR of the whole windowed decode over `backend` (an engine graph of `window`) against a full-length
    decode, per context width it is walked with."""
    from rkaudio.board.numeric import snr_db

    reference = full_decode(decode, latent)
    return {c: snr_db(reference, walk(backend, latent, WindowContract.two_sided(
        window.window, c, hop=window.hop, latent_input=window.latent_input, output=window.output,
        mask_input=window.mask_input)).output) for c in contexts}


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
    from rkaudio.core.contract import contract_of
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.gates.walk_vs_full import WalkBesideFull
    from rkaudio.host.backends import OnnxBackend

    window = InflectWindow.of(contract_of(onnx_path))
    channels = window.latent_channels
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
        latent = selfcheck_latent(duration, channels, window.window, seed=1)
        direct = backend.run({window.latent_input: latent,
                              window.mask_input: np.ones((1, 1, window.window), np.float32)})[window.output]
        walked = walk(backend, latent, window).output
        return [snr_verdict("window_self_snr", direct, walked, min_interior_db,
                            "one window-length latent, walk vs direct run (degraded: no decode.onnx)", FULL_SCALE)]
    verdicts, decode = [], OnnxBackend(decode_model)
    # Long enough for at least one interior window at any context.
    length = max(INTERIOR_LENGTH, 2 * (window.window - window.context) + 1)
    latent = selfcheck_latent(duration, channels, length, seed=INTERIOR_LENGTH)
    interior = WalkBesideFull.run(backend, latent, window, full_decode(decode, latent))
    # One floor for every gate, on the longest latent: the tails' latents are drawn from the same prior and
    # measure within 0.2 dB of it (Nano 131.1-131.3 dB, Micro 135.3-135.5), and each float64 decode costs about
    # ten times its fp32 one (31 s for these 480 slices).
    floor = decode_floor(decode_model, latent, interior.reference)
    for n in TAIL_LENGTHS:
        tail_latent = selfcheck_latent(duration, channels, n, seed=n)
        tail = WalkBesideFull.run(backend, tail_latent, window, full_decode(decode, tail_latent))
        if window.dec_mask:
            verdicts.append(tail.gate(f"tail_snr[{n}]", tail.global_snr(), min_tail_db, floor,
                                      f"{n}-slice latent vs full-length decode.onnx"))
        else:
            say(f"note: tail {n} slices: {tail.global_snr():.1f} dB vs full-length decode (--no-dec-mask: not gated)")
    # The worst window is the figure; the whole full-length decode is what is judged for silence.
    snrs = interior.interior()
    verdicts.append(interior.gate("interior_snr_min", min(snrs), min_interior_db, floor,
                                  f"{len(snrs)} interior window(s) of a {length}-slice latent"))
    return verdicts

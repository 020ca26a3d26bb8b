"""`convert vocoder` (and `convert build MODEL.onnx --window W`): any decoder exported with a dynamic time axis (a conv
vocoder, a conv decoder) as one fixed-window engine the runtime walks along a latent of any length, as Piper's and
Inflect's decoders are walked. The export (export.py) pins the window, masks it for short latents, mends it for the
target with `--fix`, measures the smallest context whose interior windows match the dynamic graph's full-length run,
and writes the window contract into the ONNX metadata; `--window auto` picks the window with the fewest predicted
board ms per emitted frame. A graph with an op across the whole time axis (attention, a norm over time) is refused,
naming it. `convert check vocoder` renders a latent through the walk beside the full-length run."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import typer

from rkaudio.core.errors import MissingSource, SetupError
from rkaudio.families.vocoder.export import GOLDEN_LOOP, export
from rkaudio.gates.real_time import window_walk
from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.release.check import EngineChoice

NAME = "vocoder"
ADVICE = ("a weak interior window means the context is too short for the decoder's reach (leave --context unset to "
          "measure it, or give a larger --window); a weak tail means a short latent's padding leaks (keep the tail "
          "mask)")
MIN_INTERIOR_DB = 90.0  # every interior window against the full-length run, as Piper's export gate asks
MIN_TAIL_DB = 90.0      # a short latent's one padded window, and the last window, as Inflect's tail gate


def window_choice(spelt: str) -> Union[int, str]:
    """`--window`: a number of frames, or `auto`."""
    if spelt == "auto":
        return spelt
    try:
        return int(spelt)
    except ValueError:
        raise SetupError(f"--window {spelt!r}: a number of latent frames, or auto") from None


class Source(Table):
    model: Optional[str] = option(None, "The ONNX to walk: its input has a dynamic time axis, its one output is "
                                  "time-last (environment variables and ~ expanded).")


class Options(Table):
    window: Union[int, Literal["auto"]] = option(
        64, "Latent frames the engine is compiled for, or auto: each of 64, 128 and 256 exported and built for the "
        "target (with --skip-rknn too), the one with the fewest predicted board ms per emitted frame kept.",
        cli_parse=window_choice)
    context: Optional[int] = option(None, "Context frames on each side of a window's emitted frames; unset: the "
                                    "smallest that holds every interior window at --min-interior-db.", ge=0)
    time_axis: Optional[str] = option(None, "NAME:AXIS of the latent's time axis (e.g. mel:1 for a [1, frames, 80] "
                                      "mel); unset: the input's one dynamic axis past the batch.")
    sample_rate: int = option(22050, "Output samples per second: the real-time gate's and the WAV's rate.", ge=1)
    tail_mask: bool = option(True, "Multiply every conv output by the frame mask, so a latent shorter than the "
                             "window decodes as its full-length run does (its zero padding stays zero).",
                             negatable=True)
    fix: bool = option(False, "Mend what `convert doctor` finds for the target with the shared graph passes, each "
                       "gated against the graph before it (all but input_phases, which would change the latent the "
                       "walk slices; the sine polynomial too, which the problem-op scan asks for on the rk3588).")


class Gates(Table):
    min_interior_db: float = option(MIN_INTERIOR_DB, "Gate: every interior window of a 4-window latent against the "
                                    "full-length run of the dynamic graph (and the context search's bar).")
    min_tail_db: float = option(MIN_TAIL_DB, "Gate: short latents (a quarter and three quarters of a window, one "
                                "padded window each) and the last window of the long latent, against full-length runs.")


def export_decoder(job) -> list:
    return export(job)


def recipe_sources(job) -> list[Path]:
    """The recipe's model file (MissingSource when absent)."""
    from rkaudio.families.vocoder.export import expanded

    spelt = job.source.model
    path = expanded(spelt) if spelt else None
    if path is None or not path.is_file():
        raise MissingSource(f"no ONNX at {spelt!r}: set the recipe's [source] model to the decoder exported with a "
                            "dynamic time axis")
    return [path]


def check_vocoder(
    engines: EngineChoice,
    model: Annotated[Path, typer.Option("--model", help="The dynamic-time ONNX: its full-length run is the "
                                        "reference, and without --engine or --package it is exported at --window.")],
    engine: Annotated[Optional[Path], typer.Option(
        "--engine", help="The window engine graph written by `convert build --window` (default: --package's, or a "
        "fresh export).")] = None,
    window: Annotated[Optional[int], typer.Option("--window", help="The window of a fresh export (without --engine "
                                                  "or --package); default: `convert vocoder`'s.")] = None,
    frames: Annotated[int, typer.Option("--frames", help="Latent frames to render (white noise, standard normal).",
                                        min=1)] = 300,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the latent.")] = 0,
    out: Annotated[Path, typer.Option("--out", help="WAV of the engine render; the same walk through the fp32 graph "
                                      "is written as <name>.fp32.wav, the dynamic graph's full-length run as "
                                      "<name>.full.wav, and the spectrograms with the per-window SNR as <name>.png."
                                      )] = Path("vocoder.wav"),
) -> None:
    """Walk a latent window by window over the engine (--backend onnx: the fp16 estimate; simulator: compiled for
    --target) and over its fp32 graph, beside the dynamic graph's full-length run; write the WAVs and the PNG and print
    the SNR per window and overall."""
    import tempfile

    from rkaudio.core.onnx_graph import load_model
    from rkaudio.families.vocoder.check import render_check
    from rkaudio.families.vocoder.export import export_window

    load_model(model)  # a missing or foreign file stops here, in one line
    engine = engines.chosen_onnx(engine, "decoder", "--engine")
    with tempfile.TemporaryDirectory(prefix="rkaudio-check-vocoder-") as scratch:
        if engine is None:  # a fresh export at --window for the target the simulator compiles for
            target, toolkit = engines.compiled_for()
            job = FAMILY.job(target=target, out=Path(scratch), toolkit=toolkit, source={"model": str(model)},
                             options={} if window is None else {"window": window})
            engine = export_window(job, model, job.options.window, Path(scratch)).onnx
        render_check(model, engine, engines, frames, seed, out)


FAMILY = Family(
    name=NAME,
    help="Any decoder with a dynamic time axis (a conv vocoder) as one fixed-window engine walked along a latent:\n"
    "    the smallest context measured against its full-length run, the window contract in the ONNX metadata.",
    source=Source,
    components=(Component("decoder", export_decoder, "vocoder.exec_plan", Options, Gates, advice=ADVICE,
                          context=f"convert {NAME}"),),
    sources=recipe_sources,
    checks={NAME: check_vocoder},
    loops=(GOLDEN_LOOP,),
    real_time=window_walk,  # a window walk: emitted frames x hop / sample rate
)

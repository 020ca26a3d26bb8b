"""`convert inflect`: the Inflect v2 (Micro/Nano) decoder engine, sliced from the official decode.onnx.

The slice runs from the pre-flow latent z [1,C,W] and its mask y_mask [1,1,W] through the reverse
flow and HiFi-GAN to the waveform, masked in the decoder half (default), folded at the window, and
gated by a windowed decode against a full-length decode.onnx decode. `convert check inflect` renders
tokens end to end, duration.onnx -> noise head -> windowed decoder, through the slice's fp32 ONNX and through
the engine (check.py).

`FAMILY` declares the command and the recipe adapter: the command reads --decode-onnx / --duration-onnx, a
recipe the official files in its `source.dir` or the huggingface_hub cache of `source.repo`; the tail and
interior gates are both command options and `[gates]` keys."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.release.check import EngineChoice
from rkaudio.families.inflect.defaults import CONTEXT, MIN_INTERIOR_DB, MIN_TAIL_DB, WINDOW
from rkaudio.core.errors import GateFailure, SetupError
from rkaudio.gates.real_time import window_walk

NAME = "inflect"

ADVICE = ("see the failing figures above; a shorter tail gate means the decoder-half mask is missing, a weak "
          "interior means too little context")
DECODE_ONNX_HELP = ("The official onnx/decode.onnx (noise head + reverse flow + HiFi-GAN). Needed to export; with "
                    "--onnx it is the full-length reference of a fresh self-check (without it the ONNX's export "
                    "verdicts are used).")


class Source(Table):
    decode_onnx: Optional[Path] = option(None, DECODE_ONNX_HELP, recipe=False)
    duration_onnx: Optional[Path] = option(
        None, "The official onnx/duration.onnx: checked against the decoder's latent width, and its prior samples "
        "feed the self-check (white-noise latents without it).", recipe=False)
    dir: Optional[str] = option(None, "Directory holding onnx/decode.onnx, onnx/duration.onnx and config.json "
                                "(environment variables and ~ expanded).", cli=False)
    repo: Optional[str] = option(None, "The official ONNX repo id, read from the local huggingface_hub cache "
                                 "(never downloaded).", cli=False)


class Options(Table):
    window: int = option(WINDOW, "Latent slices the engine is compiled for.", ge=1)
    context: int = option(CONTEXT, "Real context slices on each side of a window's emitted slices (emitted = "
                          "window - 2*context).", ge=0)
    dec_mask: bool = option(True, "Mask after every decoder conv so a short latent's zero padding stays zero "
                            "(default on: this decoder is unmasked).", negatable=True)
    stride_phase_levels: int = option(0, "Leading upsampling levels run as one Conv per stride phase and an "
                                      "interleave, not a ConvTranspose (exact; faster where the board-time model "
                                      "says so: bench/inflect_stride_phase.py).", ge=0)


class Gates(Table):
    min_tail_db: float = option(MIN_TAIL_DB, "Gate: short latents (30/47/91/210 slices) against a full-length "
                                "decode, with the decoder-half mask.")
    min_interior_db: float = option(MIN_INTERIOR_DB, "Gate: interior windows of a 480-slice latent against a "
                                    "full-length decode.")


def _export_verdicts(onnx_path: Path, decode_path: Path | None, duration_path: Path | None, target: str | None,
                     min_tail_db: float, min_interior_db: float, say=print) -> list:
    """The export stage's gates of a written slice: its problem-op scan for `target`, then the self-check."""
    from rkaudio.families.inflect.decoder import selfcheck_verdicts
    from rkaudio.gates import opscan
    from rkaudio.gates.verdict import refuse_degenerate

    problems = opscan.scan(onnx_path, target)
    opscan.warn(problems)
    checked = selfcheck_verdicts(onnx_path, decode_path, duration_path, min_tail_db, min_interior_db, say)
    return [opscan.verdict(problems), *refuse_degenerate(checked, f"{NAME} export self-check")]


def export(job, decode_path: Path, duration_path: Path | None, say=print) -> list:
    """Write the fixed-window slice `inflect_v2_decoder_c<C>_w<W>[_poly<P>].onnx` of the official files at the job's
    options (window, context, decoder-half mask, stride-phase levels) for its target, and its self-check npz;
    returns its one `Exported` record, whose verdicts (problem-op scan, windowed vs full-length decode at the job's
    gates) travel in its contract, with the family's end-to-end golden declared beside it (`with_end_to_end`)."""
    import numpy as np
    import onnx

    from rkaudio.core.contract import set_contract
    from rkaudio.families.inflect import decoder as D
    from rkaudio.pipeline.pipeline import record_export

    options, gates = job.options, job.gates
    model, info = D.describe(decode_path, duration_path)
    sliced, window = D.slice_decoder(model, info, options.window, options.context, options.dec_mask, job.target,
                                     options.stride_phase_levels)
    phases = window.polyphase
    say(f"decode.onnx {len(model.graph.node)} nodes; slice {window.nodes_before_fold} nodes -> "
        f"{window.nodes_after_fold} after the fold at window {window.window} (C={info.channels}, hop {info.hop}, "
        f"decoder-half mask {'on' if window.dec_mask else 'off'}" +
        (f", last levels in {phases} phases for {job.target}" if phases else "") +
        (f", first {window.stride_phase_levels} level(s) in stride phases" if window.stride_phase_levels else "") +
        ")")
    out_dir = Path(job.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / (f"inflect_v2_decoder_c{info.channels}_w{window.window}" +
                           (f"_poly{phases}" if phases else "") + ".onnx")
    onnx.save(set_contract(sliced, job.contract("main", **window.to_fields())), str(onnx_path))
    try:
        verdicts = _export_verdicts(onnx_path, decode_path, duration_path, job.target, gates.min_tail_db,
                                    gates.min_interior_db, say)
    except GateFailure:  # a degenerate reference: the slice of a model that outputs nothing is not kept
        onnx_path.unlink(missing_ok=True)
        raise
    duration = D.optional_backend(duration_path)
    latent = D.selfcheck_latent(duration, info.channels, window.window, seed=window.window)
    feeds = {window.latent_input: latent, window.mask_input: np.ones((1, 1, window.window), np.float32)}
    record = record_export(onnx_path, verdicts, feeds=feeds)
    return with_end_to_end([record], duration, info, window.window)


GOLDEN_LOOP = "rkaudio.board.inflect:golden_loop"
GOLDEN_TAIL_SLICES = 47  # one of the gated tail lengths (decoder.TAIL_LENGTHS): well short of any usual window
GOLDEN_SEED = 4747


def with_end_to_end(exported: list, duration, model, window: int) -> list:
    """The family's end-to-end golden: a short latent's tail window, the model's own prior sample of
    GOLDEN_TAIL_SLICES slices (duration.onnx, a backend, when given; white noise otherwise) through
    `rkaudio.board.inflect.golden_loop`: one zero-padded window with its mask, one engine call."""
    from rkaudio.pipeline import pipeline
    from rkaudio.families.inflect import decoder as D

    slices = max(1, min(GOLDEN_TAIL_SLICES, window - 1))
    latent = D.selfcheck_latent(duration, model.channels, slices, seed=GOLDEN_SEED)
    source = "the model's prior sample" if duration is not None else "white noise (no duration.onnx)"
    return pipeline.record_end_to_end(
        f"inflect_tail_c{model.channels}_w{window}", GOLDEN_LOOP, exported, {"latent": latent},
        {"hop": model.hop, "sample_rate": model.sample_rate},
        f"a {slices}-slice latent ({source}) decoded by InflectSynth.decode: one zero-padded {window}-slice "
        "window, mask 0 over the padding")


def _rechecked(job, onnx_path: Path) -> list:
    """The record of a slice exported earlier, its verdicts measured afresh against the job's --decode-onnx (so the
    thresholds given now apply)."""
    from dataclasses import replace

    from rkaudio.pipeline.pipeline import Exported

    record = Exported.from_onnx(onnx_path, job.family.contract_name)
    verdicts = _export_verdicts(record.onnx, job.source.decode_onnx, job.source.duration_onnx, job.target,
                                job.gates.min_tail_db, job.gates.min_interior_db)
    return [replace(record, verdicts=tuple(verdicts))]


def export_decoder(job) -> list:
    """The slice of the command's --decode-onnx (--duration-onnx), or of a recipe's official files (MissingSource
    when absent), exported into `job.out` and gated at the job's tail and interior bars."""
    # A recipe's source lacks the command's decode_onnx, unless `random_source`'s replaced it (build_cell)
    if job.recipe is None or getattr(job.source, "decode_onnx", None) is not None:
        if job.source.decode_onnx is None:
            raise SetupError("give --decode-onnx (the official onnx/decode.onnx) to export, or --onnx with a slice "
                             "written earlier by `convert inflect --skip-rknn`")
        decode_path, duration_path = job.source.decode_onnx, job.source.duration_onnx
    else:
        from rkaudio.families.inflect.source import resolve_source

        decode_path, duration_path = resolve_source(job.source.model_dump())
    return export(job, decode_path, duration_path)


def from_onnx(job, onnx_path: Path) -> list:
    """An earlier slice: refused when exported for a SoC with a wider time field; re-measured against --decode-onnx
    when the command names it (so the thresholds given now apply), else its export verdicts as its contract holds
    them."""
    from rkaudio.board.contract import EngineContract
    from rkaudio.board.inflect import InflectWindow
    from rkaudio.core.contract import contract_of
    from rkaudio.pipeline.pipeline import Exported
    from rkaudio.surgery.graph.polyphase_levels import lacks_phases

    contract = contract_of(onnx_path) if Path(onnx_path).is_file() else EngineContract()
    if lacks_phases(contract, job.target):
        window = InflectWindow.of(contract)
        raise SetupError(f"{onnx_path} was exported without the polyphase levels {job.target}'s time field needs; "
                         f"re-export for this target: convert inflect --window {window.window} --context "
                         f"{window.context} --target {job.target} --skip-rknn")
    if job.recipe is None and job.source.decode_onnx is not None:
        return _rechecked(job, onnx_path)
    return [Exported.from_onnx(onnx_path, job.family.contract_name)]


# Where a user gets token ids: the model ships its tokenizer as code, not as a file rkaudio could read.
TOKENS_SOURCE = ("The model repository's runtime/text module makes them from a sentence (VITS's text_to_sequence, "
                 "then a blank id 0 between and around the symbols), e.g. 0,12,0,40,0.")


def check_inflect(
    duration_onnx: Annotated[Path, typer.Option("--duration-onnx", help="The official onnx/duration.onnx.")],
    engines: EngineChoice,
    tokens: Annotated[Optional[str], typer.Option("--tokens", help="Comma-separated blank-interleaved token ids "
                                                  f"(178 symbols). {TOKENS_SOURCE}")] = None,
    engine: Annotated[Optional[Path], typer.Option(
        "--engine", help="The decoder: a slice .onnx written by `convert inflect` (default: --package's), or a "
        ".rknn with its manifest beside it (run with rknn-toolkit-lite2 on a board: one render, no fp32 "
        "comparison).")] = None,
    out: Annotated[Path, typer.Option("--out", help="WAV of the engine render; the same walk through the slice's "
                                      "fp32 ONNX is written beside it as <name>.fp32.wav, the full-length decode "
                                      "(--decode-onnx) as <name>.full.wav, and the spectrograms with the "
                                      "per-window SNR as <name>.png.")] = Path("inflect.wav"),
    config: Annotated[Optional[Path], typer.Option("--config", help="The model's config.json (hop, sample rate); "
                                                   "default: beside the onnx/ folder of --duration-onnx.")] = None,
    decode_onnx: Annotated[Optional[Path], typer.Option("--decode-onnx", help="The official onnx/decode.onnx: "
                                                        "its full-length decode of the same latent is written "
                                                        "and compared.")] = None,
    # 0.667 is rkaudio.board.inflect.DEFAULT_VARIATION, spelled out so that `--help` does not import numpy.
    variation: Annotated[float, typer.Option("--variation", help="Scale of the prior noise the runtime draws "
                                             "(decode.onnx's noise_scale; 0 = the prior mean).")] = 0.667,
    length_scale: Annotated[float, typer.Option("--length-scale", help="Duration scale (larger = slower).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prior noise.")] = 0,
    text: Annotated[Optional[str], typer.Option("--text", help="The English sentence the tokens spell: each "
                                                "render's word error rate against it (needs pocketsphinx).")] = None,
) -> None:
    """Render tokens end to end, duration.onnx -> noise head (CPU) -> windowed decoder, twice: through the slice's
    fp32 ONNX and through the engine (--backend simulator: compiled for --target); print the engine's SNR per
    window and overall and, with --decode-onnx, the windowing's against a full-length decode."""
    from rkaudio.families.inflect.check import render_check, render_on_board

    if tokens is None:
        raise SetupError(f"give --tokens: the check renders token ids, not text. {TOKENS_SOURCE}")
    try:
        ids = [int(t) for t in tokens.replace(" ", "").split(",") if t]
    except ValueError:
        ids = []
    if not ids:
        raise SetupError(f"--tokens {tokens!r}: give comma-separated integer token ids, e.g. 0,12,0,40,0")
    if engine is not None and engine.suffix == ".rknn":
        if engines.backend != "onnx" or engines.package is not None:
            raise SetupError(f"--engine {engine} runs on the board (rknn-toolkit-lite2); --backend simulator and "
                             "--package render a slice .onnx")
        render_on_board(ids, duration_onnx, engine, out, config, decode_onnx, variation, length_scale, seed)
        return
    render_check(ids, duration_onnx, engine, out, config, decode_onnx, variation, length_scale, seed, text, engines)


def random_source(directory: Path, shape: str, recipe: dict) -> dict:
    """Official-format decode.onnx / duration.onnx of random weights, written under `directory`: at the size the
    recipe's package names ("real": Micro or Nano), or Nano, the smaller, for "small" (the published sizes are
    the tests' models too: tests/families/inflect/conftest.py)."""
    from rkaudio.families.inflect.reference import NANO, SIZES, export_official

    if shape == "real":
        sizes = [config for name, config in SIZES.items() if name in recipe["package"]]
        if len(sizes) != 1:
            raise SetupError(f"inflect recipe {recipe['package']}: its package name names none of the sizes "
                             f"{sorted(SIZES)} (or several), so no real shape is known")
        config = sizes[0]
    else:
        config = NANO
    paths = export_official(directory, config)
    return {"decode_onnx": paths["decode"], "duration_onnx": paths["duration"]}


def recipe_sources(job) -> list[Path]:
    """The official files the recipe builds from (source.FILES; MissingSource when absent)."""
    from rkaudio.families.inflect.source import FILES, resolve_source

    root = resolve_source(job.source.model_dump())[0].parent.parent  # decode.onnx sits in <root>/onnx/
    return [root / name for name in FILES]


FAMILY = Family(
    name=NAME,
    # the old command's docstring, its line break kept: `convert --help` lists the command by its first line
    help="Slice the official Inflect v2 decode.onnx at the pre-flow latent, fold it at a fixed window, gate the\n"
    "    windowed decode against a full-length one, and compile it (the engine has no noise input).",
    source=Source,
    components=(Component("decoder", export_decoder, "inflect_v2.exec_plan", Options, Gates, advice=ADVICE, context=f"convert {NAME}"),),
    sources=recipe_sources,
    random_source=random_source,
    from_onnx=from_onnx,
    checks={"inflect": check_inflect},
    loops=(GOLDEN_LOOP,),
    real_time=window_walk,  # a window walk: emitted frames x hop / sample rate
)

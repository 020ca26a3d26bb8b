"""`convert qwen3-vocoder`: the Qwen3-TTS 12 Hz speech-tokenizer decoder as a stateful fixed-shape step.

Export stage (export venv): load `speech_tokenizer/` of the checkpoint, re-trace the decoder as one step
(codes [1,16,B] + flat fp32 cache -> pcm [1,B*1920] + cache), gate the stepwise decode against the package
decoder's full decode, write the ONNX with its contract. Conversion stage: `--onnx step_64.onnx` reads B,
cache size, head dim and kv_len back from the graph and only compiles.

`FAMILY` declares the command and the recipe adapter: the command exports one step (`--role`, `--codes-length`,
`--output`) from `--model-dir`, or with `--ladder dynamic` the stream's pair (first B=16, main B=--codes-length) as
one engine; a recipe one step per `options.engines` entry from its `source.dir` / `source.repo`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from rkaudio.pipeline import pipeline
from rkaudio.pipeline.declaration import Component, Family, Job, Table, option
from rkaudio.release.check import EngineChoice
from rkaudio.families.qwen3_vocoder.step_export import DEFAULT_SINE_FORM, ROLES, describe
from rkaudio.core import paths
from rkaudio.core.errors import SetupError

NAME = "qwen3_vocoder"
COMPONENT = "speech_decoder"
MIN_SIMULATOR_SNR_DB = 40.0
ADVICE = "the stepwise decode or the exported graph disagrees with the reference (see the figures above)"
# rkaudio.surgery.modules.snake.SINE_FORMS, spelled out so that `--help` and a recipe's check import no torch
# (tests/families/qwen3_vocoder/test_cli.py holds them equal).
SINE_FORMS = ("exact", "clip", "floor", "round")
# rkaudio.families.qwen3_vocoder.cache.HALO_FORMS, spelled out for the same reason, after "auto".
HALO_FORMS = ("auto", "channels_last", "tail_transpose", "tail_matmul")


class Source(Table):
    model_dir: Optional[str] = option(
        None, "Qwen/Qwen3-TTS-12Hz-0.6B-Base checkpoint directory (holding speech_tokenizer/), the "
        "speech_tokenizer/ directory itself, or the repo id to look up in the local huggingface_hub cache.",
        recipe=False)
    dir: Optional[str] = option(None, "Checkpoint directory holding speech_tokenizer/ (environment variables "
                                "expanded; one that names an unset variable is skipped).", cli=False)
    repo: Optional[str] = option(None, "Repo id looked up in the local huggingface_hub cache (never downloaded) "
                                 "when `dir` holds no snapshot.", cli=False)


class Engine(Table):
    """One engine of a recipe: a step of `role` over `codes_length` code frames."""

    role: Literal[ROLES] = option(..., "Artifact role in qwen3_tts.exec_plan: main, first or window.")
    codes_length: int = option(..., "Code frames per step (for window: the new frames per event).", ge=1)


class Options(Table):
    codes_length: int = option(
        64, "Code frames per step, compiled in (16 for the first group, 64 for the rest). For --role window: the new "
        "frames per event (the window is 25 context frames + these). With --ladder dynamic: the main step's (the "
        "first step's are 16).", short="-B", recipe=False, ge=1)
    role: Literal[ROLES] = option(
        "main", "Artifact role in qwen3_tts.exec_plan: main (B=64 step), first (B=16 step) or window (stateless "
        "decode of 25 context + new frames).", recipe=False)
    output: Optional[Path] = option(None, "ONNX path to write (default: OUT/qwen3_vocoder_<role>_<B>.onnx).",
                                    recipe=False)
    engines: list[Engine] = option(..., "The engines of the package, one step each: [{role, codes_length}, ...].",
                                   cli=False, min_length=1)
    sine_form: Literal[SINE_FORMS] = option(
        "round", "SnakeBeta sine in the engine graph: round (default; a polynomial after native fp16 rounding, all "
        "NPU), exact (Sin: CPU on rk3588), clip or floor (see rkaudio/surgery/modules/snake.py).")
    halo_form: Literal[HALO_FORMS] = option(
        "auto", "How the row convs meet the halos they keep in the cache: auto (default: the target's measured "
        "fastest, rkaudio/families/qwen3_vocoder/step_export.py HALO_FORM_BY_TARGET), channels_last, tail_transpose "
        "or tail_matmul (rkaudio/families/qwen3_vocoder/cache.py). Every form computes the same step over the same "
        "cache.")


# The shipped stream (recipes/qwen3_tts_0_6b_base_speech_decoder.toml), for a check's target no recipe lists.
SHIPPED_FRAMES = {"first": 16, "main": 64}


def onnx_name(role: str, frames: int) -> str:
    return f"qwen3_vocoder_{role}_{frames}.onnx"


def export(job: Job, model_dir: str | Path, engines: list[tuple[str, int, Path]]) -> list[pipeline.Exported]:
    """Load the snapshot once, build the step and the package reference decoder from the same state dict, and
    export one step per (role, code frames, ONNX path) of `job` (its SnakeBeta sine form: `options.sine_form`); the
    stateful ones carry the end-to-end golden."""
    import torch

    from rkaudio.families.qwen3_vocoder import step_export as E
    from rkaudio.families.qwen3_vocoder import snapshot
    from rkaudio.families.qwen3_vocoder.reference import reference_decoder
    from rkaudio.families.qwen3_vocoder.step import StreamingDecoder

    for role, _, _ in engines:
        if role not in E.ROLES:
            raise SetupError(f"--role {role!r}: one of {', '.join(E.ROLES)}")
    source = snapshot.load(model_dir)
    step = StreamingDecoder(source.decoder_config)
    try:
        step.load_state_dict(source.state_dict, strict=True)
    except RuntimeError as error:
        raise SetupError(f"{source.directory}/model.safetensors does not match its config.json decoder_config: "
                         f"{str(error).splitlines()[0]}") from None
    reference = reference_decoder(source.decoder_config, source.state_dict)
    exported = []
    for role, frames, onnx_path in engines:
        window = frames + E.WINDOW_CONTEXT if role == "window" else frames
        with torch.no_grad():
            exported.append(E.export_step(job, step, window, role, onnx_path, reference=reference,
                                          sine_form=job.options.sine_form, halo_form=job.options.halo_form))
    return with_end_to_end(exported, step.dims["codebook_size"])


GOLDEN_LOOP = "rkaudio.board.qwen3_vocoder:golden_loop"
GOLDEN_SEED = 0


def with_end_to_end(exported: list[pipeline.Exported], codebook_size: int, seed: int = GOLDEN_SEED,
                    say=print) -> list[pipeline.Exported]:
    """The family's end-to-end golden, declared over its stateful steps (`first`, `main`; the window role is
    stateless and left out): the stateful stream (rkaudio.board.qwen3_vocoder.golden_loop) on seeded random codes, one group
    on B=16 `first`, then two on B=64 `main`, the cache carried from call to call (two groups on a lone step).
    More than one step of a role: the golden runs the smallest of each."""
    import numpy as np

    from rkaudio.board.contract import EngineContract
    from rkaudio.core.contract import contract_of
    from rkaudio.board.qwen3_vocoder import StepContract, golden_codes_length

    steps: dict[str, tuple[pipeline.Exported, EngineContract, StepContract]] = {}
    for record in exported:
        contract = contract_of(record.onnx)
        if contract.role not in ("first", "main"):
            continue
        step = StepContract.of(contract)
        if contract.role not in steps or step.frames < steps[contract.role][2].frames:
            steps[contract.role] = (record, contract, step)
    if not steps:
        return exported
    chosen = [steps[role] for role in ("first", "main") if role in steps]
    frames = golden_codes_length([contract for _, contract, _ in chosen])
    codes = np.random.default_rng(seed).integers(0, codebook_size, (chosen[0][2].num_quantizers, frames),
                                                 dtype=np.int64)
    said = [f"{contract.role} B={step.frames}" for _, contract, step in chosen]
    name = "qwen3_vocoder_stream_" + "_".join(f"{contract.role}{step.frames}" for _, contract, step in chosen)
    schedule = "".join(f"{group}, then " for group in said[:-1]) + f"{said[-1]} twice"
    declared = pipeline.record_end_to_end(
        name, GOLDEN_LOOP, [record for record, _, _ in chosen], {"codes": codes}, {"event_frames": 1},
        f"{frames} seeded random code frames pushed one at a time through the stateful stream: {schedule}, "
        "the cache carried on")
    say(f"end-to-end golden {name}: {frames} code frames through {GOLDEN_LOOP}")
    by_onnx = {record.onnx: record for record in declared}
    return [by_onnx.get(record.onnx, record) for record in exported]


def export_steps(job) -> list[pipeline.Exported]:
    """The command's one step (--role, --codes-length, --output) from --model-dir, or a recipe's
    `options.engines` from its snapshot (MissingSource without one), into `job.out`."""
    if job.recipe is None:
        if job.source.model_dir is None:
            raise SetupError("give --model-dir SNAPSHOT (export) or --onnx STEP.onnx (compile an earlier export)")
        return export(job, job.source.model_dir, command_steps(job.options, Path(job.out)))
    engines = [(engine.role, engine.codes_length, Path(job.out) / onnx_name(engine.role, engine.codes_length))
               for engine in job.options.engines]
    # A recipe's source lacks the command's model_dir, unless `random_source`'s replaced it (build_cell)
    return export(job, getattr(job.source, "model_dir", None) or _recipe_snapshot(job), engines)


def command_steps(options, out: Path) -> list[tuple[str, int, Path]]:
    """The (role, code frames, ONNX path) the command exports: its one step (--role, --codes-length, --output), or
    with --ladder dynamic the two steps of the stream, first at the shipped 16 frames and main at --codes-length,
    which the pipeline merges into one engine (a dynamic ladder of one step has nothing to merge)."""
    if options.ladder == "static":
        return [(options.role, options.codes_length,
                 options.output or out / onnx_name(options.role, options.codes_length))]
    first = SHIPPED_FRAMES["first"]
    if options.role != "main" or options.output is not None:
        raise SetupError(f"--ladder dynamic builds the first (B={first}) and the main step (B=--codes-length) as one "
                         "engine: --role and --output choose the one step of a static build")
    if options.codes_length <= first:
        raise SetupError(f"--ladder dynamic: --codes-length {options.codes_length} is the main step's and must exceed "
                         f"the first step's {first} code frames")
    return [(role, frames, out / onnx_name(role, frames)) for role, frames in (("first", first),
                                                                               ("main", options.codes_length))]


def _recipe_snapshot(job) -> Path:
    """The snapshot a recipe names (`source.dir`, else the huggingface_hub cache of `source.repo`); MissingSource."""
    from rkaudio.pipeline.checkpoint import recipe_checkpoint
    from rkaudio.families.qwen3_vocoder import snapshot

    return recipe_checkpoint(job.source.model_dump(), snapshot.FILES, snapshot.SNAPSHOT_NAME)


def random_source(directory: Path, shape: str, recipe: dict) -> dict:
    """A speech-tokenizer snapshot of random weights at the released decoder's shapes ("real") or the tests'
    tiny ones ("small"), written under `directory`."""
    from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, write_random_snapshot
    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG

    config = REAL_SHAPE_DECODER_CONFIG if shape == "real" else TINY_CONFIG
    return {"model_dir": str(write_random_snapshot(directory, config))}


def recipe_sources(job) -> list[Path]:
    """Every file of the speech tokenizer the recipe's snapshot holds (MissingSource when there is none)."""
    from rkaudio.families.qwen3_vocoder import snapshot
    from rkaudio.core.paths import snapshot_files

    return snapshot_files(snapshot.resolve(_recipe_snapshot(job)))


def from_onnx(job, onnx_path: Path) -> list[pipeline.Exported]:
    """An earlier export compiled: its contract is the graph's, so --model-dir is refused; the figures it fixes
    are said before a compile of minutes."""
    if job.recipe is None and job.source.model_dir is not None:
        raise SetupError("--onnx compiles an earlier export and takes its contract from the graph: drop --model-dir")
    _say_contract(onnx_path)
    return [pipeline.Exported.from_onnx(onnx_path, FAMILY.contract_name)]


def _say_contract(onnx_path: Path) -> None:
    """Before a compile of minutes, the figures an --onnx build takes from the graph (a file that is missing or
    another family's is left to `Exported.from_onnx`, which refuses it)."""
    from rkaudio.core.contract import contract_of

    if Path(onnx_path).is_file():
        contract = contract_of(onnx_path)
        if contract.family == FAMILY.contract_name:
            print(describe(onnx_path, contract, "from the ONNX contract"))


def check_qwen3_vocoder(
    engines: EngineChoice,
    model_dir: Annotated[Optional[str], typer.Option("--model-dir", help=Source.model_fields["model_dir"].description
                         + " The steps are exported from it, random codes drawn from its codebook and the whole "
                         "codes decoded by its package decoder (<name>.full.wav).")] = None,
    steps: Annotated[Optional[list[Path]], typer.Option("--engine", exists=True, dir_okay=False, help="A step ONNX "
                     "written by `convert qwen3-vocoder` (repeat it for the first and the main step; default: export "
                     "them from --model-dir).")] = None,
    codes: Annotated[Optional[Path], typer.Option("--codes", exists=True, dir_okay=False, help="Code ids to render: "
                     "an .npy of integers shaped (num_quantizers, frames) (default: random codes of --frames from "
                     "--seed).")] = None,
    frames: Annotated[Optional[int], typer.Option("--frames", min=1, help="Random code frames (default: a group on "
                      "first, two on main and half a main group flushed right-padded).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random codes.")] = 0,
    first: Annotated[Optional[int], typer.Option("--first", min=0, help="Code frames of the exported first step (the "
                     "first group: time to first audio; 0: none). Default: the recipe's for --target (16).")] = None,
    main: Annotated[Optional[int], typer.Option("--main", min=0, help="Code frames of the exported main step (every "
                    "later group; 0: none, a lone first step plays main as on the board). Default: the recipe's for "
                    "--target (64).")] = None,
    sine_form: Annotated[Optional[str], typer.Option("--sine-form", help=Options.model_fields["sine_form"].description
                         + " Default: the recipe's.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="WAV of the engine render; the same stream through the fp32 "
                   "twins is written beside it as <name>.fp32.wav, the full decode as <name>.full.wav, and the "
                   "spectrograms with the SNR of every stream call as <name>.png.")] = paths.work_dir(NAME) / "check.wav",
) -> None:
    """Render code frames through the stateful stream the board runs (first step, then main, the cache carried on)
    twice, through the fp32 twins and through the engines (--backend simulator: compiled for --target), beside the
    package decoder's full decode; print the engine's SNR per stream call and overall."""
    from rkaudio.families.qwen3_vocoder.check import render_check

    given = steps or (engines.package_onnx(COMPONENT) if engines.package is not None else None)
    if given and (first is not None or main is not None or sine_form is not None):
        raise SetupError("--first, --main and --sine-form shape an export; --engine / --package bring their own steps")
    if not given:
        given = export_stream(engines, model_dir, first, main, sine_form, out.parent / f"{out.stem}_engines")
    render_check(engines, given, FAMILY.contract_name, model_dir=model_dir, codes=codes, frames=frames, seed=seed,
                 out=out)


def export_stream(engines, model_dir: str | None, first: int | None, main: int | None, sine_form: str | None,
                  directory: Path) -> list[Path]:
    """The stream's steps exported from `model_dir` into `directory` at `first` / `main` code frames (0: leave that
    step out; default: what the release recipe ships for the check's target), `sine_form` (the recipe's) and the
    recipe's halo form."""
    if model_dir is None:
        raise SetupError("give --model-dir SNAPSHOT (export the steps), --engine STEP.onnx or --package DIR")
    shipped = {engine["role"]: engine["codes_length"]
               for engine in engines.recipe_option(COMPONENT, "engines", [])} or SHIPPED_FRAMES
    sizes = {"first": shipped.get("first", 0) if first is None else first,
             "main": shipped.get("main", 0) if main is None else main}
    chosen = [(role, frames, directory / onnx_name(role, frames)) for role, frames in sizes.items() if frames]
    if not chosen:
        raise SetupError("--first 0 --main 0 leaves the stream no step")
    sine_form = sine_form or engines.recipe_option(COMPONENT, "sine_form") or DEFAULT_SINE_FORM
    if sine_form not in SINE_FORMS:
        raise SetupError(f"--sine-form {sine_form!r}: one of {', '.join(SINE_FORMS)}")
    print(f"exporting the {' and '.join(f'{role} B={frames}' for role, frames, _ in chosen)} step(s) into "
          f"{directory} ...")
    component = FAMILY.component(COMPONENT)
    options = FAMILY.options_model(component)(
        engines=[{"role": role, "codes_length": frames} for role, frames, _ in chosen], sine_form=sine_form,
        halo_form=engines.recipe_option(COMPONENT, "halo_form") or "auto")
    job = Job(FAMILY, component, Source(model_dir=model_dir), options, FAMILY.gates_model(component)(),
              engines.target, directory, engines.toolkit)
    return [record.onnx for record in export(job, model_dir, chosen)]


def real_time(contract):
    """A step: the audio of its code frames; the window role: of the frames it emits; at the codec's
    CODE_FRAME_RATE_HZ (12.5 code frames per second of audio)."""
    from rkaudio.board.ladder import RungWidth
    from rkaudio.board.qwen3_vocoder import CODE_FRAME_RATE_HZ
    from rkaudio.board.window_walk import WindowSpan
    from rkaudio.gates.real_time import RealTime

    frames = WindowSpan.of(contract).emitted if contract.role == "window" else RungWidth.of(contract).frames
    return RealTime(frames / CODE_FRAME_RATE_HZ, "s of audio", f"{frames} code frames at {CODE_FRAME_RATE_HZ} Hz")


FAMILY = Family(
    name=NAME,
    help="Qwen3-TTS 12 Hz speech-tokenizer decoder: a stateful B-frame step (flat fp32 cache) or the window role.",
    source=Source,
    components=(Component(COMPONENT, export_steps, "qwen3_tts.exec_plan", Options, advice=ADVICE, ladder=("first", "main")),),
    build_defaults={"min_simulator_snr_db": MIN_SIMULATOR_SNR_DB},
    sources=recipe_sources,
    random_source=random_source,
    from_onnx=from_onnx,
    after_build=pipeline.say_engines,  # each engine's CPU ops: the figure its NPU shaping is measured by
    loops=(GOLDEN_LOOP,),
    checks={"qwen3-vocoder": check_qwen3_vocoder},
    real_time=real_time,
)

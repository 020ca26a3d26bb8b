"""`convert qwen3-vocoder`: the Qwen3-TTS 12 Hz speech-tokenizer decoder as a stateful fixed-shape step.

Export stage (export venv): load `speech_tokenizer/` of the checkpoint, re-trace the decoder as one step
(codes [1,16,B] + flat fp32 cache -> pcm [1,B*1920] + cache), gate the stepwise decode against the package
decoder's full decode, write the ONNX with its contract. Conversion stage: `--onnx step_64.onnx` reads B,
cache size, head dim and kv_len back from the graph and only compiles."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.family import pipeline
from converters.families.qwen3_vocoder.step_export import FAMILY, describe
from converters.cli.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target, Toolkit
from core.errors import SetupError
from core import paths
from toolkit.versions import DEFAULT_TOOLKIT

COMMAND = "qwen3-vocoder"
MIN_SIMULATOR_SNR_DB = 40.0
ADVICE = "the stepwise decode or the exported graph disagrees with the reference (see the figures above)"

ModelDir = Annotated[Optional[str], typer.Option(
    "--model-dir", help="Qwen/Qwen3-TTS-12Hz-0.6B-Base checkpoint directory (holding speech_tokenizer/), the "
    "speech_tokenizer/ directory itself, or the repo id to look up in the local huggingface_hub cache.")]
CodesLength = Annotated[int, typer.Option(
    "--codes-length", "-B", help="Code frames per step, compiled in (16 for the first group, 64 for the rest). "
    "For --role window: the new frames per event (the window is 25 context frames + these).")]
Role = Annotated[str, typer.Option(
    "--role", help="Artifact role in qwen3_tts.exec_plan: main (B=64 step), first (B=16 step) or window "
    "(stateless decode of 25 context + new frames).")]
Output = Annotated[Optional[Path], typer.Option(
    "--output", help="ONNX path to write (default: OUT/qwen3_vocoder_<role>_<B>.onnx).")]
SineForm = Annotated[str, typer.Option("--sine-form", help="SnakeBeta sine in the engine graph: round (default; a "
                                       "polynomial after native fp16 rounding, all NPU), exact (Sin: CPU on rk3588), "
                                       "clip or floor (see surgery/modules/snake.py).")]


def onnx_name(role: str, frames: int) -> str:
    return f"qwen3_vocoder_{role}_{frames}.onnx"


def export(model_dir: str | Path, engines: list[tuple[str, int, Path]], sine_form: str | None = None
           ) -> list[pipeline.Exported]:
    """Load the snapshot once, build the step and the package reference decoder from the same state dict, and
    export one step per (role, code frames, ONNX path); the stateful ones carry the end-to-end golden."""
    import torch

    from converters.families.qwen3_vocoder import step_export as E
    from converters.families.qwen3_vocoder import snapshot
    from converters.families.qwen3_vocoder.reference import reference_decoder
    from converters.families.qwen3_vocoder.step import StreamingDecoder
    from surgery.modules.snake import SINE_FORMS

    for role, _, _ in engines:
        if role not in E.ROLES:
            raise SetupError(f"--role {role!r}: one of {', '.join(E.ROLES)}")
    sine_form = sine_form or E.DEFAULT_SINE_FORM
    if sine_form not in SINE_FORMS:
        raise SetupError(f"--sine-form {sine_form!r}: one of {', '.join(SINE_FORMS)}")
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
            exported.append(E.export_step(step, window, role, onnx_path, reference=reference, sine_form=sine_form))
    return with_end_to_end(exported, step.dims["codebook_size"])


GOLDEN_LOOP = "runtime.board.qwen3_vocoder:golden_loop"
GOLDEN_SEED = 0


def with_end_to_end(exported: list[pipeline.Exported], codebook_size: int, seed: int = GOLDEN_SEED,
                    say=print) -> list[pipeline.Exported]:
    """The family's end-to-end golden, declared over its stateful steps (`first`, `main`; the window role is
    stateless and left out): the stateful stream (runtime.board.qwen3_vocoder.golden_loop) on seeded random codes, one group
    on B=16 `first`, then two on B=64 `main`, the cache carried from call to call (two groups on a lone step).
    More than one step of a role: the golden runs the smallest of each."""
    import numpy as np

    from core.contract import get_contract
    from runtime.board.qwen3_vocoder import golden_codes_length

    steps: dict[str, tuple[pipeline.Exported, dict]] = {}
    for record in exported:
        contract = get_contract(record.onnx)
        role = contract["role"]
        if role in ("first", "main") and (role not in steps or contract["frames"] < steps[role][1]["frames"]):
            steps[role] = (record, contract)
    if not steps:
        return exported
    chosen = [steps[role] for role in ("first", "main") if role in steps]
    contracts = [contract for _, contract in chosen]
    frames = golden_codes_length(contracts)
    codes = np.random.default_rng(seed).integers(0, codebook_size, (int(contracts[0]["num_quantizers"]), frames),
                                                 dtype=np.int64)
    name = "qwen3_vocoder_stream_" + "_".join(f"{c['role']}{c['frames']}" for c in contracts)
    *head, last = contracts
    schedule = "".join(f"{c['role']} B={c['frames']}, then " for c in head) + f"{last['role']} B={last['frames']} twice"
    declared = pipeline.record_end_to_end(
        name, GOLDEN_LOOP, [record for record, _ in chosen], {"codes": codes}, {"event_frames": 1},
        f"{frames} seeded random code frames pushed one at a time through the stateful stream: {schedule}, "
        "the cache carried on")
    say(f"end-to-end golden {name}: {frames} code frames through {GOLDEN_LOOP}")
    by_onnx = {record.onnx: record for record in declared}
    return [by_onnx.get(record.onnx, record) for record in exported]


def convert_qwen3_vocoder(
    model_dir: ModelDir = None,
    codes_length: CodesLength = 64,
    role: Role = "main",
    output: Output = None,
    onnx: FromOnnx = None,
    skip_rknn: SkipRknn = False,
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = paths.work_dir("qwen3_vocoder"),
    max_regtask_lines: MaxRegtaskLines = 0,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_snr_db: MinSnrDb = MIN_SIMULATOR_SNR_DB,
    sine_form: SineForm = "round",
) -> None:
    """Qwen3-TTS 12 Hz speech-tokenizer decoder: a stateful B-frame step (flat fp32 cache) or the window role."""
    if onnx is None and model_dir is None:
        raise SetupError("give --model-dir SNAPSHOT (export) or --onnx STEP.onnx (compile an earlier export)")
    if onnx is not None and model_dir is not None:
        raise SetupError("--onnx compiles an earlier export and takes its contract from the graph: drop --model-dir")
    if onnx is not None:
        _say_contract(onnx)
    onnx_path = output or Path(out) / onnx_name(role, codes_length)
    results = pipeline.convert(
        FAMILY, lambda: export(model_dir, [(role, codes_length, onnx_path)], sine_form), from_onnx=onnx,
        skip_rknn=skip_rknn, out=out, target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
        fail_on_cpu_ops=fail_on_cpu_ops, min_snr_db=min_snr_db, context=(onnx or onnx_path).name, advice=ADVICE)
    _say_cpu_ops(results)


def register(app: typer.Typer, check_app: typer.Typer | None = None) -> None:
    app.command(COMMAND)(convert_qwen3_vocoder)


def _recipe_snapshot(recipe: dict) -> str:
    """The snapshot a recipe names (`source.dir`, else the huggingface_hub cache of `source.repo`); MissingSource."""
    from converters.families.qwen3_vocoder import snapshot
    from converters.family.pipeline import recipe_snapshot

    return recipe_snapshot(recipe["source"], snapshot.resolve, snapshot.REPO_ID)


def recipe_sources(recipe: dict) -> list[Path]:
    """Every file of the speech tokenizer the recipe's snapshot holds (MissingSource when there is none)."""
    from converters.families.qwen3_vocoder import snapshot
    from core.paths import snapshot_files

    return snapshot_files(snapshot.resolve(_recipe_snapshot(recipe)))


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """One engine per recipe `options.engines` entry ({role, codes_length}); MissingSource without a snapshot."""
    directory = _recipe_snapshot(recipe)
    engines = []
    for engine in recipe["options"].get("engines", []):
        role, frames = engine["role"], int(engine["codes_length"])
        engines.append((role, frames, Path(work_dir) / onnx_name(role, frames)))
    exported = export(directory, engines, recipe["options"].get("sine_form"))
    results = pipeline.build_recipe(recipe, target, toolkit, work_dir, exported, advice=ADVICE)
    _say_cpu_ops(results)
    return results


def _say_contract(onnx_path: Path) -> None:
    """Before a compile of minutes, the figures an --onnx build takes from the graph (a file that is missing or
    another family's is left to the pipeline, which refuses it)."""
    from core.contract import get_contract

    contract = get_contract(onnx_path) if Path(onnx_path).is_file() else {}
    if contract.get("family") == FAMILY:
        print(describe(onnx_path, contract, "from the ONNX contract"))


def _say_cpu_ops(results: list) -> None:
    """Each engine's CPU-placed ops: the figure the graph's NPU shaping is measured by."""
    for result in results:
        cpu = [f"{op['type']}:{op['name']}" for op in result.manifest_data.get("ops", {}).get("cpu_ops", [])]
        print(f"{result.rknn.name}: {result.rknn.stat().st_size} bytes; CPU ops ({len(cpu)}): {', '.join(cpu) or 'none'}")

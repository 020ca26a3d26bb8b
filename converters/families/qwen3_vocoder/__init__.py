"""`convert qwen3-vocoder`: the Qwen3-TTS 12 Hz speech-tokenizer decoder as a stateful fixed-shape step.

Export stage (export venv): load `speech_tokenizer/` of the checkpoint, re-trace the decoder as one step
(codes [1,16,B] + flat fp32 cache -> pcm [1,B*1920] + cache), gate the stepwise decode against the package
decoder's full decode, write the ONNX with its contract. Conversion stage: `--onnx step_64.onnx` reads B,
cache size, head dim and kv_len back from the graph and only compiles."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters import pipeline
from converters.families.qwen3_vocoder.step_export import FAMILY, describe
from converters.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target, Toolkit
from core.errors import MissingSource, SetupError
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
    export one step per (role, code frames, ONNX path)."""
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
    return exported


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


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """One engine per recipe `options.engines` entry ({role, codes_length}); MissingSource without a snapshot."""
    from converters.families.qwen3_vocoder import snapshot

    source = recipe["source"]
    directory, errors = None, []
    for candidate in (c for c in (_expand(source.get("dir")), source.get("repo")) if c):
        try:
            snapshot.resolve(candidate)
            directory = candidate
            break
        except SetupError as error:
            errors.append(str(error))
    if directory is None:
        raise MissingSource(f"no {snapshot.REPO_ID} snapshot ({'; '.join(errors) or 'recipe names no source'}); "
                            "set RKAUDIO_MODELS to a folder holding it or put it in the huggingface_hub cache")
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


def _expand(value: str | None) -> str | None:
    import os

    if not value:
        return None
    expanded = os.path.expandvars(value)
    return None if "$" in expanded else expanded

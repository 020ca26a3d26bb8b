"""`convert qwen3-vocoder`: the Qwen3-TTS 12 Hz speech-tokenizer decoder as a stateful fixed-shape step.

Export stage (export venv): load `speech_tokenizer/` of the checkpoint, re-trace the decoder as one step
(codes [1,16,B] + flat fp32 cache -> pcm [1,B*1920] + cache), gate the stepwise decode against the package
decoder's full decode, write the ONNX with its contract. Conversion stage: `--onnx step_64.onnx` reads B,
cache size, head dim and kv_len back from the graph and only compiles."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, OutDir, SkipRknn, Target, Toolkit
from toolkit.versions import DEFAULT_TOOLKIT
from core.errors import SetupError

COMMAND = "qwen3-vocoder"
MIN_SIMULATOR_SNR_DB = 40.0

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
MinSnr = Annotated[float, typer.Option("--min-simulator-snr-db", help="Gate: the simulator's outputs against "
                                       "onnxruntime fp32 on the exact graph (<stem>.fp32.onnx).")]
SineForm = Annotated[str, typer.Option("--sine-form", help="SnakeBeta sine in the engine graph: round (default; a "
                                       "polynomial after native fp16 rounding, all NPU), exact (Sin: CPU on rk3588), "
                                       "clip or floor (see surgery/snake.py).")]


def onnx_name(role: str, frames: int) -> str:
    return f"qwen3_vocoder_{role}_{frames}.onnx"


def export_from_snapshot(model_dir: str | Path, frames: int, role: str, onnx_path: Path, say=print,
                         sine_form: str | None = None):
    """Load the snapshot, build the step and the package reference decoder from the same state dict, export."""
    import torch

    from converters.families.qwen3_vocoder import export as E
    from converters.families.qwen3_vocoder import snapshot
    from converters.families.qwen3_vocoder.reference import reference_decoder
    from converters.families.qwen3_vocoder.step import StreamingDecoder
    from surgery.modules.snake import SINE_FORMS

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
    window = frames + E.WINDOW_CONTEXT if role == "window" else frames
    with torch.no_grad():
        result = E.export_step(step, window, role, onnx_path, reference=reference, sine_form=sine_form)
    say(f"wrote {result.onnx} and {result.reference_onnx.name} (role {role}, B={window}); cache_numel {result.contract['cache_numel']}, head_dim "
        f"{result.contract['head_dim']}, kv_len {result.contract['kv_len']}")
    for verdict in result.verdicts:
        say(verdict.line())
    return result


def build(onnx_path: Path, out_dir: Path, options, say=print):
    """Compile an exported step: its contract and export verdicts come from the ONNX, nothing is restated."""
    from converters.engine import build_engine
    from converters.families.qwen3_vocoder.export import FAMILY, export_verdicts_of
    from core.contract import get_contract

    contract = get_contract(onnx_path)
    if contract.get("family") != FAMILY:
        raise SetupError(f"{onnx_path} was not written by `convert {COMMAND}` (its contract names family "
                         f"{contract.get('family')!r}); export it first with --skip-rknn")
    selfcheck = Path(onnx_path).with_suffix(".selfcheck.npz")
    reference = Path(onnx_path).parent / contract["reference_onnx"]
    for needed, what in ((selfcheck, "self-check inputs"), (reference, "exact fp32 graph")):
        if not needed.is_file():
            raise SetupError(f"no {what} {needed} beside {onnx_path} (the export writes all three)")
    say(f"{onnx_path.name}: role {contract['role']}, B={contract['frames']}, cache_numel {contract['cache_numel']}, "
        f"head_dim {contract['head_dim']}, kv_len {contract['kv_len']} (from the ONNX contract)")
    result = build_engine(onnx_path, out_dir, options, selfcheck=selfcheck,
                          export_verdicts=export_verdicts_of(contract), reference_onnx=reference)
    for verdict in result.verdicts:
        say(verdict.line())
    ops = result.manifest_data.get("ops", {})
    cpu = [f"{op['type']}:{op['name']}" for op in ops.get("cpu_ops", [])]
    say(f"wrote {result.rknn} ({result.rknn.stat().st_size} bytes); CPU ops ({len(cpu)}): {', '.join(cpu) or 'none'}")
    return result


def command(
    model_dir: ModelDir = None,
    codes_length: CodesLength = 64,
    role: Role = "main",
    output: Output = None,
    onnx: FromOnnx = None,
    skip_rknn: SkipRknn = False,
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = Path("out/qwen3_vocoder"),
    max_regtask_lines: MaxRegtaskLines = 0,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_simulator_snr_db: MinSnr = MIN_SIMULATOR_SNR_DB,
    sine_form: SineForm = "round",
) -> None:
    """Qwen3-TTS 12 Hz speech-tokenizer decoder: a stateful B-frame step (flat fp32 cache) or the window role."""
    from converters.engine import BuildOptions
    from toolkit.versions import check_target, check_toolkit

    if onnx is None and model_dir is None:
        raise SetupError("give --model-dir SNAPSHOT (export) or --onnx STEP.onnx (compile an earlier export)")
    if onnx is not None and model_dir is not None:
        raise SetupError("--onnx compiles an earlier export and takes its contract from the graph: drop --model-dir")
    if not skip_rknn:
        check_target(target)
        check_toolkit(toolkit)
    if onnx is None:
        onnx_path = output or Path(out) / onnx_name(role, codes_length)
        result = export_from_snapshot(model_dir, codes_length, role, onnx_path, sine_form=sine_form)
        require_all(result.verdicts, onnx_path.name)
        if skip_rknn:
            return
        onnx = onnx_path
    elif not onnx.is_file():
        raise SetupError(f"no ONNX at {onnx}")
    build(onnx, out, BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
                                  fail_on_cpu_ops=fail_on_cpu_ops, min_simulator_snr_db=min_simulator_snr_db))


def register(app: typer.Typer, check_app: typer.Typer | None = None) -> None:
    app.command(COMMAND)(command)


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """One engine per recipe `options.engines` entry ({role, codes_length}); MissingSource without a snapshot."""
    from core.errors import MissingSource
    from converters.recipes import build_options
    from converters.families.qwen3_vocoder import snapshot

    source = recipe["source"]
    candidates = [c for c in (_expand(source.get("dir")), source.get("repo")) if c]
    directory = None
    errors = []
    for candidate in candidates:
        try:
            snapshot.resolve(candidate)
            directory = candidate
            break
        except SetupError as error:
            errors.append(str(error))
    if directory is None:
        raise MissingSource(f"no {snapshot.REPO_ID} snapshot ({'; '.join(errors) or 'recipe names no source'}); "
                            "set RKAUDIO_MODELS to a folder holding it or put it in the huggingface_hub cache")
    options = build_options(recipe, target, toolkit)
    results = []
    for engine in recipe["options"].get("engines", []):
        role, frames = engine["role"], int(engine["codes_length"])
        onnx_path = Path(work_dir) / onnx_name(role, frames)
        exported = export_from_snapshot(directory, frames, role, onnx_path,
                                        sine_form=recipe["options"].get("sine_form"))
        require_all(exported.verdicts, onnx_path.name)
        results.append(build(onnx_path, Path(work_dir) / "engines", options))
    return results


def require_all(verdicts, context: str) -> None:
    from gates.verdict import require

    require(verdicts, advice="the stepwise decode or the exported graph disagrees with the reference (see the "
            "figures above)", context=context)


def _expand(value: str | None) -> str | None:
    import os

    if not value:
        return None
    expanded = os.path.expandvars(value)
    return None if "$" in expanded else expanded

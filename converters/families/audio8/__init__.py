"""`convert audio8`: Audio8-ASR-0.1B as fixed-shape NPU graphs over CPU-owned rank-3 K/V buckets. Exports the encoder,
one adapter for every placeholder count (its pooling matrix an input the runtime computes), one prefill for every
prompt length (right-padded to the largest, S = 110), one decoder step per K/V bucket (every layer in one call; the
CPU writes the K/V rows it returns), and the LM head in shards; gates greedy tokens through those graphs against the
torch FP32 model's own decoding for clips of any length up to 8 s (EOS included, plus a stress run through the
largest bucket); then compiles each graph through the family pipeline. `audio8_plan.json` lists every graph with its
contract and engine."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.cli.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target, Toolkit
from core.errors import MissingSource, SetupError
from core.paths import work_dir
from toolkit.versions import DEFAULT_TOOLKIT

FAMILY = "audio8"
KV_BUCKETS = (128, 256, 512)
HEAD_SHARDS = 8
SNAPSHOT_REPO = "Edge0/Audio8-ASR-0.1B"

ModelDir = Annotated[Optional[Path], typer.Option(
    "--model-dir", help=f"Local snapshot of {SNAPSHOT_REPO} (config.json, weights, its modeling files); "
    "loaded with trust_remote_code, never downloaded.")]
RandomWeights = Annotated[Optional[str], typer.Option(
    "--random-weights", help="Instead of a snapshot, a random-init model: 'real' (the published shapes, for "
    "engine builds) or 'small' (the test model).")]
KvBuckets = Annotated[str, typer.Option("--kv-buckets", help="K/V bucket lengths Smax, one decoder step graph each.")]
HeadShards = Annotated[int, typer.Option("--head-shards", help="LM head graphs (vocabulary rows split evenly).")]
NoStress = Annotated[bool, typer.Option("--no-stress", help="Skip the stress gate (EOS ignored through the largest "
                                        "bucket against a torch forced run).")]


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.replace(" ", "").split(",") if part})
    except ValueError:
        raise SetupError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or values[0] <= 0:
        raise SetupError(f"{what} needs positive integers, got {text!r}")
    return values


def load_model(model_dir: Path | None, random_weights: str | None):
    """The model to export: a random-init one ('real' or 'small' shapes) or the snapshot in `model_dir`."""
    from converters.families.audio8 import model as M

    if random_weights is not None:
        if random_weights not in ("real", "small"):
            raise SetupError(f"--random-weights is 'real' or 'small', got {random_weights!r}")
        config = M.real_shape_config() if random_weights == "real" else M.small_config()
        return M.build_random(config, seed=0)
    if model_dir is None:
        raise SetupError(f"give --model-dir (a local snapshot of {SNAPSHOT_REPO}) or --random-weights real|small")
    return M.load_snapshot(model_dir)


def convert_audio8(
    model_dir: ModelDir = None,
    random_weights: RandomWeights = None,
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = work_dir(FAMILY),
    kv_buckets: KvBuckets = ",".join(map(str, KV_BUCKETS)),
    head_shards: HeadShards = HEAD_SHARDS,
    skip_rknn: SkipRknn = False,
    from_onnx: FromOnnx = None,
    no_stress: NoStress = False,
    max_regtask_lines: MaxRegtaskLines = 0,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_snr_db: MinSnrDb = 35.0,
) -> None:
    """Export Audio8-ASR's encoder, adapter, prefill, one decoder step per K/V bucket and LM head shards,
    gate greedy tokens against the torch FP32 model, and compile every graph."""
    from converters.family import pipeline
    from converters.families.audio8.checks import ADVICE
    from converters.families.audio8.export import export
    from toolkit.versions import check_target

    target = check_target(target)  # the export's problem-op scan is per target: refuse a bad one first
    buckets = _int_list(kv_buckets, "--kv-buckets")
    pipeline.convert(
        FAMILY, lambda: export(load_model(model_dir, random_weights), out, buckets, head_shards, not no_stress,
                               target),
        from_onnx=from_onnx, skip_rknn=skip_rknn, out=out, target=target, toolkit=toolkit,
        max_regtask_lines=max_regtask_lines, fail_on_cpu_ops=fail_on_cpu_ops, min_snr_db=min_snr_db,
        context="audio8 graphs", advice=ADVICE)


def _snapshot_dir(source: dict) -> Path:
    """The snapshot a recipe names: `source.dir`, or the huggingface_hub cache of `source.repo` (never downloaded)."""
    candidates = []
    if source.get("dir"):
        candidates.append(Path(os.path.expanduser(os.path.expandvars(source["dir"]))))
    if source.get("repo"):
        try:
            from huggingface_hub import snapshot_download

            candidates.append(Path(snapshot_download(source["repo"], local_files_only=True)))
        except Exception:  # no cache entry (or no huggingface_hub): the candidate simply is not there
            pass
    for root in candidates:
        if (root / "config.json").is_file():
            return root
    raise MissingSource(f"no Audio8-ASR snapshot (config.json, weights, modeling files) in "
                        f"{source.get('dir', '-')} or the huggingface_hub cache of {source.get('repo', '-')}; "
                        f"copy a snapshot of {SNAPSHOT_REPO} there")


def recipe_sources(recipe: dict) -> list[Path]:
    """Every file of the recipe's snapshot (MissingSource when there is none)."""
    from core.paths import snapshot_files

    return snapshot_files(_snapshot_dir(recipe["source"]))


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """The recipe's snapshot exported with its `[options]`, then built with its `[gates]`."""
    from converters.family import pipeline
    from converters.families.audio8 import model as M
    from converters.families.audio8.checks import ADVICE
    from converters.families.audio8.export import export

    options = recipe["options"]
    if "adapter_tokens" in options:
        raise SetupError(f"recipe {recipe.get('package', '?')}: [options] adapter_tokens is gone (one adapter serves "
                         "every clip length up to 8 s): remove it")
    exported = export(M.load_snapshot(_snapshot_dir(recipe["source"])), work_dir,
                      options.get("kv_buckets", KV_BUCKETS), options.get("head_shards", HEAD_SHARDS), target=target)
    return pipeline.build_recipe(recipe, target, toolkit, work_dir, exported, advice=ADVICE)


def check_audio8(
    plan_dir: Annotated[Path, typer.Option("--plan", help="Directory written by `convert audio8` (audio8_plan.json).")],
    wav: Annotated[Path, typer.Option("--wav", help="Mono 16 kHz WAV of any length up to 8 s (the encoder's "
                                      "frames); split longer audio first.")],
    engines: Annotated[bool, typer.Option("--engines/--onnx", help="Run the .rknn engines with rknn-toolkit-lite2 "
                                          "(on a board) instead of the ONNX graphs in onnxruntime.")] = False,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Stop after this many tokens.")] = 200,
) -> None:
    """Decode a WAV through the exported graphs: token ids, the buckets used, and per-stage milliseconds."""
    from runtime.host.audio import read_wav
    from runtime.board.rknnlite import RknnLiteBackend
    from runtime.board.audio8 import Audio8Runtime
    from runtime.board.mel import log_mel

    audio, rate = read_wav(wav)
    with Audio8Runtime(plan_dir, backend_for=RknnLiteBackend if engines else None,
                       artifact="rknn" if engines else "onnx") as runtime:
        if rate != runtime.contract["sample_rate"]:
            raise SetupError(f"{wav} is {rate} Hz; resample it to {runtime.contract['sample_rate']} Hz")
        decoded = runtime.transcribe(log_mel(audio, runtime.contract["mel_bins"]), audio.size, max_new_tokens)
    print("tokens:", ",".join(map(str, decoded.tokens)))
    print("buckets:", " -> ".join(map(str, decoded.buckets)))
    print("timings:", {k: round(v, 2) if isinstance(v, float) else v for k, v in decoded.timings.to_json().items()})


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("audio8")(convert_audio8)
    check_app.command("audio8")(check_audio8)

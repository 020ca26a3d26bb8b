"""`convert audio8`: Audio8-ASR-0.1B as fixed-shape NPU graphs over CPU-owned rank-3 K/V buckets. Exports the encoder,
one adapter for every placeholder count (its pooling matrix an input the runtime computes), one prefill for every
prompt length (right-padded to the largest, S = 110), one decoder step per K/V bucket (every layer in one call; the
CPU writes the K/V rows it returns), and the LM head in shards; gates greedy tokens through those graphs against the
torch FP32 model's own decoding for clips of any length up to 8 s (EOS included, plus a stress run through the
largest bucket); then compiles each graph through the family pipeline. `audio8_plan.json` lists every graph with its
contract and engine. `FAMILY` declares the rest: the `convert audio8` command and the recipe adapter are made from
it."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from pydantic import AfterValidator

from rkaudio.families.audio8.checks import ADVICE
from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.release.check import EngineChoice
from rkaudio.core.errors import SetupError

NAME = "audio8"
KV_BUCKETS = (128, 256, 512)
HEAD_SHARDS = 8
SNAPSHOT_REPO = "Edge0/Audio8-ASR-0.1B"


class Source(Table):
    """The command's --model-dir / --random-weights, a recipe's dir / repo (`_snapshot_dir`)."""

    model_dir: Optional[Path] = option(
        None, f"Local snapshot of {SNAPSHOT_REPO} (config.json, weights, its modeling files); loaded with "
        "trust_remote_code, never downloaded.", recipe=False)
    random_weights: Optional[Literal["real", "small"]] = option(
        None, "Instead of a snapshot, a random-init model: 'real' (the published shapes, for engine builds) or "
        "'small' (the test model).", recipe=False)
    dir: Optional[str] = option(None, "A local snapshot directory (environment variables and ~ expanded).",
                                cli=False)
    repo: Optional[str] = option(None, "A huggingface_hub cache id of the snapshot (never downloaded).", cli=False)


def _buckets(values: list[int]) -> list[int]:
    """The K/V buckets in ascending order, each once; refuses a non-positive one."""
    if any(value <= 0 for value in values):
        raise ValueError("needs positive integers")
    return sorted(set(values))


class Options(Table):
    kv_buckets: Annotated[list[int], AfterValidator(_buckets)] = option(
        list(KV_BUCKETS), "K/V bucket lengths Smax, one decoder step graph each.", min_length=1)
    head_shards: int = option(HEAD_SHARDS, "LM head graphs (vocabulary rows split evenly).", ge=1)
    no_stress: bool = option(False, "Skip the stress gate (EOS ignored through the largest bucket against a torch "
                             "forced run).", recipe=False)


def load_model(model_dir: Path | None, random_weights: str | None):
    """The model to export: a random-init one ('real' or 'small' shapes) or the snapshot in `model_dir`."""
    from rkaudio.families.audio8 import model as M

    if random_weights is not None:
        config = M.real_shape_config() if random_weights == "real" else M.small_config()
        return M.build_random(config, seed=0)
    if model_dir is None:
        raise SetupError(f"give --model-dir (a local snapshot of {SNAPSHOT_REPO}) or --random-weights real|small")
    return M.load_snapshot(model_dir)


def graphs_job(out: Path, kv_buckets=KV_BUCKETS, head_shards: int = HEAD_SHARDS, target: str = "rk3588"):
    """The job `convert audio8 --kv-buckets ... --head-shards ... --target ... --out OUT` makes: what a bench or a
    test exports the graphs with (`export.export_all`, `export.export`) outside a command or a recipe."""
    from rkaudio.pipeline.declaration import Job

    component = FAMILY.component(None)
    options = FAMILY.options_model(component)(kv_buckets=list(kv_buckets), head_shards=head_shards)
    return Job(FAMILY, component, Source(), options, FAMILY.gates_model(component)(), target, Path(out))


def _snapshot_dir(source: dict) -> Path:
    """The snapshot a recipe names: `source.dir`, or the huggingface_hub cache of `source.repo` (never downloaded)."""
    from rkaudio.pipeline.checkpoint import recipe_checkpoint

    return recipe_checkpoint(source, ("config.json",), f"Audio8-ASR snapshot of {SNAPSHOT_REPO}")


def export_graphs(job) -> list:
    """Every graph of the command's model (--model-dir / --random-weights) or of the recipe's snapshot, with the
    token gates (the stress gate unless --no-stress: a recipe always runs it)."""
    from rkaudio.families.audio8 import model as M
    from rkaudio.families.audio8.export import export

    # A recipe's source lacks the command's fields, unless `random_source`'s replaced it (build_cell)
    model_dir, random_weights = getattr(job.source, "model_dir", None), getattr(job.source, "random_weights", None)
    if job.recipe is not None and model_dir is None and random_weights is None:
        model = M.load_snapshot(_snapshot_dir(job.source.model_dump()))
    else:
        model = load_model(model_dir, random_weights)
    stress = not getattr(job.options, "no_stress", False)  # a command-only switch: a recipe's options lack it
    return export(job, model, stress)


def source_files(job) -> list[Path]:
    """Every file of the recipe's snapshot (MissingSource when there is none)."""
    from rkaudio.core.paths import snapshot_files

    return snapshot_files(_snapshot_dir(job.source.model_dump()))


def random_source(directory: Path, shape: str, recipe: dict) -> dict:
    """A random-init model of `shape` (built in memory: nothing is written)."""
    return {"random_weights": shape}


def after_build(job, results: list) -> None:
    """The plan names the engines as built (one step engine for every bucket with `--ladder dynamic`)."""
    from rkaudio.board.contract import EngineContract
    from rkaudio.families.audio8.export import name_built_engines

    name_built_engines(job.out, [(result.rknn.name, EngineContract.from_json(result.manifest_data["contract"]))
                                 for result in results])


def check_audio8(
    wav: Annotated[Path, typer.Option("--wav", help="Mono 16 kHz WAV of any length up to 8 s (the encoder's "
                                      "frames); split longer audio first.")],
    engines: EngineChoice,
    plan_dir: Annotated[Optional[Path], typer.Option("--plan", help="Directory written by `convert audio8` "
                        "(audio8_plan.json and its ONNX); or give --package instead.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Stop after this many tokens.")] = 200,
) -> None:
    """Decode a WAV twice through the graphs a board runs (encoder, adapter, prefill, a step per K/V bucket, LM head
    shards): over the fp32 ONNX and over --backend's engines (onnx: every tensor rounded to fp16; simulator: each
    graph compiled for --target). Print both token lists, where they first differ and whether an fp16 tie explains
    it, the buckets and per-stage milliseconds. The graphs are --plan's or --package's; on a board, the package's
    selftest.py runs the .rknn engines."""
    from rkaudio.families.audio8.check import decode_check

    decode_check(plan_dir, wav, max_new_tokens, engines)


# Tokens per second of input speech the decoder steps and head shards are judged at: assumed, neither the family
# nor the model card states one (Mandarin runs about 4-5 characters per second, one token each; English about 2.5-3
# words per second at about 1.3 BPE tokens each): the upper end, 5.
TOKENS_PER_S = 5.0


def real_time(contract):
    """Per second of input audio. The encoder, the adapter and the prefill run once per clip of up to the encoder's
    max_frames x hop / sample_rate seconds (8 s); a decoder step and each head shard once per token, 1 / TOKENS_PER_S
    seconds of speech."""
    from rkaudio.board.audio8 import Audio8Fields
    from rkaudio.gates.real_time import RealTime

    if contract.component == "decoder":
        return RealTime(1 / TOKENS_PER_S, "s of input audio", f"one token at {TOKENS_PER_S:g} tokens per s, assumed")
    fields = Audio8Fields.of(contract)
    return RealTime(fields.max_frames * fields.hop / fields.sample_rate, "s of input audio",
                    f"one call per clip of up to {fields.max_frames} frames x {fields.hop} samples / "
                    f"{fields.sample_rate} Hz")


FAMILY = Family(
    name=NAME,
    help="Export Audio8-ASR's encoder, adapter, prefill, one decoder step per K/V bucket and LM head shards,\n"
         "gate greedy tokens against the torch FP32 model, and compile every graph.",
    source=Source,
    components=(Component("asr", export_graphs, "audio8_asr.exec_plan", Options, advice=ADVICE,
                          contract_components=("encoder", "adapter", "prefill", "decoder"), context="audio8 graphs",
                          ladder=("step_<n>",)),),
    sources=source_files,
    random_source=random_source,
    after_build=after_build,
    checks={"audio8": check_audio8},
    loops=("rkaudio.board.audio8:golden_loop",),
    real_time=real_time,
)

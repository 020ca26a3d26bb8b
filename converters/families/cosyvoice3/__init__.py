"""`convert cosyvoice3`: the CosyVoice3 flow estimator (a 22-block DiT) as a ladder of fixed-length engines.

Export stage (export venv): load `decoder.estimator.*` of a snapshot's flow.pt strictly (or build random
weights of the real or a tiny shape), export one fixed-S estimator per rung with a finite mask bias, RoPE
tables and the time sinusoid as inputs, and gate it (see `export.py`). The consumer runs
`runtime.board.cosyvoice3` (smallest rung >= S, right-pad with mask 0, crop; 10-step cosine Euler ODE with CFG).
exec_plan: `cosyvoice3.exec_plan` component `flow`, role `main` = the rungs in length order (no params); a rung
split by depth (`--parts`: a length whose whole compile does not fit the build machine) lists its parts in order,
chained through `hidden` (contract `chain`).
`convert aperture PACKAGE` estimates each rung's NPU address-space cost from its manifest (`aperture.py`); the
package carries the same figures in `aperture.json`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.cli.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target, Toolkit
from core import paths
from core.errors import SetupError
from toolkit.versions import DEFAULT_TOOLKIT

FAMILY = "cosyvoice3"
DEFAULT_LENGTHS = "110,200,250,400,500"
MIN_SIMULATOR_SNR_DB = 40.0

ModelDir = Annotated[Optional[str], typer.Option(
    "--model-dir", help="Fun-CosyVoice3-0.5B snapshot directory (holding cosyvoice3.yaml and flow.pt), or the "
    "repo id to look up in the local huggingface_hub cache.")]
RandomWeights = Annotated[Optional[str], typer.Option(
    "--random-weights", help="No checkpoint: random weights of the real shape (`real`, 331 M parameters) or of the "
    "tiny test shape (`small`).")]
Lengths = Annotated[str, typer.Option(
    "--lengths", help="Comma-separated rung lengths S (mel frames, 50/s, prompt + generated): one engine each.")]
Batch = Annotated[int, typer.Option(
    "--batch", help="Estimator batch: 1 (CFG as two calls per step) or 2 (both CFG rows in one call).")]
LnForm = Annotated[str, typer.Option(
    "--ln-form", help="LayerNorm in the engine graph: plain, or safe (divides by max|x| first: no fp16 overflow).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random weights and of the gate inputs.")]
Parts = Annotated[str, typer.Option(
    "--parts", help="Split each rung by depth into this many engines chained through the hidden state (a rung "
    "whose whole compile does not fit the build machine), or S:N,... per rung (others whole).")]


def parse_parts(text) -> int | dict:
    if isinstance(text, dict):
        return {int(k): int(v) for k, v in text.items()}
    text = str(text).replace(" ", "")
    try:
        if ":" not in text:
            value = int(text)
            if value < 1:
                raise ValueError
            return value
        table = {int(k): int(v) for k, v in (item.split(":") for item in text.split(",") if item)}
        if any(v < 1 for v in table.values()):
            raise ValueError
        return table
    except ValueError:
        raise SetupError(f"--parts {text!r}: a count (e.g. 2) or S:N pairs (e.g. 400:2,500:2)") from None


def parse_lengths(text: str | list) -> list[int]:
    values = text if isinstance(text, list) else [v for v in str(text).replace(" ", "").split(",") if v]
    try:
        lengths = sorted({int(v) for v in values})
    except ValueError:
        raise SetupError(f"--lengths {text!r}: comma-separated integers, e.g. {DEFAULT_LENGTHS}") from None
    if not lengths or lengths[0] < 4:
        raise SetupError(f"--lengths {text!r}: at least one rung, each of 4 frames or more")
    return lengths


def load_model(model_dir: str | None, random_weights: str | None, seed: int):
    """(the DiT in float32, the cfm params) from a snapshot or random weights."""
    from converters.families.cosyvoice3 import snapshot

    if (model_dir is None) == (random_weights is None):
        raise SetupError("give exactly one of --model-dir SNAPSHOT or --random-weights real|small")
    if random_weights is not None:
        if random_weights not in snapshot.RANDOM_CONFIGS:
            raise SetupError(f"--random-weights {random_weights!r}: one of {', '.join(snapshot.RANDOM_CONFIGS)}")
        return snapshot.random_estimator(snapshot.RANDOM_CONFIGS[random_weights], seed), dict(snapshot.DEFAULT_CFM)
    model, source = snapshot.load_estimator(model_dir)
    return model, source.cfm


def export_rungs(model_dir: str | None, random_weights: str | None, lengths: list[int], out: Path, target: str | None,
           batch: int = 1, ln_form: str = "plain", seed: int = 0, parts=1) -> list:
    from converters.families.cosyvoice3 import export as E
    from converters.families.cosyvoice3.engine_graph import LN_FORMS

    if batch not in (1, 2):
        raise SetupError(f"--batch {batch}: 1 or 2")
    if ln_form not in LN_FORMS:
        raise SetupError(f"--ln-form {ln_form!r}: one of {', '.join(LN_FORMS)}")
    parts = parse_parts(parts)
    model, cfm = load_model(model_dir, random_weights, seed)
    return E.export(model, cfm, lengths, Path(out), target, batch=batch, ln_form=ln_form, seed=seed, parts=parts)


def convert_cosyvoice3(
    model_dir: ModelDir = None,
    random_weights: RandomWeights = None,
    lengths: Lengths = DEFAULT_LENGTHS,
    batch: Batch = 1,
    ln_form: LnForm = "plain",
    seed: Seed = 0,
    parts: Parts = "1",
    onnx: FromOnnx = None,
    skip_rknn: SkipRknn = False,
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = paths.work_dir(FAMILY),
    max_regtask_lines: MaxRegtaskLines = 0,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_snr_db: MinSnrDb = MIN_SIMULATOR_SNR_DB,
) -> None:
    """CosyVoice3 flow estimator: one fixed-length engine per rung (a ladder), gated against the reference DiT."""
    from converters.family import pipeline
    from converters.families.cosyvoice3.export import ADVICE

    if onnx is not None and (model_dir is not None or random_weights is not None):
        raise SetupError("--onnx compiles an earlier export and takes its contract from the graph: drop "
                         "--model-dir/--random-weights")
    rungs = parse_lengths(lengths)
    results = pipeline.convert(
        FAMILY, lambda: export_rungs(model_dir, random_weights, rungs, out, target, batch, ln_form, seed,
                                         parts),
        from_onnx=onnx, skip_rknn=skip_rknn, out=out, target=target, toolkit=toolkit,
        max_regtask_lines=max_regtask_lines, fail_on_cpu_ops=fail_on_cpu_ops, min_snr_db=min_snr_db,
        context="cosyvoice3 export", advice=ADVICE)
    _say_engines(results)
    _write_aperture(out, results)


def recipe_sources(recipe: dict) -> list[Path]:
    """Every file of the recipe's snapshot (cosyvoice3.yaml, flow.pt, ...); MissingSource when there is none."""
    from converters.family import pipeline
    from converters.families.cosyvoice3 import snapshot
    from core.paths import snapshot_files

    return snapshot_files(Path(snapshot.resolve(pipeline.recipe_snapshot(recipe["source"], snapshot.resolve,
                                                                         snapshot.REPO_ID))))


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """One engine per `options.lengths`; MissingSource without a snapshot (dir, or the hub cache's repo)."""
    from converters.family import pipeline
    from converters.families.cosyvoice3 import snapshot
    from converters.families.cosyvoice3.export import ADVICE

    options = recipe["options"]
    directory = snapshot.resolve(pipeline.recipe_snapshot(recipe["source"], snapshot.resolve, snapshot.REPO_ID))
    exported = export_rungs(str(directory), None, parse_lengths(options.get("lengths", DEFAULT_LENGTHS)), work_dir, target,
                      int(options.get("batch", 1)), options.get("ln_form", "plain"), int(options.get("seed", 0)),
                      options.get("parts", 1))
    results = pipeline.build_recipe(recipe, target, toolkit, work_dir, exported, advice=ADVICE)
    _say_engines(results)
    _write_aperture(work_dir, results)  # the contract lists it in package_files: packaging copies it
    return results


BudgetMib = Annotated[float, typer.Option("--budget-mib", help="Per-process NPU budget (MiB) a rung set must fit.")]
CeilingGb = Annotated[float, typer.Option(
    "--ceiling-gb", help="Largest single mapping rknn_init grants (GB); a rung estimated over it is refused.")]


def convert_aperture(
    package_dir: Annotated[Path, typer.Argument(help="A cosyvoice3 flow package (or build folder) with the "
                                                     "engines' *.manifest.json.")],
    budget_mib: BudgetMib = 3900.0,
    ceiling_gb: CeilingGb = 4.0,
) -> None:
    """CosyVoice3 flow ladder: each rung's estimated NPU context cost and init mapping from its manifest (refused
    over the ceiling), and every rung set that fits the budget, next to the spec's board-measured sets."""
    from converters.families.cosyvoice3 import aperture

    result = aperture.account(aperture.read_rungs(package_dir), budget_mib, ceiling_gb)
    print(aperture.format_report(result))


# Commands this family adds beside its build command that read a package and build nothing (no build options).
TOOL_COMMANDS = ("aperture",)


def register(app: typer.Typer, check_app: typer.Typer | None = None) -> None:
    app.command("cosyvoice3")(convert_cosyvoice3)
    app.command("aperture")(convert_aperture)


def _write_aperture(directory: Path, results: list) -> None:
    from converters.families.cosyvoice3 import aperture

    if results:
        try:
            path = aperture.write_aperture(Path(directory))
        except SetupError as error:  # e.g. one part of a split rung built alone (--onnx)
            print(f"aperture.json not written: {error}")
            return
        refused = [row["length"] for row in json.loads(path.read_text())["rungs"] if row["refused"]]
        print(f"wrote {path}" + (f" (rungs over the init-mapping ceiling: {refused})" if refused else ""))


def _say_engines(results: list) -> None:
    for result in results:
        cpu = [f"{op['type']}:{op['name']}" for op in result.manifest_data.get("ops", {}).get("cpu_ops", [])]
        print(f"{result.rknn.name}: {result.rknn.stat().st_size} bytes; CPU ops ({len(cpu)}): {', '.join(cpu) or 'none'}")

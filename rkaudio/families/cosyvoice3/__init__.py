"""`convert cosyvoice3`: the CosyVoice3 flow estimator (a 22-block DiT) as a ladder of fixed-length engines.

Export stage (export venv): load `decoder.estimator.*` of a snapshot's flow.pt strictly (or build random
weights of the real or a tiny shape), export one fixed-S estimator per rung with a finite mask bias, RoPE
tables and the time sinusoid as inputs, and gate it (see `export.py`). The consumer runs
`rkaudio.board.cosyvoice3` (smallest rung >= S, right-pad with mask 0, crop; 10-step cosine Euler ODE with CFG).
exec_plan: `cosyvoice3.exec_plan` component `flow`, role `main` = the rungs in length order (no params); a rung
split by depth (`--parts`: a length whose whole compile does not fit the build machine) lists its parts in order,
chained through `hidden` (contract `chain`).
`convert aperture PACKAGE` estimates each rung's NPU address-space cost from its manifest (`aperture.py`); the
package carries the same figures in `aperture.json`.
`convert check cosyvoice3` renders one ODE to the mel through the ladder as fp32 and as the engine (`check.py`).

`FAMILY` declares the command and the recipe adapter: the command exports from `--model-dir` or
`--random-weights`, a recipe from its `source.dir` / `source.repo`; `--lengths` is a comma list, `--parts` a count or
S:N pairs (a recipe's `parts`: an integer or a table)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import typer
from pydantic import field_validator

from rkaudio.pipeline.declaration import Component, Family, Job, Table, option
from rkaudio.release.check import EngineChoice
from rkaudio.families.cosyvoice3.snapshot import RANDOM_CONFIGS
from rkaudio.core import paths
from rkaudio.core.errors import SetupError
from rkaudio.board.cosyvoice3 import DEFAULT_STEPS

NAME = "cosyvoice3"
COMPONENT = "flow"
DEFAULT_LENGTHS = "110,200,250,400,500"
MIN_SIMULATOR_SNR_DB = 40.0
ADVICE = ("the exported estimator disagrees with the reference DiT or the padding is not exact (see the figures "
          "above)")
# engine_graph.LN_FORMS, spelled out so that `--help` and a recipe's check import no torch
# (tests/families/cosyvoice3/test_cli.py holds them equal).
LN_FORMS = ("plain", "safe")
PARTS_FORMS = "a count (e.g. 2) or S:N pairs (e.g. 400:2,500:2)"


def parse_parts(text) -> int | dict:
    """`--parts` / a recipe's `parts`: one count for every rung, or {S: count} (others whole)."""
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
        raise SetupError(f"--parts {text!r}: {PARTS_FORMS}") from None


def _parts_of_cli(text: str) -> int | dict:
    """--parts in a recipe's form: a count, or {"S": count} (a TOML table's keys are strings)."""
    parts = parse_parts(text)
    return parts if isinstance(parts, int) else {str(k): v for k, v in parts.items()}


def load_model(model_dir: str | None, random_weights: str | None, seed: int):
    """(the DiT in float32, the cfm params) from a snapshot or random weights."""
    from rkaudio.families.cosyvoice3 import snapshot

    if (model_dir is None) == (random_weights is None):
        raise SetupError("give exactly one of --model-dir SNAPSHOT or --random-weights real|small")
    if random_weights is not None:
        return snapshot.random_estimator(snapshot.RANDOM_CONFIGS[random_weights], seed), dict(snapshot.DEFAULT_CFM)
    model, source = snapshot.load_estimator(model_dir)
    return model, source.cfm


class Source(Table):
    model_dir: Optional[str] = option(
        None, "Fun-CosyVoice3-0.5B snapshot directory (holding cosyvoice3.yaml and flow.pt), or the repo id to look "
        "up in the local huggingface_hub cache.", recipe=False)
    random_weights: Optional[Literal[tuple(RANDOM_CONFIGS)]] = option(
        None, "No checkpoint: random weights of the real shape (`real`, 331 M parameters) or of the tiny test shape "
        "(`small`).", recipe=False)
    dir: Optional[str] = option(None, "Snapshot directory holding cosyvoice3.yaml and flow.pt (environment variables "
                                "expanded; one that names an unset variable is skipped).", cli=False)
    repo: Optional[str] = option(None, "Repo id looked up in the local huggingface_hub cache (never downloaded) when "
                                 "`dir` holds no snapshot.", cli=False)


class Options(Table):
    lengths: list[int] = option(
        [int(v) for v in DEFAULT_LENGTHS.split(",")], "Comma-separated rung lengths S (mel frames, 50/s, prompt + "
        "generated): one engine each.", min_length=1)
    batch: int = option(1, "Estimator batch: 1 (CFG as two calls per step) or 2 (both CFG rows in one call).",
                        ge=1, le=2)
    ln_form: Literal[LN_FORMS] = option(
        "plain", "LayerNorm in the engine graph: plain, or safe (divides by max|x| first: no fp16 overflow).")
    seed: int = option(0, "Seed of the random weights and of the gate inputs.")
    parts: Union[int, dict[str, int]] = option(
        1, "Split each rung by depth into this many engines chained through the hidden state (a rung whose whole "
        "compile does not fit the build machine), or S:N,... per rung (others whole).", cli_parse=_parts_of_cli)

    @field_validator("lengths")
    @classmethod
    def _rungs(cls, lengths: list[int]) -> list[int]:
        if any(length < 4 for length in lengths):
            raise ValueError("each rung of 4 frames or more")
        return sorted(set(lengths))

    @field_validator("parts")
    @classmethod
    def _parts(cls, parts):
        counts = [parts] if isinstance(parts, int) else list(parts.values())
        if any(count < 1 for count in counts) or not isinstance(parts, int) and not all(
                key.isdigit() for key in parts):
            raise ValueError('a count of at least 1, or a table of rung length = count, e.g. { "400" = 2 }')
        return parts


def parse_lengths(text: str) -> list[int]:
    """--lengths: comma-separated rung lengths of at least 4 frames."""
    try:
        lengths = sorted({int(part) for part in text.replace(" ", "").split(",") if part})
    except ValueError:
        raise SetupError(f"--lengths {text!r}: expected comma-separated integers, e.g. 24,32") from None
    if not lengths or lengths[0] < 4:
        raise SetupError(f"--lengths {text!r}: each rung of 4 frames or more")
    return lengths


def check_onnx(model_dir: str | None, random_weights: str | None, onnx: list[Path], lengths: str | None, seed: int,
               out: Path, engines) -> list[Path]:
    """The ladder's ONNX: --onnx, --package's, or a fresh export of --model-dir / --random-weights (at --lengths,
    else the rungs the release recipe ships for the target, with its batch, LayerNorm form and parts) into
    `<out stem>_engine/`."""
    earlier = [flag for flag, given in (("--onnx", onnx), ("--package", engines.package)) if given]
    if len(earlier) > 1:
        raise SetupError("give --onnx or --package, not both")
    if earlier and (model_dir is not None or random_weights is not None or lengths is not None):
        raise SetupError(f"{earlier[0]} renders through an earlier export: drop --model-dir/--random-weights/--lengths")
    if onnx:
        return [Path(path) for path in onnx]
    if engines.package is not None:
        return engines.package_onnx(COMPONENT)
    rungs = (parse_lengths(lengths) if lengths else
             engines.recipe_option(COMPONENT, "lengths", parse_lengths(DEFAULT_LENGTHS)))
    shape = {key: engines.recipe_option(COMPONENT, key, default) for key, default in
             (("batch", 1), ("ln_form", "plain"), ("parts", 1))}
    print(f"exporting the flow estimator at rungs {rungs} for {engines.target} ...")
    component = FAMILY.component(COMPONENT)
    job = Job(FAMILY, component, Source(model_dir=model_dir, random_weights=random_weights),
              FAMILY.options_model(component)(lengths=rungs, seed=seed, **shape), FAMILY.gates_model(component)(),
              engines.target, out.parent / f"{out.stem}_engine", engines.toolkit)
    return [record.onnx for record in export_ladder(job)]


def check_cosyvoice3(
    engines: EngineChoice,
    model_dir: Annotated[Optional[str], typer.Option(
        "--model-dir", help=Source.model_fields["model_dir"].description)] = None,
    random_weights: Annotated[Optional[str], typer.Option(
        "--random-weights", help=Source.model_fields["random_weights"].description)] = None,
    onnx: Annotated[Optional[list[Path]], typer.Option(
        "--onnx", help="Estimator ONNX written by `convert cosyvoice3` (repeat it: every rung, or every part of a "
        "split rung, to choose among) instead of a fresh export.")] = None,
    lengths: Annotated[Optional[str], typer.Option(
        "--lengths", help="Rungs of the fresh export (comma-separated frames; default: the release recipe's for "
        "--target). Small rungs render the tiny model fast.")] = None,
    frames: Annotated[Optional[int], typer.Option(
        "--frames", min=1, help="Mel frames to render (50/s, prompt + generated); the smallest rung that holds them "
        "runs (default: the end-to-end golden's, 3/4 of the smallest rung).")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Euler steps of the ODE.")] = DEFAULT_STEPS,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the noise, mu, spks and prompt (and of the random "
                                                     "weights of a fresh export).")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="The engine's mel (.npy); the fp32 mel is written beside it "
                                      "as <name>.fp32.npy, both mels and their difference with the SNR of the prompt "
                                      "and generated frames as <name>.png.")] = paths.work_dir(NAME) / "check.npy",
) -> None:
    """Render one ODE to the mel through the flow-estimator ladder twice, through the fp32 ONNX and through the
    engine (--backend simulator: compiled for --target), on the same seeded conditioning; print the engine's SNR
    on the prompt and the generated frames, overall and after each step."""
    from rkaudio.families.cosyvoice3.check import render_check

    if random_weights is not None and random_weights not in RANDOM_CONFIGS:
        raise SetupError(f"--random-weights {random_weights!r}: expected one of {', '.join(RANDOM_CONFIGS)}")
    render_check(check_onnx(model_dir, random_weights, onnx or [], lengths, seed, out, engines), FAMILY.contract_name,
                 frames=frames, steps=steps, seed=seed, out=out, engines=engines)


def export_ladder(job) -> list:
    """The command's ladder from --model-dir or --random-weights, or a recipe's from its snapshot (MissingSource
    without one), into `job.out` (`rkaudio.families.cosyvoice3.export.export`)."""
    from rkaudio.families.cosyvoice3 import export as E

    # A recipe's source lacks the command's fields, unless `random_source`'s replaced it (build_cell)
    model_dir, random_weights = getattr(job.source, "model_dir", None), getattr(job.source, "random_weights", None)
    if job.recipe is not None and model_dir is None and random_weights is None:
        from rkaudio.pipeline.checkpoint import recipe_checkpoint
        from rkaudio.families.cosyvoice3 import snapshot

        model_dir = str(recipe_checkpoint(job.source.model_dump(), snapshot.FILES, snapshot.SNAPSHOT_NAME))
    model, cfm = load_model(model_dir, random_weights, job.options.seed)
    return E.export(job, model, cfm)


def from_onnx(job, onnx_path: Path) -> list:
    """An earlier rung compiled: its contract is the graph's, so a source is refused."""
    from rkaudio.pipeline.pipeline import Exported

    if job.recipe is None and (job.source.model_dir is not None or job.source.random_weights is not None):
        raise SetupError("--onnx compiles an earlier export and takes its contract from the graph: drop "
                         "--model-dir/--random-weights")
    return [Exported.from_onnx(onnx_path, FAMILY.contract_name)]


def recipe_sources(job) -> list[Path]:
    """Every file of the recipe's snapshot (cosyvoice3.yaml, flow.pt, ...); MissingSource when there is none."""
    from rkaudio.pipeline.checkpoint import recipe_checkpoint
    from rkaudio.families.cosyvoice3 import snapshot
    from rkaudio.core.paths import snapshot_files

    return snapshot_files(recipe_checkpoint(job.source.model_dump(), snapshot.FILES, snapshot.SNAPSHOT_NAME))


def random_source(directory: Path, shape: str, recipe: dict) -> dict:
    """Random estimator weights of `shape` (built in memory: nothing is written)."""
    return {"random_weights": shape}


def after_build(job, results: list) -> None:
    """Each engine's size and CPU ops, then `aperture.json` beside the engines (the contract lists it in
    package_files: packaging copies it)."""
    from rkaudio.pipeline.pipeline import say_engines

    say_engines(job, results)
    _write_aperture(job.out, results)


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
    from rkaudio.families.cosyvoice3 import aperture

    result = aperture.account(aperture.read_rungs(package_dir), budget_mib, ceiling_gb)
    print(aperture.format_report(result))


def _write_aperture(directory: Path, results: list) -> None:
    from rkaudio.families.cosyvoice3 import aperture

    if results:
        try:
            path = aperture.write_aperture(Path(directory))
        except SetupError as error:  # e.g. one part of a split rung built alone (--onnx)
            print(f"aperture.json not written: {error}")
            return
        refused = [row["length"] for row in json.loads(path.read_text())["rungs"] if row["refused"]]
        print(f"wrote {path}" + (f" (rungs over the init-mapping ceiling: {refused})" if refused else ""))


def real_time(contract):
    """Per second of generated mel over one ODE: the rung's S frames at frame_rate_hz (every frame counted as
    generated: with a prompt of P frames the factor is S / (S - P) times this) over the calls each engine takes in
    one ODE, ode.steps (10, upstream's n_timesteps) x 2 CFG calls at B=1 or 1 at B=2 (a depth-split rung's part:
    its own calls, the rung's factor the sum of its parts')."""
    from rkaudio.board.cosyvoice3 import DEFAULT_STEPS, FlowFields, RungFields, calls_per_solve
    from rkaudio.gates.real_time import RealTime

    flow, rung = FlowFields.of(contract), RungFields.of(contract)
    steps = int((flow.ode or {}).get("steps", DEFAULT_STEPS))
    calls = calls_per_solve(contract, steps) // rung.parts
    return RealTime(rung.length / flow.frame_rate_hz / calls, "s of generated mel",
                    f"{rung.length} frames at {flow.frame_rate_hz} Hz over {calls} calls: {steps} ODE steps, "
                    f"B={flow.batch}")


FAMILY = Family(
    name=NAME,
    help="CosyVoice3 flow estimator: one fixed-length engine per rung (a ladder), gated against the reference DiT.",
    source=Source,
    components=(Component(COMPONENT, export_ladder, "cosyvoice3.exec_plan", Options, advice=ADVICE, context="cosyvoice3 export",
                          ladder=("main",)),),
    build_defaults={"min_simulator_snr_db": MIN_SIMULATOR_SNR_DB},
    sources=recipe_sources,
    random_source=random_source,
    from_onnx=from_onnx,
    after_build=after_build,
    checks={"cosyvoice3": check_cosyvoice3},
    tools={"aperture": convert_aperture},
    loops=("rkaudio.board.cosyvoice3:golden_loop",),
    real_time=real_time,
)

"""The commands that are not a family's: `convert build` (any fixed-shape ONNX -> gated .rknn + manifest),
`convert inspect` (manifest summary) and `convert engines` (every recipe for a target into dist/), plus
the lookup of the families themselves (`rkaudio/families/<name>/`), which sit in this top layer."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.cli.diagnose import diagnose
from rkaudio.release.recipes import DIST_DIR, RECIPES_DIR
from rkaudio.cli.families import declaration, register as register_families
from rkaudio.cli.options import (normalised_target, FailOnCpuOps, MaxCpuOps, MaxRealTimeFactor, MaxRegtaskLines,
                                 MinSnrDb, OutDir, TargetOption, ToolkitOption)
from rkaudio.core.errors import SetupError
from rkaudio.board.soc import FP16_TARGETS
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

ShapeOption = Annotated[Optional[list[str]], typer.Option(
    "--shape", metavar="NAME=DIMS", help="Pin an input's dimensions, e.g. --shape mel=1,100,80 (repeat per "
    "input): an ONNX exported with a dynamic time axis compiles at that one shape.")]

def build(
    onnx_path: Annotated[Path, typer.Argument(metavar="ONNX", help="Fixed-shape ONNX to compile (every input "
                                              "dimension a number; its rkaudio contract, if any, goes into the "
                                              "manifest).")],
    target: TargetOption,
    out: OutDir = Path("."),
    toolkit: ToolkitOption = DEFAULT_TOOLKIT,
    max_regtask_lines: MaxRegtaskLines = BuildOptions.max_regtask_lines,
    fail_on_cpu_ops: FailOnCpuOps = BuildOptions.fail_on_cpu_ops,
    max_cpu_ops: MaxCpuOps = BuildOptions.max_cpu_ops,
    max_real_time_factor: MaxRealTimeFactor = BuildOptions.max_real_time_factor,
    selfcheck: Annotated[Optional[Path], typer.Option(
        "--selfcheck", help="Inputs for the simulator check: an .npz whose keys are the ONNX input names. "
        "Default: standard-normal inputs (seed 0) for float inputs, zeros for integer inputs.")] = None,
    min_snr_db: MinSnrDb = BuildOptions.min_simulator_snr_db,
    timeout: Annotated[Optional[float], typer.Option(
        "--timeout", help="Kill the compiler child after this many seconds (reported as a failed stage).")] = None,
    shape: ShapeOption = None,
    fix: Annotated[bool, typer.Option("--fix", help="Mend what `convert doctor` finds with the shared graph passes "
                   "(fold, polyphase levels, conv padding, ...), each gated against the graph before it on the "
                   "self-check inputs (a pass failing its gate is not applied); the mended graph is written as "
                   "<stem>.fixed.onnx in --out and compiled, and the manifest records the doctor's report.")] = False,
    window: Annotated[Optional[str], typer.Option(
        "--window", metavar="FRAMES|auto", help="Compile a decoder exported with a dynamic time axis (a conv "
        "vocoder) for this many latent frames, to be walked along a latent of any length: the smallest context "
        "whose interior windows match the full-length run is measured and written with the window into the ONNX "
        "metadata (<stem>_w<W>.onnx), and the self-test goldens walk it (`convert vocoder` does the same). auto: "
        "64, 128 and 256 built, the fewest predicted board ms per emitted frame kept.")] = None,
    time_axis: Annotated[Optional[str], typer.Option(
        "--time-axis", metavar="NAME:AXIS", help="With --window: the latent input and its time axis (e.g. mel:1 "
        "for a [1, frames, 80] mel); default: the input's one dynamic axis past the batch.")] = None,
    sample_rate: Annotated[Optional[int], typer.Option("--sample-rate", min=1, help="With --window: output samples "
                           "per second (the real-time gate's rate); default: `convert vocoder`'s.")] = None,
) -> None:
    """Compile an ONNX to an fp16 .rknn in the converter venv, gate it (REGTASK lines, CPU ops, real time where the
    family its contract names declares it, simulator SNR) and write <stem>.rknn, <stem>.manifest.json and
    <stem>.build.log into --out. With --shape the graph is pinned and folded first (<stem>.pinned.onnx); with --fix
    it is mended first (<stem>.fixed.onnx); with --window it is compiled for one window of a walk."""
    import tempfile

    import numpy as np
    import onnx

    from rkaudio.toolkit.session import input_specs, random_feeds
    from rkaudio.core.manifest import summary_lines

    from rkaudio.core.contract import contract_of
    from rkaudio.core.onnx_graph import load_model
    from rkaudio.engine import doctor as doctoring
    from rkaudio.surgery.graph.fold import fold_fixed

    model = load_model(onnx_path)  # a truncated, foreign or NaN-carrying file stops here, in one line
    if window is not None:
        if shape or selfcheck is not None:
            raise SetupError("--window pins the time axis itself and measures on its own latents: drop "
                             + " and ".join(flag for flag, given in (("--shape", shape), ("--selfcheck", selfcheck))
                                            if given))
        walked_build(onnx_path, window, time_axis, sample_rate, fix, target, toolkit, out, BuildOptions(
            target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines, fail_on_cpu_ops=fail_on_cpu_ops,
            max_cpu_ops=max_cpu_ops, max_real_time_factor=max_real_time_factor, min_simulator_snr_db=min_snr_db))
        return
    options = BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
                           fail_on_cpu_ops=fail_on_cpu_ops, max_cpu_ops=max_cpu_ops,
                           max_real_time_factor=max_real_time_factor, real_time=family_real_time(contract_of(model)),
                           min_simulator_snr_db=min_snr_db, timeout_s=timeout)
    def say(line: str) -> None:
        typer.echo(line, err=True)

    if shape or fix:
        model = doctoring.pinned(model, doctoring.parse_shapes(shape))
    with tempfile.TemporaryDirectory(prefix="rkaudio-selfcheck-") as scratch:
        feeds = dict(np.load(selfcheck)) if selfcheck is not None else random_feeds(input_specs(model))
        if selfcheck is None:
            selfcheck = Path(scratch) / "inputs.npz"
            np.savez(selfcheck, **feeds)

        def compile_engine(graph_path: Path, inputs: Path, reference: Optional[Path] = None, report=None):
            say(f"building {graph_path.name} for {target} with rknn-toolkit2 {toolkit} ...")
            return build_engine(graph_path, out, options, selfcheck=inputs,  # a dead child: BuildError, exit 4
                                export_verdicts=doctoring.pass_verdicts(report) if report else (),
                                reference_onnx=reference)

        if shape or fix:
            out.mkdir(parents=True, exist_ok=True)
        if fix:
            result = doctoring.build_mended(model, onnx_path.stem, target, toolkit, feeds, selfcheck, out,
                                            Path(scratch), compile_engine, say)
        else:
            if shape:
                onnx_path = out / f"{onnx_path.stem}.pinned.onnx"
                onnx.save(fold_fixed(model), str(onnx_path))
            result = compile_engine(onnx_path, selfcheck)
    typer.echo("\n".join(summary_lines(result.manifest_data)))
    typer.echo(f"wrote {result.rknn}, {result.manifest.name}, {result.build_log.name}")


def walked_build(onnx_path: Path, window: str, time_axis: str | None, sample_rate: int | None, fix: bool, target: str,
                 toolkit: str, out: Path, options: BuildOptions) -> None:
    """`convert build --window`: the `vocoder` family's job for this ONNX, run as `convert vocoder` runs it."""
    from dataclasses import fields

    from rkaudio.families.vocoder import window_choice
    from rkaudio.pipeline import pipeline

    family = declaration("vocoder")
    gates = {entry.name: getattr(options, entry.name) for entry in fields(options)
             if entry.name in family.gates_model(family.components[0]).model_fields}
    job = family.job(target=target, out=out, toolkit=toolkit, source={"model": str(onnx_path)},
                     options={"window": window_choice(window), "time_axis": time_axis, "fix": fix,
                              **({} if sample_rate is None else {"sample_rate": sample_rate})}, gates=gates)
    pipeline.run(job, say=typer.echo)


def doctor(
    onnx_path: Annotated[Path, typer.Argument(metavar="ONNX", help="Any ONNX (a speech model's vocoder, decoder or "
                                              "encoder); dynamic input dimensions are pinned with --shape.")],
    target: TargetOption,
    toolkit: ToolkitOption = DEFAULT_TOOLKIT,
    shape: ShapeOption = None,
    selfcheck: Annotated[Optional[Path], typer.Option(
        "--selfcheck", help="Inputs for the fp16 range profile: an .npz whose keys are the ONNX input names. "
        "Default: standard-normal inputs (seed 0) for float inputs, zeros for integer inputs.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Report, by node name, what TARGET's NPU will not take in an ONNX, and the pass of `convert build --fix` that
    mends each: axes longer than an op's register field (REGTASK lines, a board-only corruption), ops the target
    runs on the CPU (from the placement table measured per SoC and toolkit), activations past the fp16 range on the
    self-check inputs, and ops the board refuses or computes wrongly while the simulator passes. Builds nothing."""
    import json

    import numpy as np

    from rkaudio.core.onnx_graph import load_model
    from rkaudio.engine import doctor as doctoring
    from rkaudio.toolkit.session import input_specs, random_feeds

    model = doctoring.pinned(load_model(onnx_path), doctoring.parse_shapes(shape))
    feeds = dict(np.load(selfcheck)) if selfcheck is not None else random_feeds(input_specs(model))
    report = doctoring.diagnose(model, target, toolkit, feeds)
    typer.echo(json.dumps(report.to_json(), indent=2) if as_json else "\n".join(report.lines()))


def family_real_time(contract):
    """The real time per call (`Family.real_time`) of the family an ONNX's contract names; None for a plain ONNX or a
    family rkaudio does not have."""
    if not contract.family:
        return None
    try:
        return declaration(contract.family.replace("-", "_")).real_time
    except SetupError:
        return None


def inspect(
    path: Annotated[Path, typer.Argument(
        metavar="ENGINE_OR_MANIFEST", help="An .rknn built by rkaudio (its manifest sits beside it) or the manifest.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole manifest as JSON.")] = False,
) -> None:
    """Print an engine's manifest summary: target, toolkit, I/O, bytes, REGTASK, op placement, predicted board time,
    gates, exec_plan. An engine built before the board-time model gets its prediction here, from the manifest's I/O
    and the layer table in its build log (marked `computed by inspect`), so old and new engines compare."""
    import json

    from rkaudio.core.manifest import manifest_path_for, read_manifest, summary_lines
    from rkaudio.gates.board_time import predict_from_log

    data = read_manifest(path)
    log = manifest_path_for(path).with_name(data.get("build_log") or "-")
    if data.get("predicted_board_ms") is None and log.is_file():
        data["predicted_board_ms"] = predict_from_log(data, log.read_text(errors="replace"))
        if data["predicted_board_ms"]:
            data["predicted_board_ms"]["computed_by"] = "convert inspect, from the build log"
    typer.echo(json.dumps(data, indent=2) if as_json else "\n".join(summary_lines(data)))


def engines(
    target: Annotated[Optional[str], typer.Option("--target", "-t", callback=normalised_target,
                                                  help="SoC to build for; every recipe whose "
                      f"`targets` list it is built. One of: {', '.join(FP16_TARGETS)}. Required to build.")] = None,
    toolkit: ToolkitOption = DEFAULT_TOOLKIT,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Build only this package (a recipe's "
                                                      "`package` name); repeat for several.")] = None,
    list_recipes: Annotated[bool, typer.Option("--list", help="List the recipes (package, family, targets, "
                                               "source) and build nothing.")] = False,
    recipes_dir: Annotated[Path, typer.Option("--recipes", help="Directory of recipe TOML files.")] = RECIPES_DIR,
    dist_dir: Annotated[Path, typer.Option("--dist", help="Output root: packages go to DIST/<target>/"
                                           "<package>_<target>/.")] = DIST_DIR,
    reproduce: Annotated[bool, typer.Option("--reproduce", help="Compile every engine twice and fail the package "
                         "unless both compiles are byte-identical.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Rebuild packages that are up to date (same recipe, "
                     "checkpoint, code, toolkit and target as the package in dist).")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Build up to this many packages at once, in "
                    "separate processes, never more at once than the memory their last builds needed.")] = 1,
    matrix_json: Annotated[bool, typer.Option("--matrix-json", help="Print the (package, target) pairs the recipes "
                           "build (all targets, or --target's) as a CI matrix JSON and build nothing.")] = False,
) -> None:
    """Build the release engines of every recipe for one target into dist/ (what `make engines` runs).

    A recipe whose checkpoint is missing is skipped with one line saying how to supply it.
    The exit code is 3 if any built recipe failed; the others are still built."""
    from rkaudio.release import recipes
    from rkaudio.release.package import format_table

    if matrix_json:
        import json

        pairs = [{"package": r["package"], "target": t, "family": r["family"]}
                 for r in recipes.load_recipes(recipes_dir, declaration)
                 for t in r["targets"] if target is None or t == target]
        print(json.dumps({"include": pairs}))
        return
    if list_recipes:
        loaded = recipes.load_recipes(recipes_dir, declaration)
        rows = [{"package": r["package"], "family": r["family"], "targets": ",".join(r["targets"]),
                 "components": ", ".join(f"{name} ({'/'.join(c['targets'])})" for name, c in r["components"].items())
                 or "-", "builds_for_target": target in r["targets"],
                 "source": ", ".join(f"{key}={value}" for key, value in r["source"].items()) or "-"}
                for r in loaded]
        print(format_table(rows))
        refusals = [f"{r['package']}{'.' + name if name else ''} on {t}: {reason}" for r in loaded
                    for name, table in [(None, r), *r["components"].items()] for t, reason in table["refused"].items()
                    if target in (None, t)]
        if refusals:
            print("\nrefused (measured):\n" + "\n".join(f"  {line}" for line in refusals))
        return
    if target is None:
        raise SetupError(f"--target is required to build: one of {', '.join(FP16_TARGETS)}")
    rows = recipes.build_all(target, declaration, toolkit, recipes_dir, dist_dir, only, reproduce=reproduce,
                             jobs=jobs, force=force)
    print()
    print(format_table(rows, recipes.SUMMARY_COLUMNS) if rows else f"no recipe in {recipes_dir} lists target {target}")
    if any(row["status"] == "FAILED" for row in rows):
        sys.exit(3)


PackageDir = Annotated[Path, typer.Argument(metavar="PACKAGE_DIR", help="A package built by `convert engines` "
                                             "(dist/<target>/<package>_<target>/).")]


def selftest(
    package_dir: PackageDir,
    backend: Annotated[str, typer.Option("--backend", help="simulator: compile each engine's ONNX in the toolkit "
                                         "simulator (it refuses engines loaded from disk) and require the stored "
                                         "simulator outputs back (>= 120 dB); onnx: onnxruntime fp32 on the "
                                         "ONNX.")] = "simulator",
    onnx_dir: Annotated[Optional[Path], typer.Option("--onnx-dir", help="Where the package's ONNX files are "
                        "(default: the work directory each manifest names, kept by `convert engines`).")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per engine after the warm-up.")] = 3,
    report: Annotated[Optional[Path], typer.Option("--report", help="JSON report, outside the package (default: "
                      "selftest-report.json in the working directory, or beside the package when run inside it; "
                      "none for a folder without SHA256SUMS).")] = None,
) -> None:
    """Replay a package's board self-test on the host: the same kit (`selftest.py`) and gates, with the engines
    compiled from their ONNX in the simulator (or run in onnxruntime). Exit 0 pass, 3 a gate failed, 2 setup."""
    from rkaudio.release.kit import HostOpener
    from rkaudio.board.selftest import selftest as run_selftest

    if not package_dir.is_dir():
        raise SetupError(f"no package directory {package_dir}")
    code = run_selftest(package_dir, HostOpener(package_dir, backend, onnx_dir), runs=runs, report_path=report,
                        say=lambda line: typer.echo(line))
    if code:
        sys.exit(code)


def verify(
    package_dir: PackageDir,
    rebuild: Annotated[Optional[Path], typer.Option("--rebuild", metavar="ONNX_DIR", help="Also compile every "
                       "engine again from the ONNX in this directory and require the manifest's digest "
                       "(builds are byte-identical).")] = None,
) -> None:
    """Check every file of a package against its SHA256SUMS and its manifests: each missing, extra or changed
    file is named. Exit 0 when intact, 3 otherwise."""
    from rkaudio.release.kit import rebuild_problems, verify as verify_package

    if not package_dir.is_dir():
        raise SetupError(f"no package directory {package_dir}")
    problems = verify_package(package_dir)
    if rebuild is not None:
        problems += rebuild_problems(package_dir, rebuild, say=lambda line: typer.echo(line, err=True))
    for problem in problems:
        typer.echo(problem)
    if problems:
        typer.echo(f"{package_dir}: {len(problems)} problem(s)")
        sys.exit(3)
    typer.echo(f"{package_dir}: every file matches SHA256SUMS and the manifests")


def publish(
    dist_target_dir: Annotated[Path, typer.Argument(metavar="DIST_TARGET_DIR", help="dist/<target>/: every package "
                               "in it (a folder with SHA256SUMS) is published, each in a folder of the repository.")],
    repo_id: Annotated[str, typer.Option("--repo-id", help="Hub repository, ORG/NAME (created if missing).")],
    revision: Annotated[Optional[str], typer.Option("--revision", help="Tag the upload with this name, e.g. "
                        "v0.3.0 (a tag that exists is left alone).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the packages and print every file operation; "
                       "upload nothing.")] = False,
    replay: Annotated[str, typer.Option("--replay", help="Host replay each package's self-test before uploading: "
                      "simulator, onnx, or none.")] = "simulator",
) -> None:
    """Publish a release to the Hugging Face Hub: each package is checked first (SHA256SUMS and manifests, the
    host replay of its self-test; one failure refuses the whole release), then only the files whose remote
    hashes differ are uploaded, and the revision is tagged. Needs a token (`huggingface-cli login`)."""
    from rkaudio.release.publish import publish as run_publish

    if replay not in ("simulator", "onnx", "none"):
        raise SetupError(f"--replay {replay!r}: expected simulator, onnx or none")
    run_publish(dist_target_dir, repo_id, revision, dry_run, replay, say=typer.echo)


SHARED_COMMANDS = {"build": build, "doctor": doctor, "inspect": inspect, "engines": engines, "selftest": selftest,
                   "verify": verify, "publish": publish, "diagnose": diagnose}


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    """The shared commands, then every family's own (`convert <name>`, made from its declaration, and its
    `convert check <name>` and extra commands)."""
    for name, command in SHARED_COMMANDS.items():
        app.command(name)(command)
    register_families(app, check_app)

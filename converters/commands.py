"""The commands that are not a family's: `convert build` (any fixed-shape ONNX -> gated .rknn + manifest),
`convert inspect` (manifest summary) and `convert engines` (every recipe for a target into dist/), plus
the lookup of the families themselves (`converters/families/<name>/`), which sit in this top layer."""
from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.recipes import DIST_DIR, RECIPES_DIR
from converters.options import FailOnCpuOps, MaxRegtaskLines, MinSnrDb, OutDir, Target, Toolkit
from core.errors import SetupError
from toolkit.versions import DEFAULT_TOOLKIT, FP16_TARGETS

FAMILIES_PACKAGE = "converters.families"


def family_names() -> list[str]:
    """Every family package (or module) under converters/families/, by name."""
    import converters.families as families

    return sorted(info.name for info in pkgutil.iter_modules(families.__path__))


def family_module(name: str):
    """The family `name` (converters/families/<name>/), or a SetupError naming what was expected."""
    try:
        return importlib.import_module(f"{FAMILIES_PACKAGE}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{FAMILIES_PACKAGE}.{name}":
            raise
        raise SetupError(f"no family '{name}' (expected converters/families/{name}/)") from None


def recipe_builder(name: str):
    """The `build_recipe(recipe, target, toolkit, work_dir)` of family `name`."""
    module = family_module(name)
    if not hasattr(module, "build_recipe"):
        raise SetupError(f"family '{name}' has no build_recipe(recipe, target, toolkit, work_dir)")
    return module.build_recipe


def build(
    onnx_path: Annotated[Path, typer.Argument(metavar="ONNX", help="Fixed-shape ONNX to compile (every input "
                                              "dimension a number; its rkaudio contract, if any, goes into the manifest).")],
    target: Target,
    out: OutDir = Path("."),
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    max_regtask_lines: MaxRegtaskLines = 100_000,
    fail_on_cpu_ops: FailOnCpuOps = False,
    selfcheck: Annotated[Optional[Path], typer.Option(
        "--selfcheck", help="Inputs for the simulator check: an .npz whose keys are the ONNX input names. "
        "Default: standard-normal inputs (seed 0) for float inputs, zeros for integer inputs.")] = None,
    min_snr_db: MinSnrDb = 35.0,
    timeout: Annotated[Optional[float], typer.Option(
        "--timeout", help="Kill the compiler child after this many seconds (reported as a failed stage).")] = None,
) -> None:
    """Compile an ONNX to an fp16 .rknn in the converter venv, gate it (REGTASK lines, CPU ops, simulator SNR)
    and write <stem>.rknn, <stem>.manifest.json and <stem>.build.log into --out."""
    import tempfile

    import numpy as np
    import onnx

    from converters.engine import BuildOptions, build_engine
    from toolkit.session import graph_io, random_feeds
    from core.errors import SetupError
    from toolkit.versions import check_target
    from gates.manifest import summary_lines

    check_target(target)
    if not onnx_path.is_file():
        raise SetupError(f"no ONNX at {onnx_path}")
    options = BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
                           fail_on_cpu_ops=fail_on_cpu_ops, min_simulator_snr_db=min_snr_db, timeout_s=timeout)
    with tempfile.TemporaryDirectory(prefix="rkaudio-selfcheck-") as scratch:
        if selfcheck is None:
            inputs, _ = graph_io(onnx.load(str(onnx_path), load_external_data=False))
            selfcheck = Path(scratch) / "inputs.npz"
            np.savez(selfcheck, **random_feeds(inputs))
        typer.echo(f"building {onnx_path.name} for {target} with rknn-toolkit2 {toolkit} ...", err=True)
        result = build_engine(onnx_path, out, options, selfcheck=selfcheck)  # a dead child: BuildError, exit 4
    typer.echo("\n".join(summary_lines(result.manifest_data)))
    typer.echo(f"wrote {result.rknn}, {result.manifest.name}, {result.build_log.name}")


def inspect(
    path: Annotated[Path, typer.Argument(metavar="ENGINE_OR_MANIFEST",
                                         help="An .rknn built by rkaudio (its manifest sits beside it) or the manifest.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole manifest as JSON.")] = False,
) -> None:
    """Print an engine's manifest summary: target, toolkit, I/O, bytes, REGTASK, op placement, gates, exec_plan."""
    import json

    from gates.manifest import read_manifest, summary_lines

    data = read_manifest(path)
    typer.echo(json.dumps(data, indent=2) if as_json else "\n".join(summary_lines(data)))


def engines(
    target: Annotated[str, typer.Option("--target", "-t", help="SoC to build for; every recipe whose `targets` "
                                        f"list it is built. One of: {', '.join(FP16_TARGETS)}.")],
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Build only this package (a recipe's "
                                                      "`package` name); repeat for several.")] = None,
    list_recipes: Annotated[bool, typer.Option("--list", help="List the recipes (package, family, targets, "
                                               "source) and build nothing.")] = False,
    recipes_dir: Annotated[Path, typer.Option("--recipes", help="Directory of recipe TOML files.")] = RECIPES_DIR,
    dist_dir: Annotated[Path, typer.Option("--dist", help="Output root: packages go to DIST/<target>/"
                                           "<package>_<target>/.")] = DIST_DIR,
) -> None:
    """Build the release engines of every recipe for one target into dist/ (what `make engines` runs).

    A recipe whose checkpoint is missing is skipped with one line saying how to supply it.
    The exit code is 3 if any built recipe failed; the others are still built."""
    from converters import recipes
    from converters.package import format_table

    if list_recipes:
        rows = [{"package": r["package"], "family": r["family"], "targets": ",".join(r["targets"]),
                 "builds_for_target": target in r["targets"],
                 "source": ", ".join(f"{key}={value}" for key, value in r["source"].items()) or "-"}
                for r in recipes.load_recipes(recipes_dir)]
        print(format_table(rows))
        return
    rows = recipes.build_all(target, recipe_builder, toolkit, recipes_dir, dist_dir, only)
    print()
    print(format_table(rows, recipes.SUMMARY_COLUMNS) if rows else f"no recipe in {recipes_dir} lists target {target}")
    if any(row["status"] == "FAILED" for row in rows):
        sys.exit(3)


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    """The shared commands, then every family's own (each family's register adds `convert <name>` and,
    if it has one, `convert check <name>`)."""
    app.command("build")(build)
    app.command("inspect")(inspect)
    app.command("engines")(engines)
    for name in family_names():
        family_register = getattr(family_module(name), "register", None)
        if family_register is not None:
            family_register(app, check_app)

"""Recipes (`recipes/<package>.toml`) and `convert engines --target T`: build every recipe for T whose
checkpoint is present into `dist/<T>/<package>_<T>/`, skip the others with one line, print a summary.

A recipe is a TOML table:

    package = "example_conv"            # dist name: <package>_<target>
    family = "example"                  # converters/families/<family>.py, which has build_recipe()
    targets = ["rk3588", "rk3576"]
    [source]   # family-specific: where the checkpoint comes from (a path, a PyPI package name, ...)
    [options]  # family-specific export options (frames, window, ...)
    [gates]    # thresholds; keys named like BuildOptions fields (min_simulator_snr_db, max_regtask_lines,
               # fail_on_cpu_ops) reach build_engine through build_options(), the rest are the family's

Heavy modules are imported inside functions: `convert --help` must stay fast."""
from __future__ import annotations

import importlib
import shutil
import sys
import time
import tomllib
import traceback
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from converters.options import Toolkit
from converters.package import PackageError, assemble, format_table, package_name, staged_package, summary_row
from converters.toolkit import DEFAULT_TOOLKIT, FP16_TARGETS, REPO_ROOT, SetupError, check_target, check_toolkit
from gates.verdict import GateFailure

RECIPES_DIR = REPO_ROOT / "recipes"
DIST_DIR = REPO_ROOT / "dist"
SUMMARY_COLUMNS = ["package", "status", "gates", "worst_snr_db", "engine_bytes", "cpu_ops", "regtask_lines"]


class MissingSource(Exception):
    """The recipe's checkpoint is not on this machine; the message names it and how to supply it."""


def load_recipe(path: Path) -> dict:
    """Parse and check one recipe; `source`, `options` and `gates` default to empty tables."""
    path = Path(path)
    try:
        recipe = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise SetupError(f"recipe {path} is not valid TOML: {error}") from None
    for key, kind in (("package", str), ("family", str), ("targets", list)):
        if not isinstance(recipe.get(key), kind):
            raise SetupError(f"recipe {path} needs `{key}` ({kind.__name__}); see converters/recipes.py")
    unknown_targets = [t for t in recipe["targets"] if t not in FP16_TARGETS]
    if unknown_targets:
        raise SetupError(f"recipe {path} lists targets {unknown_targets}; fp16 targets are {', '.join(FP16_TARGETS)}")
    for table in ("source", "options", "gates"):
        if not isinstance(recipe.setdefault(table, {}), dict):
            raise SetupError(f"recipe {path}: `{table}` must be a table ([{table}])")
    recipe["path"] = str(path)
    return recipe


def load_recipes(directory: Path = RECIPES_DIR) -> list[dict]:
    """Every `*.toml` in `directory`, by package name; two recipes may not share a package name."""
    recipes = sorted((load_recipe(p) for p in sorted(Path(directory).glob("*.toml"))), key=lambda r: r["package"])
    names = [r["package"] for r in recipes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SetupError(f"recipes in {directory} share package names {duplicates}")
    return recipes


def build_options(recipe: dict, target: str, toolkit: str):
    """`BuildOptions` for one recipe: its `[gates]` keys that name BuildOptions fields override the defaults."""
    from dataclasses import fields

    from converters.engine import BuildOptions

    names = {f.name for f in fields(BuildOptions)} - {"target", "toolkit"}
    return BuildOptions(target=target, toolkit=toolkit, **{k: v for k, v in recipe["gates"].items() if k in names})


def family_module(name: str):
    """The family module that builds recipes of `name` (it must define build_recipe)."""
    try:
        module = importlib.import_module(f"converters.families.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"converters.families.{name}":
            raise
        raise SetupError(f"no family '{name}' (expected converters/families/{name}.py or {name}/)") from None
    if not hasattr(module, "build_recipe"):
        raise SetupError(f"family '{name}' has no build_recipe(recipe, target, toolkit, work_dir)")
    return module


def build_package(recipe: dict, target: str, toolkit: str, dist_dir: Path, say: Callable[[str], None]) -> dict:
    """Build one recipe into `dist_dir/<target>/<package>_<target>/`; returns its summary row.

    A missing source is a skip; a failed gate, a dead build child or a family bug is a failure whose
    work dir (ONNX, build logs) is kept in `<package>_<target>.failed/` and whose package dir never appears."""
    from converters.engine import BuildError

    name = package_name(recipe["package"], target)
    target_dir = Path(dist_dir) / target
    failed_dir = target_dir / f"{name}.failed"
    build = family_module(recipe["family"]).build_recipe
    try:
        with staged_package(target_dir, name) as (work_dir, package_dir):
            try:
                results = build(recipe, target, toolkit, work_dir)
                manifests = assemble(results, package_dir)
            except MissingSource:
                raise
            except Exception:
                shutil.rmtree(failed_dir, ignore_errors=True)
                work_dir.rename(failed_dir)
                raise
    except MissingSource as missing:
        say(f"skip {name}: {missing}")
        return summary_row(name, "missing source")
    except (GateFailure, BuildError, SetupError, PackageError) as failure:
        say(f"FAIL {name}: {failure}\n  work dir and build logs: {failed_dir}")
        verdicts = failure.verdicts if isinstance(failure, GateFailure) else []
        return summary_row(name, "FAILED", gate_results=[v.to_json() for v in verdicts])
    except Exception:  # a family bug must not stop the other recipes
        say(f"FAIL {name}:\n{traceback.format_exc().rstrip()}\n  work dir and build logs: {failed_dir}")
        return summary_row(name, "FAILED")
    shutil.rmtree(failed_dir, ignore_errors=True)
    return summary_row(name, "ok", manifests)


def build_all(target: str, toolkit: str = DEFAULT_TOOLKIT, recipes_dir: Path = RECIPES_DIR,
              dist_dir: Path = DIST_DIR, only: list[str] | None = None,
              say: Callable[[str], None] = print) -> list[dict]:
    """Build every recipe listing `target` (restricted to `only` packages); one summary row per recipe."""
    target, toolkit = check_target(target), check_toolkit(toolkit)
    recipes = load_recipes(recipes_dir)
    unknown = sorted(set(only or ()) - {r["package"] for r in recipes})
    if unknown:
        raise SetupError(f"--only names no recipe: {unknown}; recipes: {[r['package'] for r in recipes]}")
    chosen = [r for r in recipes if target in r["targets"] and (not only or r["package"] in only)]
    for recipe in chosen:
        family_module(recipe["family"])  # a recipe naming no family fails before anything is built
    rows = []
    for index, recipe in enumerate(chosen, 1):
        say(f"[{index}/{len(chosen)}] {recipe['package']} ({recipe['family']}) for {target}, toolkit {toolkit} ...")
        started = time.monotonic()
        rows.append(build_package(recipe, target, toolkit, dist_dir, say))
        say(f"[{index}/{len(chosen)}] {recipe['package']}: {rows[-1]['status']} in {time.monotonic() - started:.1f} s")
    return rows


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
    if list_recipes:
        rows = [{"package": r["package"], "family": r["family"], "targets": ",".join(r["targets"]),
                 "builds_for_target": target in r["targets"],
                 "source": ", ".join(f"{key}={value}" for key, value in r["source"].items()) or "-"}
                for r in load_recipes(recipes_dir)]
        print(format_table(rows))
        return
    rows = build_all(target, toolkit, recipes_dir, dist_dir, only)
    print()
    print(format_table(rows, SUMMARY_COLUMNS) if rows else f"no recipe in {recipes_dir} lists target {target}")
    if any(row["status"] == "FAILED" for row in rows):
        sys.exit(3)


def register(app: typer.Typer) -> None:
    app.command("engines")(engines)

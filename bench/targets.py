"""Every recipe's (component, target) cell on the SoCs rkaudio promises (`rkaudio.board.soc.PROMISED_TARGETS`):
one row per engine built (a ladder: one row per rung; Audio8: one per graph), or one row saying why the cell is not
built (its recipe's measured refusal, or "not in recipe"). Writes bench/results/targets.md beside the harness's
targets.json, and the largest compiler peak RSS of each (package, target) into rkaudio/release/build_peaks.json,
the figures `convert engines` budgets --jobs and skips a build too big for the machine by.

A cell is built by `rkaudio.release.recipes.build_cell`, the recipe's own part for that target through the same
`build_part` as `convert engines`, from the recipe's checkpoint where this machine has it, else from the family's
random real-shape weights (`Family.random_source`); --random uses random weights everywhere they exist.

--cells <package>[.<component>]:<target> ... (shell patterns: `piper_joe_medium:*`) builds only those cells and
merges their rows into the committed targets.json, keeping every other row with the date and commit that measured
it; without it every cell is built. Each cell builds in its own process (`run.in_child`), so one cell's memory does
not carry into the next and a failed cell is a row, not a crash."""
from __future__ import annotations

import fnmatch
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rkaudio.release.scheduler import MEASURED_PEAKS

RESULTS = Path(__file__).resolve().parent / "results"
SKIPPED = ("example_conv",)  # no checkpoint and no real shape: the example is not a promised model
SHAPE = "real"  # random weights where a checkpoint is missing: the published shapes
COLUMNS = ["package", "component", "engine", "target", "source", "engine_bytes", "est_cycles_per_unit", "unit",
           "real_time_factor", "regtask_lines", "cpu_ops", "simulator_db", "fp16_floor_db", "peak_rss_bytes",
           "peak_stage", "stage_peak_rss_bytes", "cell_s", "status", "measured_at", "commit"]


def work_unit(family: str, contract: dict) -> tuple[float, str]:
    """(engine calls per second of real time, what the seconds are of): the family's declaration
    (`Family.real_time`, what the real-time gate divides by); est_cycles x calls is the row's cost per second."""
    from rkaudio.board.contract import EngineContract
    from rkaudio.cli.families import declaration

    real_time = declaration(family).real_time
    covered = real_time(EngineContract.from_json(contract)) if real_time is not None else None
    return (1.0, "call") if covered is None else (1 / covered.seconds, covered.unit)


def engine_row(manifest: dict, family: str) -> dict:
    """The figures of one built engine from its manifest (what the cell adds: package, source, time, status)."""
    calls, unit = work_unit(family, manifest["contract"])
    floors = [float(o["fp16_floor_snr_db"]) for o in manifest["simulator"].values() if "fp16_floor_snr_db" in o]
    simulator = [float(g["value"]) for g in manifest["gates"] if g["name"].startswith("simulator_snr")]
    stages = manifest["build"].get("stage_peak_rss_bytes") or {}
    real_time = [g["value"] for g in manifest["gates"] if g["name"].startswith("real_time_factor")]
    peak_stage = max(stages, key=stages.get) if stages else None
    return {"engine": Path(manifest["rknn"]["path"]).name.removesuffix(".rknn"),
            "engine_bytes": manifest["rknn"]["bytes"],
            "est_cycles_per_unit": round(manifest["est_cycles"] * calls), "unit": unit,
            "real_time_factor": real_time[-1] if real_time and real_time[-1] != "nan" else None,
            "regtask_lines": manifest["regtask"]["lines"], "cpu_ops": manifest["ops"]["cpu"],
            "simulator_db": round(min(simulator), 1) if simulator else None,
            "fp16_floor_db": round(min(floors), 1) if floors else None,
            "peak_rss_bytes": stages[peak_stage] if stages else manifest["build"].get("peak_rss_bytes"),
            "peak_stage": peak_stage, "stage_peak_rss_bytes": stages}


def build_cell_rows(package: str, component: str, target: str, random_weights: bool) -> list[dict]:
    """The worker: one cell built in a scratch dir, its engine rows (a failed gate: one row naming the gates)."""
    from rkaudio.cli.families import declaration
    from rkaudio.release import recipes
    from rkaudio.core.errors import GateFailure, MissingSource
    from rkaudio.gates.real_time import only_real_time_failed
    from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

    recipe = recipes.load_recipe(recipes.RECIPES_DIR / f"{package}.toml", declaration)
    family = declaration(recipe["family"])
    with tempfile.TemporaryDirectory(prefix=f"bench-targets-{package}-{target}-") as work:
        try:
            results, source = recipes.build_cell(recipe, component, target, DEFAULT_TOOLKIT, Path(work), family, SHAPE,
                                                 random_weights=random_weights)
        except GateFailure as failure:
            # which engine, and each failing gate's own line (its figure and what it found): the cell's build
            # directory is gone when the row is read
            failed = "; ".join(v.line().removeprefix("[FAIL] ") for v in failure.verdicts if not v.passed)
            verdict = "refused (computed)" if only_real_time_failed(failure.verdicts) else "FAILED"
            return [{"status": f"{verdict}: {failure.context}: {failed}"}]
        except MissingSource as missing:  # no checkpoint here, and the family has no random weights
            return [{"status": f"missing source: {missing}"}]
    return [{**engine_row(result.manifest_data, recipe["family"]), "source": source, "status": "ok"}
            for result in results]


def cells(recipes: list[dict], family_for, targets, patterns: list[str] | None) -> list[tuple]:
    """(recipe, component, target) of every promised cell, restricted to `patterns` (`package[.component]:target`;
    without `:target`, every target)."""
    pairs = [(p if ":" in p else f"{p}:*").rsplit(":", 1) for p in patterns or ()]
    chosen = []
    for recipe in recipes:
        components = list(recipe["components"]) or [family_for(recipe["family"]).components[0].name]
        for component in components:
            for target in targets:
                names = (recipe["package"], f"{recipe['package']}.{component}")
                if patterns is None or any(fnmatch.fnmatch(name, where) and fnmatch.fnmatch(target, soc)
                                           for where, soc in pairs for name in names):
                    chosen.append((recipe, component, target))
    return chosen


def not_built(recipe: dict, component: str, target: str) -> str | None:
    """Why a cell is not built: the recipe's (or its component's) measured refusal, or "not in recipe"; None when
    the recipe builds it."""
    table = recipe["components"].get(component, recipe)
    if target in recipe["targets"] and target in table.get("targets", recipe["targets"]):
        return None
    reason = table.get("refused", {}).get(target) or recipe.get("refused", {}).get(target)
    return f"refused: {reason}" if reason else "not in recipe"


def measure(recipe: dict, component: str, target: str, commit: str, random_weights: bool) -> list[dict]:
    """The rows of one cell: a worker process's, or one row saying why it was not built or how it died."""
    import run

    cell = {"package": recipe["package"], "component": component, "target": target}
    started = time.monotonic()
    status = reason = not_built(recipe, component, target)
    rows = [{}]
    if reason is None:
        worker, built = run.in_child(build_cell_rows, [recipe["package"], component, target, random_weights],
                                     stderr=subprocess.PIPE, text=True)
        if worker.returncode == 0:
            rows = built
        elif worker.returncode < 0:
            status = f"FAILED: killed by {signal.Signals(-worker.returncode).name}"
        else:
            lines = worker.stderr.strip().splitlines() or ["no output"]
            status = f"FAILED: {lines[-1]}"
            print(worker.stderr[-3000:], file=sys.stderr)
    measured = {"cell_s": None if reason else round(time.monotonic() - started, 1),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit}
    return [{column: {**cell, **({"status": status} if status else {}), **row, **measured}.get(column)
             for column in COLUMNS} for row in rows]


def merge(old: list[dict], new: list[dict], order: list[tuple]) -> list[dict]:
    """`new` in place of the rows of the cells it measured; every other row of `old` kept as it was measured; a
    cell of `order` that neither holds is one "not measured" row, so the table always has every cell.
    Rows sorted by cell in `order` (package, component, target), each cell's engines in build order."""
    measured = {(r["package"], r["component"], r["target"]) for r in new}
    rows = [r for r in old if (r["package"], r["component"], r["target"]) not in measured] + new
    held = {(r["package"], r["component"], r["target"]) for r in rows}
    rows += [{column: None for column in COLUMNS} | {"package": package, "component": component, "target": target,
                                                     "status": "not measured"}
             for package, component, target in order if (package, component, target) not in held]
    rank = {cell: index for index, cell in enumerate(order)}
    return sorted(rows, key=lambda r: rank.get((r["package"], r["component"], r["target"]), len(rank)))


def gigabytes(value) -> str:
    return f"{value / 1e9:.2f}" if value else "-"


def markdown(rows: list[dict]) -> str:
    """targets.md: how to regenerate a cell, then the table."""
    head = ["package", "component", "engine", "target", "source", "engine MB", "est. cycles / unit", "x real time",
            "REGTASK", "CPU ops", "simulator dB", "fp16 floor dB", "peak RSS GB (stage)", "cell s", "status",
            "measured"]
    lines = [
        "# Every component on every promised target (issue #26)",
        "",
        "One row per engine of each (component, target) cell (a ladder: one row per rung), or one row saying why the "
        "cell is not built. Source: the recipe's checkpoint where this machine has it, else random weights at the "
        "published shapes. Est. cycles are the toolkit's per call, times the calls one second of real time takes "
        "(the family's `real_time`: seconds of audio produced, of input audio, of generated mel over the ODE, of "
        "speech); `x real time` is the real-time gate's figure, predicted board ms per second of it / 1000 "
        "(rk3566: unfitted constants). Peak "
        "RSS is the compiler child's, the highest of its stages; `cell s` is the whole cell: export, compiles, "
        "simulator runs.",
        "",
        "Regenerate one cell (its rows merge into targets.json; every other row stays as measured):",
        "",
        "    make bench NAME=targets ARGS=\"--cells qwen3_tts_0_6b_base_speech_decoder:rk3566\"",
        "",
        "`--cells` takes `package[.component]:target` shell patterns (`piper_joe_medium.decoder:*`); without it, "
        "every cell is built, one process each.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cycles = f"{r['est_cycles_per_unit']:,} / {r['unit']}" if r["est_cycles_per_unit"] is not None else "-"
        peak = f"{gigabytes(r['peak_rss_bytes'])} ({r['peak_stage']})" if r["peak_rss_bytes"] else "-"
        cells = [r["package"], r["component"], r["engine"], r["target"], r["source"],
                 f"{r['engine_bytes'] / 1e6:.1f}" if r["engine_bytes"] else None, cycles, r.get("real_time_factor"),
                 r["regtask_lines"],
                 r["cpu_ops"], r["simulator_db"], r["fp16_floor_db"], peak, r["cell_s"], r["status"],
                 f"{r['measured_at'][:10]} {r['commit'][:10]}" if r["measured_at"] else None]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def build_peaks(rows: list[dict]) -> list[dict]:
    """Per (package, target), in row order, the largest compiler peak RSS its rows measured and when (the first
    row of the largest): what `convert engines` reads from MEASURED_PEAKS."""
    peaks: dict[tuple, dict] = {}
    for row in rows:
        cell = (row["package"], row["target"])
        if row.get("peak_rss_bytes") and (cell not in peaks or row["peak_rss_bytes"] > peaks[cell]["peak_rss_bytes"]):
            peaks[cell] = {"package": row["package"], "target": row["target"],
                           "peak_rss_bytes": int(row["peak_rss_bytes"]), "measured_at": row.get("measured_at")}
    return list(peaks.values())


# MEASURED_PEAKS's "regenerate" key (the scheduler reads "peaks" only)
REGENERATE = 'make bench NAME=targets (one cell: ARGS="--cells PACKAGE[.COMPONENT]:TARGET")'


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.cli.families import declaration
    from rkaudio.release.recipes import RECIPES_DIR, load_recipes
    from rkaudio.core.contract import producer_info
    from rkaudio.board.soc import PROMISED_TARGETS

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--cells", nargs="+", metavar="PACKAGE[.COMPONENT]:TARGET",
                        help="build only these cells (shell patterns) and merge them into the committed table")
    parser.add_argument("--random", action="store_true",
                        help="random weights wherever the family has them, even where this machine has the checkpoint")
    options = parser.parse_args(argv)
    recipes = [r for r in load_recipes(RECIPES_DIR, declaration) if r["package"] not in SKIPPED]
    every = cells(recipes, declaration, PROMISED_TARGETS, None)
    chosen = cells(recipes, declaration, PROMISED_TARGETS, options.cells)
    if not chosen:
        raise SystemExit(f"--cells {' '.join(options.cells or ())} selects no cell")
    commit = producer_info()["git"]
    rows = []
    for index, (recipe, component, target) in enumerate(chosen, 1):
        print(f"[{index}/{len(chosen)}] {recipe['package']}.{component} on {target} ...", flush=True)
        rows += measure(recipe, component, target, commit, options.random)
        print(f"[{index}/{len(chosen)}] {rows[-1]['status']}", flush=True)
    committed = RESULTS / "targets.json"
    old = json.loads(committed.read_text())["rows"] if options.cells and committed.is_file() else []
    rows = merge(old, rows, [(r["package"], c, t) for r, c, t in every])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "targets.md").write_text(markdown(rows))
    MEASURED_PEAKS.write_text(json.dumps({"regenerate": REGENERATE, "peaks": build_peaks(rows)}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

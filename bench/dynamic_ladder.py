"""One engine per ladder (issue 28): every ladder-shaped recipe cell built twice, `ladder = "static"` (one engine per
rung) and `ladder = "dynamic"` (one engine for every rung's shapes, rkaudio/pipeline/ladder.py), from random weights
of --shape ("small", the tests' models, by default; "real" by hand, one cell at a time: --cells
package[.component]:target ...) or the recipe's own checkpoint where this machine has it (Piper's voice).

Per cell: the ladder's engine bytes both ways and the whole package's (every engine of the part), the compile's peak
RSS both ways; per shape set: the dynamic engine's figures from its own layer table against the static engine of
the same rung (est. cycles ratio, simulator SNR and fp16-floor gap differences, CPU ops and REGTASK lines, predicted
board ms). Gates are the recipe's; a build that fails one is a row naming the failed gates. Writes
bench/results/dynamic_ladder.md, or dynamic_ladder_<shape>-shape.md past the small shape (bench/run.py writes the
JSON)."""
from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from rkaudio.cli.families import declaration
from rkaudio.release import recipes
from rkaudio.core.errors import GateFailure
from rkaudio.board.contract import EngineContract
from rkaudio.board.ladder import DepthSplit
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

RESULTS = Path(__file__).resolve().parent / "results"
# (package, component, target): the ladder of every family that has one, on the first target its recipe ships
CELLS = (("example_conv", "conv", "rk3588"), ("cosyvoice3_flow_0_5b", "flow", "rk3588"),
         ("audio8_asr_0_1b", "asr", "rk3576"), ("qwen3_tts_0_6b_base_speech_decoder", "speech_decoder", "rk3588"),
         ("piper_joe_medium", "duration_encoder", "rk3588"))


def chosen_cells(wanted: list[str] | None) -> list[tuple[str, str, str]]:
    """The cells `wanted` names (`package[.component]:target` each; the component defaults to the package's in
    CELLS, the target to rk3588), or every cell of CELLS."""
    if not wanted:
        return list(CELLS)
    cells = []
    for item in wanted:
        where, _, target = item.partition(":")
        package, _, component = where.partition(".")
        default = next((c for p, c, _ in CELLS if p == package), None)
        cells.append((package, component or default, target or "rk3588"))
    return cells


def with_ladder(recipe: dict, component: str, ladder: str) -> dict:
    """A copy of `recipe` whose `component` builds with `ladder`."""
    changed = copy.deepcopy(recipe)
    table = changed["components"][component] if component in changed["components"] else changed
    table.setdefault("options", {})["ladder"] = ladder
    return changed


def build(recipe: dict, component: str, target: str, work: Path, shape: str):
    """(results, failed gates or None) of one build of the cell."""
    family = declaration(recipe["family"])
    try:
        results, _ = recipes.build_cell(recipe, component, target, DEFAULT_TOOLKIT, work, family, shape,
                                        random_weights=family.random_source is not None)
        return results, None
    except GateFailure as failure:
        return [], "; ".join(v.line().removeprefix("[FAIL] ") for v in failure.verdicts if not v.passed)


def ladder_key(contract: EngineContract) -> tuple:
    return contract.role, contract.ladder_key, DepthSplit.of(contract).part


def cell_rows(package: str, component: str, target: str, shape: str) -> list[dict]:
    recipe = recipes.load_recipe(recipes.RECIPES_DIR / f"{package}.toml", declaration)
    cell = {"package": package, "component": component, "target": target, "shape": shape}
    built = {}
    with tempfile.TemporaryDirectory(prefix="bench-ladder-") as scratch:
        for ladder in ("static", "dynamic"):
            print(f"  {package}.{component} {target} {ladder} ...", flush=True)
            results, failed = build(with_ladder(recipe, component, ladder), component, target, Path(scratch) / ladder,
                                    shape)
            if failed:
                return [{**cell, "status": f"{ladder} FAILED: {failed}"}]
            built[ladder] = [r.manifest_data for r in results]
    dynamic = next(m for m in built["dynamic"] if m.get("shape_sets"))
    statics = {ladder_key(EngineContract.from_json(m["contract"])): m for m in built["static"]}
    views = EngineContract.from_json(dynamic["contract"]).views()
    rungs = [statics[ladder_key(view)] for view in views]
    common = {**cell, "status": "ok",
              "static_ladder_bytes": sum(m["rknn"]["bytes"] for m in rungs), "dynamic_bytes": dynamic["rknn"]["bytes"],
              "static_package_engine_bytes": sum(m["rknn"]["bytes"] for m in built["static"]),
              "dynamic_package_engine_bytes": sum(m["rknn"]["bytes"] for m in built["dynamic"]),
              "static_peak_rss_bytes": max(m["build"].get("peak_rss_bytes") or 0 for m in rungs),
              "dynamic_peak_rss_bytes": dynamic["build"].get("peak_rss_bytes")}
    rows = []
    for number, (entry, static) in enumerate(zip(dynamic["shape_sets"], rungs)):
        sims = {name.rpartition("@")[0]: figures for name, figures in dynamic["simulator"].items()
                if name.endswith(f"@{number}")}
        snr_diffs = [sims[name]["snr_db"] - figures["snr_db"] for name, figures in static["simulator"].items()]
        gap_diffs = [sims[name].get("fp16_floor_gap_db", 0) - figures.get("fp16_floor_gap_db", 0)
                     for name, figures in static["simulator"].items()]
        rows.append({**common, "set": number, "role": entry["contract"].get("role"),
                     "ladder_key": entry["contract"].get("ladder_key"),
                     "cycles_ratio": round(entry["est_cycles"] / max(static["est_cycles"], 1), 4),
                     "worst_snr_change_db": round(min(snr_diffs), 2) if snr_diffs else None,
                     "worst_floor_gap_change_db": round(max(gap_diffs), 2) if gap_diffs else None,
                     "cpu_ops_static": static["ops"]["cpu"], "cpu_ops_dynamic": entry["ops"]["cpu"],
                     "regtask_static": static["regtask"]["lines"], "regtask_dynamic": entry["regtask"]["lines"],
                     "predicted_ms_static": (static.get("predicted_board_ms") or {}).get("ms"),
                     "predicted_ms_dynamic": (entry.get("predicted_board_ms") or {}).get("ms"),
                     "internal_static": static["internal_bytes"], "internal_dynamic": entry["internal_bytes"]})
    return rows


def markdown(rows: list[dict], shape: str) -> str:
    lines = ["# One engine per ladder: static rungs against one dynamic engine", "",
             f"Random weights of the {shape} shape (Piper: its voice), toolkit {DEFAULT_TOOLKIT}, the recipe's gates. "
             "Per shape set, the dynamic engine's own layer table against the static engine of the same rung.", "",
             "| cell | set | role/key | ladder bytes static -> dynamic | package engines static -> dynamic | "
             "cycles ratio | SNR change (dB) | floor gap change (dB) | CPU ops s/d | REGTASK s/d | predicted ms s/d |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cell = f"{row['package']}.{row['component']} {row['target']}"
        if row["status"] != "ok":
            lines.append(f"| {cell} | | | {row['status']} | | | | | | | |")
            continue
        lines.append(
            f"| {cell} | {row['set']} | {row['role']}/{row['ladder_key']} | {row['static_ladder_bytes']:,} -> "
            f"{row['dynamic_bytes']:,} | {row['static_package_engine_bytes']:,} -> "
            f"{row['dynamic_package_engine_bytes']:,} | {row['cycles_ratio']} | {row['worst_snr_change_db']} | "
            f"{row['worst_floor_gap_change_db']} | {row['cpu_ops_static']}/{row['cpu_ops_dynamic']} | "
            f"{row['regtask_static']}/{row['regtask_dynamic']} | {row['predicted_ms_static']}/"
            f"{row['predicted_ms_dynamic']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--shape", choices=("small", "real"), default="small",
                        help="the random weights' shape (default: small, the tests' models)")
    parser.add_argument("--cells", nargs="+", metavar="PACKAGE[.COMPONENT]:TARGET",
                        help="only these cells (default: every cell of CELLS)")
    options = parser.parse_args(argv)
    rows = [row for cell in chosen_cells(options.cells) for row in cell_rows(*cell, options.shape)]
    RESULTS.mkdir(exist_ok=True)
    name = "dynamic_ladder" if options.shape == "small" else f"dynamic_ladder_{options.shape}-shape"
    (RESULTS / f"{name}.md").write_text(markdown(rows, options.shape))
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

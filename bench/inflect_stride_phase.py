"""Inflect v2 decoder, leading upsamplers in stride-phase form (issue 27, item 5): per recipe (Nano, Micro: their
shipped window per target, random weights of the recipe's size) and target, the engine built with 0, 1, 2, ...
leading upsampling levels as a stride-phase Conv and an interleave (rkaudio/surgery/graph/stride_phase.py), up to the
levels the target's polyphase form leaves. Per build: the predicted board ms per emitted slice (the manifest's
`predicted_board_ms`, rkaudio/gates/board_time.py) with its compute and elementwise terms, the layer table's estimated
cycles and RW traffic per emitted slice, REGTASK lines, CPU ops, the simulator and the export's fidelity figures,
and `gates`: every gate of the recipe (export tail / interior, REGTASK, CPU ops, simulator SNR, fp16 floor gap),
judged here so a failing build is still measured. `choose` picks per recipe and target the fastest level count
that holds every gate; the recipe's `stride_phase_levels` ships it. Writes bench/results/inflect_stride_phase.md
(bench/run.py writes the JSON)."""
from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import _window_sweep as sweep  # bench/ is no package: run.py puts it on sys.path

from rkaudio.engine.build import BuildOptions
from rkaudio.cli.families import declaration
from rkaudio.pipeline import pipeline
from rkaudio.families import inflect
from rkaudio.release.recipes import RECIPES_DIR, load_recipe, recipes_for
from rkaudio.board.inflect import InflectWindow
from rkaudio.core.contract import contract_of
from rkaudio.core.errors import GateFailure
from rkaudio.surgery.graph.polyphase_levels import overflowing_levels

TOOLKIT = "2.3.2"
PACKAGES = ("inflect_nano_v2_decoder", "inflect_micro_v2_decoder")
RESULTS = Path(__file__).resolve().parent / "results"
# The gates the bench turns off in the build, to judge them on the figures below (the recipe's thresholds).
JUDGED_HERE = ("regtask_lines", "cpu_compute_ops", "simulator_snr")


def _worst(verdicts, prefix: str) -> float | None:
    values = [float(v.value) for v in verdicts if v.name.startswith(prefix)]
    return min(values) if values else None


def failed_gates(export_verdicts, manifest: dict, gates: dict, row: dict) -> list[str]:
    """The names of the recipe's gates this build fails: the export's verdicts, the manifest's own gates but those
    the bench turned off, and those judged here at the recipe's thresholds."""
    failed = [v.name for v in export_verdicts if not v.passed]
    failed += [g["name"] for g in manifest["gates"] if not g["passed"] and not g["name"].startswith(JUDGED_HERE)]
    if row["regtask_lines"] > gates["max_regtask_lines"]:
        failed.append(f"regtask_lines {row['regtask_lines']}")
    if gates["fail_on_cpu_ops"] and row["cpu_ops"]:
        failed.append(f"cpu_ops {row['cpu_ops']}")
    if row["sim_snr_db"] is None or row["sim_snr_db"] < gates["min_simulator_snr_db"]:
        failed.append(f"simulator_snr {row['sim_snr_db']}")
    return failed


def level_row(scratch: Path, official: dict, size: str, part: dict, target: str, levels: int) -> dict:
    """Export and build the recipe's window for `target` with `levels` leading stride-phase levels."""
    options, gates = part["options"], part["gates"]
    window, context = options["window"], options["context"]
    out = scratch / size / target / f"sp{levels}"
    row = {"size": size, "target": target, "window": window, "emitted": window - 2 * context,
           "stride_phase_levels": levels}
    started = time.perf_counter()
    job = inflect.FAMILY.job(target=target, out=out,
                             options={"window": window, "context": context, "dec_mask": options["dec_mask"],
                                      "stride_phase_levels": levels},
                             gates={"min_tail_db": gates["min_tail_db"], "min_interior_db": gates["min_interior_db"]})
    exported = inflect.export(job, official["decode_onnx"], official["duration_onnx"], say=lambda *_: None)
    verdicts = [v for record in exported for v in record.verdicts]
    strides = InflectWindow.of(contract_of(exported[0].onnx)).strides
    row["levels_free"] = len(strides) - overflowing_levels(target, window, strides)  # of polyphase levels
    build = BuildOptions(target, TOOLKIT, max_regtask_lines=10**9, fail_on_cpu_ops=False, min_simulator_snr_db=0.0)
    try:  # the export's verdicts and the judged-here gates are figures here, not stops
        (result,) = pipeline.build([replace(record, verdicts=()) for record in exported], out, build,
                                   context=f"inflect sp{levels}", say=lambda line: None)
    except GateFailure as failure:
        return {**row, "status": f"build gate failed: {failure}"}
    manifest = result.manifest_data
    terms = manifest["predicted_board_ms"]["terms"]
    row = {**row, **sweep.manifest_row(manifest, row["emitted"], target), "status": "built",
           "polyphase": manifest["contract"].get("polyphase"),
           "compute_ms": round(terms["compute"], 2), "elementwise_ms": round(terms["elementwise"], 2),
           "fp32_worst_interior_db": _worst(verdicts, "interior_snr_min"),
           "fp32_tail_db": _worst(verdicts, "tail_snr["),
           "build_s": round(time.perf_counter() - started, 1)}
    failed = failed_gates(verdicts, manifest, gates, row)
    return {**row, "gates": "pass" if not failed else "FAIL " + ", ".join(failed)}


def target_rows(scratch: Path, official: dict, size: str, part: dict, target: str) -> list[dict]:
    """Every level count the target leaves free of polyphase levels (from 0), each built."""
    rows = [level_row(scratch, official, size, part, target, 0)]
    for levels in range(1, rows[0]["levels_free"] + 1):
        print(rows[-1], flush=True)
        rows.append(level_row(scratch, official, size, part, target, levels))
    print(rows[-1], flush=True)
    return rows


def choose(rows: list[dict]) -> dict[tuple[str, str], int]:
    """Per (size, target), the level count with the fewest predicted ms per emitted slice among those that hold
    every gate: ranked by the window's predicted ms (one window per target, so the same order, unrounded)."""
    chosen = {}
    for key in {(r["size"], r["target"]) for r in rows}:
        passing = [r for r in rows if (r["size"], r["target"]) == key and r.get("gates") == "pass"]
        if passing:
            chosen[key] = min(passing, key=lambda r: r["first_window_ms_pred"])["stride_phase_levels"]
    return chosen


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    run.parser(__file__, __doc__).parse_args(argv)
    family = declaration("inflect")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rkaudio-inflect-stride-phase-") as scratch:
        for package in PACKAGES:
            recipe = load_recipe(RECIPES_DIR / f"{package}.toml", declaration)
            size = package.split("_")[1]
            official = family.random_source(Path(scratch) / "official" / size, "real", recipe)
            for target in recipe["targets"]:
                (part,) = recipes_for(recipe, target)
                rows += target_rows(Path(scratch), official, size, part, target)
    return report(rows)


def report(rows: list[dict]) -> list[dict]:
    """The ratios to the same target's build without stride phases and the choice; writes the markdown table."""
    from rkaudio.release.package import format_table

    for row in rows:  # the ratio to the same build without stride phases
        base = next(r for r in rows if (r["size"], r["target"], r["stride_phase_levels"]) ==
                    (row["size"], row["target"], 0))
        for key in ("predicted_ms_per_emitted", "est_cycles_per_emitted"):
            row[f"{key}_vs_sp0"] = round(row[key] / base[key], 3) if row.get(key) and base.get(key) else None
    chosen = choose(rows)
    for row in rows:
        row["chosen"] = chosen.get((row["size"], row["target"])) == row["stride_phase_levels"]
    columns = ["size", "target", "window", "emitted", "polyphase", "stride_phase_levels", "predicted_ms_per_emitted",
               "predicted_ms_per_emitted_vs_sp0", "compute_ms", "elementwise_ms", "est_cycles_per_emitted",
               "est_cycles_per_emitted_vs_sp0", "rw_kb_per_emitted", "first_window_ms_pred", "first_window_cycles",
               "engine_bytes", "regtask_lines", "cpu_ops", "sim_snr_db", "fp32_worst_interior_db", "fp32_tail_db",
               "build_peak_rss_bytes", "build_s", "gates", "chosen", "status"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "inflect_stride_phase.md").write_text(
        f"Inflect v2 decoder, leading upsamplers in stride-phase form (bench/inflect_stride_phase.py): the recipes' "
        f"windows, random weights of each size, toolkit {TOOLKIT}; `chosen` = the fastest predicted level count "
        f"holding every gate\n\n```\n" + format_table([{k: r.get(k) for k in columns} for r in rows]) + "\n```\n")
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

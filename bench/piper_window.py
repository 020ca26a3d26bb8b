"""Piper decoder window sweep (joe voice, context 32 per side): per target and window, the predicted board ms per
emitted slice (the manifest's `predicted_board_ms`, rkaudio/gates/board_time.py), the layer table's estimated cycles and
RW traffic per emitted slice, the first window's predicted ms and cycles, the predicted ms of a typical text
chunk, engine / weight / internal memory, REGTASK lines, CPU ops, and the fidelity figures (worst interior and
padded-tail window vs a full-length fp32 decode; simulator on the self-check and on the end-to-end walk). Writes
bench/results/piper_window.{json,md,png}; the default each target ships is the window `choose` picks: the
admissible one with the fewest predicted ms per emitted slice.

Budget for the first window (FIRST_WINDOW_BUDGET_MS): the spec's consumer runs Piper offline only (no streaming
mode), so a window's compute is latency before a text chunk's first audio, not a stream deadline. 100 ms is half the
ggml decoder's time for a whole chunk on the RK3588 (2070 ms / 10 chunks = 207 ms, the spec's 60-character chunks of
about 2.5 s, ~215 slices), so a wider window never makes a chunk's first audio later than the CPU path would. Board
time is the board-time model's (its 93/45/24 calibration point is the spec's 0.46 ms per emitted slice: see
bench/results/board_time.md); rk3576's constants are fitted on Audio8's stages, rk3566's are RK3588's scaled."""
from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import _window_sweep as sweep  # bench/ is no package: run.py puts it on sys.path

from rkaudio.pipeline import pipeline
from rkaudio.engine.build import BuildOptions
from rkaudio.families.piper import FAMILY, decoder
from rkaudio.core.errors import GateFailure
from rkaudio.board.soc import TIME_FIELD_LIMIT

TARGETS = ("rk3588", "rk3576", "rk3566")
TOOLKIT = "2.3.2"
CONTEXT = 32
WINDOWS = (109, 173, 237, 301)
CHUNK_SLICES = 215  # a 60-character text chunk: 25.18 s / 10 chunks at 22050 Hz / 256 samples per slice
FIRST_WINDOW_BUDGET_MS = 100.0
MIN_SIMULATOR_SNR_DB = 40.0  # the bar for the shipped window (the recipe's gate floor is 35)
RESULTS = Path(__file__).resolve().parent / "results"


def _worst(verdicts, words: str) -> float | None:
    values = [float(v.value) for v in verdicts if words in v.name]
    return min(values) if values else None


def sweep_row(scratch: Path, target: str, window: int, context: int) -> dict:
    """Export and build one window for one target with every gate recording (none stopping the sweep)."""
    out = scratch / target / f"w{window}_c{context}"
    row = {"target": target, "window": window, "context": context, "emitted": window - 2 * context}
    started = time.perf_counter()
    try:
        exported = decoder.export(FAMILY.job("decoder", target=target, out=out,
                                             options={"window": window, "context": context}))
    except GateFailure as failure:
        return {**row, "status": f"export gate failed: {failure.verdicts[0].line() if failure.verdicts else failure}"}
    verdicts = [v for record in exported for v in record.verdicts]
    options = BuildOptions(target, TOOLKIT, max_regtask_lines=10**9, fail_on_cpu_ops=False, min_simulator_snr_db=0.0)
    try:  # the export's verdicts are figures here, not gates: a window below them is still measured
        (result,) = pipeline.build([replace(record, verdicts=()) for record in exported], out, options,
                                   context=f"piper w{window}", say=lambda line: None)
    except GateFailure as failure:
        return {**row, "status": f"build gate failed: {failure}"}
    manifest = result.manifest_data
    index = json.loads((out / "selftest" / "index.json").read_text())
    walk = [figure["snr_db"] for entry in index["end_to_end"] for figure in entry["simulator"].values()]
    return {**row, **sweep.manifest_row(manifest, row["emitted"], target), "status": "built",
            "polyphase": manifest["contract"].get("polyphase"), "hop": manifest["contract"]["hop"],
            "chunk_ms_pred": math.ceil(CHUNK_SLICES / row["emitted"]) * manifest["predicted_board_ms"]["ms"],
            "fp32_worst_interior_db": _worst(verdicts, "worst interior window"),
            "fp32_tail_db": _worst(verdicts, "padded window"), "simulator_walk_db": min(walk) if walk else None,
            "build_s": round(time.perf_counter() - started, 1)}


def field_edge(target: str, rows: list[dict]) -> int | None:
    """The widest window whose phases still fit the target's time field in the form with the fewest polyphase
    levels the sweep built, when it falls inside the swept windows (None: no field limit, or past them). The widest
    row alone misleads: on rk3576 W=301 runs two levels in phases (32 phases), whose edge is W=2047, and exporting
    that (a 7,164-slice self-check latent) took the host past 7 GB within minutes."""
    limit = TIME_FIELD_LIMIT.get(target)
    forms = [row for row in rows if row["target"] == target and row.get("status") == "built" and row.get("polyphase")]
    if limit is None or not forms:
        return None
    fewest = min(forms, key=lambda row: row["polyphase"])
    edge = limit * fewest["polyphase"] // fewest["hop"]
    return edge if edge < max(WINDOWS) else None


def admissible(row: dict, budget_ms: float) -> bool:
    """What a shipped window must hold: 0 REGTASK, 0 CPU ops, the export's fidelity gates (interior and tail >= 100
    dB, stricter than the export's own 90), the simulator bar, and the first-window budget."""
    return (row["status"] == "built" and row["regtask_lines"] == 0 and row["cpu_ops"] == 0
            and row["fp32_worst_interior_db"] >= 100 and row["fp32_tail_db"] > 100
            and row["sim_snr_db"] >= MIN_SIMULATOR_SNR_DB and row["first_window_ms_pred"] <= budget_ms)


def budgets(rows: list[dict]) -> dict[str, float]:
    """Per target, the first-window budget in predicted ms: FIRST_WINDOW_BUDGET_MS on the RK3588, and on a slower
    SoC the same budget relative to its speed (scaled by its predicted ms for the 109-slice window over the
    RK3588's), since its CPU decoder, the path a chunk's first audio is compared with, is slower too."""
    reference = {r["target"]: r["first_window_ms_pred"] for r in rows if r["window"] == 109 and r["status"] == "built"}
    return {target: FIRST_WINDOW_BUDGET_MS * reference[target] / reference["rk3588"]
            for target in TARGETS if target in reference}


def choose(rows: list[dict], budget_ms: dict[str, float]) -> dict[str, int]:
    """Per target, the admissible window with the fewest predicted board ms per emitted slice."""
    chosen = {}
    for target, budget in budget_ms.items():
        candidates = [r for r in rows if r["target"] == target and r["context"] == CONTEXT and admissible(r, budget)]
        if candidates:
            chosen[target] = min(candidates, key=lambda r: r["predicted_ms_per_emitted"])["window"]
    return chosen


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--report-only", action="store_true",
                        help="re-report the rows of bench/results/piper_window.json (budgets, choice, table), "
                        "building nothing")
    if parser.parse_args(argv).report_only:
        return report(json.loads((RESULTS / "piper_window.json").read_text())["rows"])
    with tempfile.TemporaryDirectory(prefix="rkaudio-piper-window-") as scratch:
        rows = []
        for target in TARGETS:
            rows += [sweep_row(Path(scratch), target, window, CONTEXT) for window in WINDOWS]
            edge = field_edge(target, rows)
            if edge is not None and edge not in WINDOWS:
                rows.append(sweep_row(Path(scratch), target, edge, CONTEXT))
    return report(rows)


def report(rows: list[dict]) -> list[dict]:
    """Budgets and the choice per target; writes piper_window.md and .png (bench/run.py writes the JSON)."""
    from rkaudio.release.package import format_table

    budget_ms = budgets(rows)
    for row in rows:
        if row["status"] == "built":
            row["budget_ms"] = round(budget_ms[row["target"]], 1)
    chosen = choose(rows, budget_ms)
    for row in rows:
        row["chosen"] = chosen.get(row["target"]) == row["window"] and row["context"] == CONTEXT
    RESULTS.mkdir(parents=True, exist_ok=True)
    sweep.plot([r for r in rows if r["status"] == "built" and r["context"] == CONTEXT and r["regtask_lines"] == 0],
               RESULTS / "piper_window.png", f"Piper decoder (joe), context {CONTEXT}, toolkit {TOOLKIT}: windows "
               "with 0 REGTASK lines", ylabel="predicted board ms per emitted slice")
    columns = ["target", "window", "emitted", "context", "polyphase", "predicted_ms_per_emitted",
               "est_cycles_per_emitted", "rw_kb_per_emitted", "first_window_ms_pred", "budget_ms",
               "first_window_cycles", "chunk_ms_pred", "engine_bytes",
               "weight_bytes", "internal_bytes", "regtask_lines", "cpu_ops", "fp32_worst_interior_db", "fp32_tail_db",
               "sim_snr_db", "simulator_walk_db", "build_peak_rss_bytes", "chosen", "status"]
    (RESULTS / "piper_window.md").write_text(
        f"Piper decoder window sweep, joe voice, toolkit {TOOLKIT} (bench/piper_window.py). Ranked by predicted "
        f"board ms per emitted slice (rkaudio/gates/board_time.py, bench/results/board_time.md); first-window budget "
        f"{FIRST_WINDOW_BUDGET_MS} ms on the RK3588, scaled by each target's speed; chunk = {CHUNK_SLICES} slices. "
        f"Chosen: {chosen}\n\n```\n" + format_table(rows, columns) + "\n```\n")
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

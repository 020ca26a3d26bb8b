"""A window sweep for the windowed families (issue 19), shared by their benches (bench/kokoro_window.py; the Piper
and Inflect sweeps take the same helpers): per (target, window) one built engine's figures put per EMITTED frame,
the table rows, and a plot against the window, one line per target. Windows are ranked by the predicted board
milliseconds per emitted frame (the manifest's `predicted_board_ms`, rkaudio/gates/board_time.py: cycles, elementwise
traffic, CPU ops, dispatch and call I/O), not by the layer table's cycles, which cost every elementwise op at 0.

A bench supplies the engines (a manifest per point, built by the family's CLI so each build's peak RSS is its
own) and its fidelity columns; this module only reads manifests and draws. Not a bench itself (the leading
underscore keeps it out of `bench/run.py`'s list)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def manifest_row(manifest: dict, emitted: int, target: str | None = None) -> dict:
    """The sweep's engine columns of one manifest (rkaudio.core.manifest schema) for an engine that emits `emitted`
    frames per window: predicted board ms, cycles and RW traffic per emitted frame, the first window's predicted
    ms and cycles (one window's), the engine / weight / internal memory, REGTASK lines, CPU ops, the worst
    simulator SNR over the outputs (on the build's self-check) and the build's peak RSS."""
    contract = manifest.get("contract", {})
    sims = [float(out["snr_db"]) for out in manifest.get("simulator", {}).values()]
    cycles, rw_kb = int(manifest["est_cycles"]), float(manifest["rw_kb"])
    predicted = (manifest.get("predicted_board_ms") or {}).get("ms")
    return {
        "target": target or manifest["target"],
        "window": int(contract.get("window", 0)),
        "emitted": int(emitted),
        "predicted_ms_per_emitted": None if predicted is None else round(predicted / emitted, 3),
        "first_window_ms_pred": predicted,
        "est_cycles_per_emitted": round(cycles / emitted),
        "rw_kb_per_emitted": round(rw_kb / emitted, 1),
        "first_window_cycles": cycles,
        "engine_bytes": int(manifest["rknn"]["bytes"]),
        "weight_bytes": int(manifest["weight_bytes"]),
        "internal_bytes": int(manifest["internal_bytes"]),
        "regtask_lines": int(manifest["regtask"]["lines"]),
        "cpu_ops": int(manifest["ops"]["cpu"]),
        "sim_snr_db": round(min(sims), 2) if sims else None,
        "build_peak_rss_bytes": (manifest.get("build") or {}).get("peak_rss_bytes"),
    }


def log_row(build_log: Path, window: int, emitted: int, target: str, failure: str) -> dict:
    """The same engine columns from the build log of a build a gate refused (no .rknn, no manifest): the layer
    table's cycles, traffic and memory and the REGTASK lines; engine bytes, simulator SNR and peak RSS unknown;
    `build_status` carries the failed gate's line."""
    from rkaudio.gates.layer_table import parse_layer_table
    from rkaudio.gates.regtask import parse_regtask

    import re

    text = Path(build_log).read_text(errors="replace")
    table = parse_layer_table(text)
    simulator = re.search(r"simulator (-?[\d.]+) dB", failure or "")
    return {"target": target, "window": int(window), "emitted": int(emitted),
            "predicted_ms_per_emitted": None, "first_window_ms_pred": None,  # the call's I/O needs the manifest
            "est_cycles_per_emitted": round(table.est_cycles / emitted),
            "rw_kb_per_emitted": round(table.rw_kb / emitted, 1), "first_window_cycles": table.est_cycles,
            "engine_bytes": None, "weight_bytes": table.weight_bytes, "internal_bytes": table.internal_bytes,
            "regtask_lines": parse_regtask(text).lines, "cpu_ops": len(table.cpu_compute),
            "sim_snr_db": float(simulator.group(1)) if simulator else None,
            "build_peak_rss_bytes": None, "build_status": failure}


def relative_to(rows: list[dict], window: int, key: str = "predicted_ms_per_emitted") -> list[dict]:
    """Add `<key>_vs_w<window>`: each row's figure over the same target's row at `window` (None without one)."""
    base = {row["target"]: row[key] for row in rows if row["window"] == window and row.get(key)}
    for row in rows:
        reference = base.get(row["target"])
        row[f"{key}_vs_w{window}"] = round(row[key] / reference, 3) if reference and row.get(key) else None
    return rows


def build_cli(family: str, args: list[str], out: Path, log: Path) -> float:
    """Run `python -m rkaudio.cli <family> <args> --out <out>` in the export venv (one build at a time: the
    caller loops), the output into `log`; returns the wall seconds; RuntimeError naming the log on failure
    (`failed_gate(log)` says which gate when one refused the engine)."""
    out.mkdir(parents=True, exist_ok=True)
    python = REPO / ".venv" / "export" / "bin" / "python"
    started = time.perf_counter()
    with open(log, "w") as sink:
        code = subprocess.call([str(python if python.exists() else sys.executable), "-m", "rkaudio.cli", family,
                                *args, "--out", str(out)], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    if code:
        raise RuntimeError(f"{family} build {' '.join(args)} exited {code}: see {log}")
    return round(time.perf_counter() - started, 1)


def failed_gate(log: Path) -> str | None:
    """The first `[FAIL] ...` line of a CLI build's output (a gate refused the engine), else None."""
    for line in Path(log).read_text(errors="replace").splitlines():
        if "[FAIL]" in line:
            return line.strip()
    return None


def plot(rows: list[dict], path: Path, title: str, y: str = "predicted_ms_per_emitted",
         ylabel: str = "predicted board ms per emitted frame") -> Path | None:
    """Predicted board ms per emitted frame (or `y`) against the window, one line per target, into `path` (PNG).
    None, and nothing written, when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return None
    figure, axes = pyplot.subplots(figsize=(7, 4.2))
    for target in sorted({row["target"] for row in rows}):
        points = sorted((row["window"], row[y]) for row in rows if row["target"] == target and row.get(y))
        if not points:
            continue
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=target)
        for window, value in points:
            axes.annotate(f"{value:,.3g}", (window, value), textcoords="offset points", xytext=(0, 6),
                          ha="center", fontsize=8)
    axes.set_xlabel("window W (latent frames)")
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    return path

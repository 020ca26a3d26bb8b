"""Qwen3 step: the row convs' halo forms per target (issue #43), ranked by predicted board ms per code frame.

Each candidate (rkaudio/families/qwen3_vocoder/cache.py HALO_FORMS) is built the way a user builds it,
`convert qwen3-vocoder --halo-form FORM --target T --codes-length B`, on a random snapshot of the real shape (`--config
real`, default; seed 3, as bench/board_time.py) or of the test config (`--config tiny`). No gate refuses a row: the
real-time and REGTASK gates are opened so that every figure is recorded, and a build that still fails is a row with
its reason. Rows: CPU ops (by type), REGTASK lines, predicted board ms per call and per code frame, engine bytes, the
compiler's peak RSS and its stage, the simulator's pcm dB. Writes bench/results/qwen3_halo_forms.md (per target,
fastest first, the family's choice marked) beside the harness's JSON.

The family's table (rkaudio/families/qwen3_vocoder/step_export.py HALO_FORM_BY_TARGET) is read from these rows: the
lowest ms per code frame among the forms that build within 16 GB."""
from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TARGETS = ("rk3588", "rk3576", "rk3566")
FORMS = ("channels_last", "tail_transpose", "tail_matmul")
FRAMES = (16, 64)
GB = 1e9
PEAK_LIMIT_GB = 16.0
# Forms whose predicted ms per code frame lie within this of the fastest are tied: the board-time model's largest error
# on an RK3588 board figure it was fitted to (bench/results/board_time.md: the Qwen3 B=64 step, +5.1%). It prices a
# CPU op by its bytes only, not the NPU/CPU hand-over around it, so a tie goes to the form with fewer CPU ops.
TIE_PERCENT = 5.1
STEP_MODULES = r"quantizer|pre_conv|pre_transformer|upsample\.\d+\.\d+|decoder\.\d+"


def snapshot(config_name: str, directory: Path) -> Path:
    from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, write_random_snapshot
    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG

    config = REAL_SHAPE_DECODER_CONFIG if config_name == "real" else TINY_CONFIG
    return write_random_snapshot(directory, config, seed=3)


def op_part(name: str) -> str:
    """Where a CPU op sits, from its node name: the step's module ("decoder.1", "pre_transformer", "quantizer", ...),
    or "cache" for the flat cache's own slices, reshapes and join (nodes named at the step's top level)."""
    parts = name.split("/")
    module = parts[2] if len(parts) > 3 and parts[1] == "step" else ""
    return module if re.fullmatch(STEP_MODULES, module) else "cache"


def build_row(model_dir: Path, target: str, form: str, frames: int, out: Path) -> dict:
    """One `convert qwen3-vocoder` build of the B=`frames` step in `form` for `target`: its figures, or why it
    failed."""
    role = "first" if frames == 16 else "main"
    command = [sys.executable, "-m", "rkaudio.cli", "qwen3-vocoder", "--model-dir", str(model_dir),
               "--codes-length", str(frames), "--role", role, "--target", target, "--halo-form", form,
               "--max-real-time-factor", "1e9", "--max-regtask-lines", "1000000000", "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True)
    row = {"target": target, "form": form, "B": frames}
    manifests = sorted(out.glob("*.manifest.json"))
    if run.returncode or not manifests:
        lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
        return {**row, "status": f"failed: {lines[-1] if lines else run.returncode}"}
    manifest = json.loads(manifests[0].read_text())
    cpu = collections.Counter(op["type"] for op in manifest["ops"]["cpu_ops"])
    stages = manifest["build"].get("stage_peak_rss_bytes") or {}
    peak_stage = max(stages, key=stages.get) if stages else None
    predicted = (manifest.get("predicted_board_ms") or {}).get("ms")
    parts = collections.defaultdict(lambda: [0, 0.0])
    for op in manifest["ops"]["cpu_ops"]:
        part = parts[op_part(op["name"])]
        part[0] += 1
        part[1] += op.get("predicted_ms") or 0.0
    return {**row, "cpu_ops": sum(cpu.values()), "cpu_op_types": dict(sorted(cpu.items())),
            "cpu_ms": round(sum(ms for _, ms in parts.values()), 3),
            "cpu_ops_by_part": {part: {"ops": count, "ms": round(ms, 3)}
                                for part, (count, ms) in sorted(parts.items())},
            "regtask_lines": manifest["regtask"]["lines"], "predicted_ms": predicted,
            "ms_per_code_frame": round(predicted / frames, 3) if predicted is not None else None,
            "engine_bytes": manifest["rknn"]["bytes"],
            "peak_gb": round(stages[peak_stage] / GB, 2) if stages else None, "peak_stage": peak_stage,
            "simulator_pcm_db": round(manifest["simulator"]["pcm"]["snr_db"], 1), "status": "built"}


def picks(rows: list[dict]) -> set[tuple]:
    """(target, B, form) of the form each (target, B) should ship: among the built rows that peak under
    PEAK_LIMIT_GB, those within TIE_PERCENT of the fastest ms per code frame, the fewest CPU ops, then the fastest."""
    groups = collections.defaultdict(list)
    for row in rows:
        if row["status"] == "built" and (row.get("peak_gb") or 0) < PEAK_LIMIT_GB:
            groups[(row["target"], row["B"])].append(row)
    chosen = set()
    for (target, frames), built in groups.items():
        fastest = min(row["ms_per_code_frame"] for row in built)
        tied = [row for row in built if row["ms_per_code_frame"] <= fastest * (1 + TIE_PERCENT / 100)]
        best = min(tied, key=lambda row: (row["cpu_ops"], row["ms_per_code_frame"]))
        chosen.add((target, frames, best["form"]))
    return chosen


def markdown(rows: list[dict], config_name: str, chosen: dict) -> str:
    lines = [f"# Qwen3 step: halo forms per target ({config_name} shape, random weights)", "",
             "Regenerate: `make bench NAME=qwen3_halo_forms` (options: `ARGS=--help`). Per target and B, fastest "
             "first; **bold**: the family's form for the target (step_export.HALO_FORM_BY_TARGET); pick: the rule's "
             f"choice (within {TIE_PERCENT}% of the fastest ms per code frame, the board-time model's largest RK3588 "
             "error, the fewest CPU ops, then the fastest; peak under 16 GB).", "",
             "| target | B | form | pick | CPU ops | CPU op types | CPU ops by part (predicted ms) | REGTASK "
             "| predicted ms / call | ms / code frame | engine bytes | peak GB (stage) | simulator pcm dB | status |",
             "|" + "---|" * 14]
    picked = picks(rows)
    key = (lambda r: (r["target"], r["B"], r.get("ms_per_code_frame") is None, r.get("ms_per_code_frame") or 0))
    for row in sorted(rows, key=key):
        form = f"**{row['form']}**" if chosen.get(row["target"]) == row["form"] else row["form"]
        types = ", ".join(f"{op} {count}" for op, count in row.get("cpu_op_types", {}).items()) or "-"
        by_part = ", ".join(f"{part} {v['ops']} ({v['ms']:g})" for part, v in row.get("cpu_ops_by_part", {}).items())
        figures = [row.get("cpu_ops", "-"), types, by_part or "-", row.get("regtask_lines", "-"),
                   row.get("predicted_ms", "-"),
                   row.get("ms_per_code_frame", "-"), f"{row['engine_bytes']:,}" if "engine_bytes" in row else "-",
                   f"{row['peak_gb']} ({row['peak_stage']})" if row.get("peak_gb") is not None else "-",
                   row.get("simulator_pcm_db", "-")]
        pick = "yes" if (row["target"], row["B"], row["form"]) in picked else ""
        lines.append("| " + " | ".join(str(v) for v in [row["target"], row["B"], form, pick, *figures, row["status"]])
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.families.qwen3_vocoder.step_export import halo_form_for

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--config", choices=("real", "tiny"), default="real",
                        help="real: the real-shape config, random weights (default); tiny: the test config")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma list of targets")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma list of halo forms")
    parser.add_argument("--frames", default=",".join(map(str, FRAMES)), help="comma list of B (16: first, else main)")
    parser.add_argument("--cells", default=None, help="comma list of TARGET:FORM:B, instead of every combination of "
                        "--targets, --forms and --frames (B outermost)")
    parser.add_argument("--markdown", type=Path, default=run.BENCH_DIR / "results" / "qwen3_halo_forms.md",
                        help="where the table goes (default bench/results/qwen3_halo_forms.md)")
    args = parser.parse_args(argv)
    cells = ([(target, form, int(frames)) for target, form, frames in (c.split(":") for c in args.cells.split(","))]
             if args.cells else [(target, form, int(frames)) for frames in args.frames.split(",")
                                 for target in args.targets.split(",") for form in args.forms.split(",")])
    targets = sorted({target for target, _, _ in cells})
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-qwen3-halo-") as scratch:
        work = Path(scratch)
        model_dir = snapshot(args.config, work / "snapshot")
        for target, form, frames in cells:
            rows.append(build_row(model_dir, target, form, frames, work / f"{target}_{form}_{frames}"))
            print(rows[-1], flush=True)
            # after every row: a long run that is stopped keeps what it measured
            args.markdown.write_text(markdown(rows, args.config, {t: halo_form_for(t) for t in targets}))
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

"""`convert build` before and after `--fix` on speech models that are no family of rkaudio (issue #44): the SpeechT5
HiFi-GAN, the MMS-TTS VITS decoder, the DAC decoder, the Wav2Vec2-base encoder and the Whisper-base encoder, built
from transformers at random init (tests/speech_models.py) at their named configs (`--size full`, the default) or the
reduced ones `make test` builds.

Every row runs the `convert` app as a user types it, on the model's ONNX as torch.onnx.export writes it:
- `before`: `convert build MODEL.onnx --target T` with the REGTASK and SNR gates opened, so the row has its figures;
- `after`: `convert build MODEL.onnx --target T --fix` at the command's default gates. A failing gate is recorded
  (`gates`), and the same command is run again with the gates opened, for the figures.
Columns: REGTASK lines and the worst value/limit ratio, CPU ops, the doctor's fp16-range sites, the simulator's SNR
and the graph's fp16 floor, the predicted board ms per call, engine MB, the passes `--fix` applied and the doctor's
findings left. The table goes to bench/results/doctor.md with the JSON."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = ("rk3588", "rk3576", "rk3566")
OPEN_GATES = ("--max-regtask-lines", "1000000", "--min-snr-db", "-100")


def convert(*args: str) -> subprocess.CompletedProcess:
    """The `convert` console script of this interpreter's venv."""
    return subprocess.run([str(Path(sys.executable).with_name("convert")), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)


def figures(manifest_path: Path) -> dict:
    """A row's figures from a build's manifest."""
    data = json.loads(manifest_path.read_text())
    (output, simulated), = list(data["simulator"].items())[:1]
    doctor = data.get("doctor") or {}
    kept = [a["name"] for a in doctor.get("applied", []) if a["kept"]]
    refused = [a["name"] for a in doctor.get("applied", []) if not a["kept"]]
    left = doctor.get("left") or []
    return {
        "regtask_lines": data["regtask"]["lines"], "worst_ratio": round(data["regtask"]["worst_ratio"], 2),
        "cpu_ops": len(data["ops"]["cpu_ops"]),
        "cpu_op_types": ",".join(sorted({op.get("type") or op.get("op_type") or "?" for op in data["ops"]["cpu_ops"]})),
        "fp16_sites": sum(f["kind"] == "fp16_range" for f in left) if doctor else None,
        "simulator_db": round(simulated["snr_db"], 1), "fp16_floor_db": round(simulated["fp16_floor_snr_db"], 1),
        "predicted_ms": (data.get("predicted_board_ms") or {}).get("ms"),
        "engine_mb": round(data["rknn"]["bytes"] / 1e6, 2),
        "passes": ",".join(kept) + (f" (refused: {','.join(refused)})" if refused else ""),
        "left": "; ".join(f"{f['kind']} {f['op_type']} {f['node']}" for f in left[:4])
        + (f" (+{len(left) - 4})" if len(left) > 4 else ""),
    }


def cell(model: str, size: str, target: str, work: Path) -> list[dict]:
    """The before and after rows of one (model, target)."""
    from tests.speech_models import export

    onnx_path = work / f"{model}.onnx"
    if not onnx_path.is_file():
        export(model, onnx_path, size)
    rows = []
    for stage, args in (("before", OPEN_GATES), ("after", ("--fix",))):
        out = work / f"{target}_{stage}"
        started = time.time()
        result = convert("build", str(onnx_path), "--target", target, "--out", str(out), *args)
        failed = ""
        if result.returncode:
            failed = " ".join(line.strip() for line in result.stdout.splitlines() + result.stderr.splitlines()
                              if "[FAIL]" in line)[:300] or f"exit {result.returncode}"  # the gates that failed
            result = convert("build", str(onnx_path), "--target", target, "--out", str(out), *args, *OPEN_GATES)
            if result.returncode:
                rows.append({"model": model, "size": size, "target": target, "stage": stage,
                             "gates": f"build failed: {result.stderr[-300:]}"})
                continue
        manifest = next(out.glob("*.manifest.json"))
        rows.append({"model": model, "size": size, "target": target, "stage": stage, **figures(manifest),
                     "gates": "opened" if stage == "before" else (failed or "pass"),
                     "wall_s": round(time.time() - started, 1)})
    return rows


def over_cells(models, targets, prefix: str, cell) -> list[dict]:
    """The rows of `cell(model, target, work)` (a list each) for every model and target, each model's ONNX and builds
    in a scratch folder of its own (`work`), each row printed as JSON when measured."""
    rows = []
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        for model in models:
            work = Path(scratch) / model
            work.mkdir()
            for target in targets:
                rows += cell(model, target, work)
                print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    columns = ["model", "size", "target", "stage", "regtask_lines", "worst_ratio", "cpu_ops", "fp16_sites",
               "simulator_db", "fp16_floor_db", "predicted_ms", "engine_mb", "passes", "gates", "left"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if row.get(c) is None else str(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    from tests.speech_models import MODELS, SIZES

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--size", choices=SIZES, default="full", help="The models' configs.")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--markdown", type=Path, default=run.BENCH_DIR / "results" / "doctor.md",
                        help="Where the table goes (the JSON goes beside it, by the harness).")
    options = parser.parse_args(argv)
    rows = over_cells(options.models, options.targets, "rkaudio-doctor-bench-",
                      lambda model, target, work: cell(model, options.size, target, work))
    options.markdown.write_text(f"# `convert build --fix` on speech models outside the families ({options.size} "
                                "configs, random init)\n\nMade by `make bench NAME=doctor`; see bench/doctor.py.\n\n"
                                + markdown(rows))
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

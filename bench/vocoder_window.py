"""`convert build MODEL.onnx --window auto --fix` (issue #45) on the three vocoders of the doctor bench: the SpeechT5
HiFi-GAN, the MMS-TTS VITS decoder and the DAC decoder (tests/speech_models.py, random init), exported with a
dynamic time axis at their named configs (`--size full`, the default) or the reduced ones `make test` builds.

Each row is one (model, target) run of the `convert` app as a user types it: the window `auto` kept (each candidate's
predicted board ms per emitted frame beside it), the measured context, the walk's figures against the full-length
run of the dynamic graph (the worst interior window of the exact window graph, which the context was measured on, and
of the engine's fp32 graph after `--fix`; the last window; the worst short latent), REGTASK lines, CPU ops, the
simulator's SNR, the predicted board ms, the passes applied and the gates. The table goes into its own section of
bench/results/doctor.md (the doctor bench's file), with the JSON."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

TARGETS = ("rk3588", "rk3576", "rk3566")
VOCODERS = ("speecht5_hifigan", "mms_tts_decoder", "dac_decoder")
SECTION = ("<!-- bench/vocoder_window.py: start -->", "<!-- bench/vocoder_window.py: end -->")
COLUMNS = ["model", "size", "target", "window", "context", "emitted", "hop", "candidates_ms_per_frame",
           "ms_per_emitted", "interior_exact_db", "interior_db", "last_db", "tail_db", "regtask_lines", "cpu_ops",
           "simulator_db", "predicted_ms", "engine_mb", "passes", "gates", "wall_s"]


def figures(manifest: dict, stdout: str) -> dict:
    """A row's figures from the build's manifest and what `--window auto` printed."""
    contract, gates = manifest["contract"], {gate["name"]: gate for gate in manifest["gates"]}
    summary = stdout.split(f"--window auto for {manifest['target']}:", 1)[-1] if "--window auto for" in stdout else ""
    candidates = re.findall(r"^  window (\d+): ([\d.]+ predicted|.*)", summary, flags=re.M)
    tails = [float(gate["value"]) for name, gate in gates.items() if name.startswith("tail_snr")]  # "inf": exact
    ms = (manifest.get("predicted_board_ms") or {}).get("ms")
    return {
        "window": contract["window"], "context": contract["context"], "emitted": contract["emitted"],
        "hop": contract["hop"],
        "candidates_ms_per_frame": " / ".join(f"{w}: {v.replace(' predicted', '')}" for w, v in candidates),
        "ms_per_emitted": None if ms is None else round(ms / contract["emitted"], 4),
        "interior_exact_db": float(contract["context_search_db"][str(contract["context"])]),
        "interior_db": round(float(gates["interior_snr_min"]["value"]), 1),
        "last_db": round(float(gates["last_window_snr"]["value"]), 1),
        "tail_db": round(min(tails), 1) if tails else None, "regtask_lines": manifest["regtask"]["lines"],
        "cpu_ops": manifest["ops"]["cpu"], "predicted_ms": ms, "engine_mb": round(manifest["rknn"]["bytes"] / 1e6, 2),
        "simulator_db": round(min(out["snr_db"] for out in manifest["simulator"].values()), 1),
        "passes": ",".join(name[4:] for name in gates if name.startswith("fix:")),
        "gates": "pass" if all(gate["passed"] for gate in gates.values()) else
        "FAIL " + ",".join(name for name, gate in gates.items() if not gate["passed"]),
    }


def cell(model: str, size: str, target: str, window: str, work: Path, gates: tuple[str, ...] = ()) -> list[dict]:
    """One (model, target)'s row: `convert build DYNAMIC.onnx --window WINDOW --fix --target TARGET [GATES]`."""
    from doctor import convert  # bench/ is no package: run.py puts it on sys.path
    from tests.speech_models import export

    onnx_path = work / f"{model}.onnx"
    if not onnx_path.is_file():
        export(model, onnx_path, size, dynamic_time=True)
    out = work / target
    started = time.time()
    result = convert("build", str(onnx_path), "--window", window, "--fix", "--target", target, "--out", str(out),
                     *gates)
    row = {"model": model, "size": size, "target": target}
    manifests = list(out.glob("*.manifest.json"))
    if result.returncode or not manifests:
        failed = [line.strip() for line in (result.stdout + result.stderr).splitlines() if "[FAIL]" in line]
        return [{**row, "gates": f"exit {result.returncode}: " + (" ".join(failed) or result.stderr[-300:])[:400]}]
    return [{**row, **figures(json.loads(manifests[0].read_text()), result.stdout),
             "wall_s": round(time.time() - started, 1)}]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join("" if row.get(c) is None else str(row.get(c)) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str) -> None:
    """Put `text` between the SECTION markers of `path` (appended, markers and all, when it has none)."""
    start, end = SECTION
    old = path.read_text() if path.is_file() else ""
    block = f"{start}\n{text}{end}\n"
    if start in old and end in old:
        new = old[:old.index(start)] + block + old[old.index(end) + len(end) + 1:]
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + block
    path.write_text(new)


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from doctor import over_cells

    from tests.speech_models import SIZES

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--size", choices=SIZES, default="full", help="The models' configs.")
    parser.add_argument("--models", nargs="+", choices=VOCODERS, default=list(VOCODERS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--window", default="auto", help="--window of every build (auto, or a number of frames).")
    parser.add_argument("--min-snr-db", type=float, help="The builds' simulator gate (default: the command's); the "
                        "random-init full DAC's own fp16 floor is 33.4 dB, under the default 35 "
                        "(bench/results/doctor.md).")
    parser.add_argument("--markdown", type=Path, default=run.BENCH_DIR / "results" / "doctor.md",
                        help="The file whose window-walk section the table replaces.")
    options = parser.parse_args(argv)
    gates = () if options.min_snr_db is None else ("--min-snr-db", str(options.min_snr_db))
    rows = over_cells(options.models, options.targets, "rkaudio-vocoder-window-bench-",
                      lambda model, target, work: cell(model, options.size, target, options.window, work, gates))
    write_section(options.markdown, f"### `convert build --window {options.window} --fix {' '.join(gates)}` "
                  f"({options.size} configs, bench/vocoder_window.py)\n\n".replace(" ` (", "` (") + markdown(rows))
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

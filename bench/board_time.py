"""Fit the board-time model (rkaudio/gates/board_time.py) to the spec's board measurements, and report how well
it holds.

Each calibration point is a board figure from the spec (shared/spec/rknn-decoder-path.md and
audio8-asr-kv-buckets.zh.md) and the engines rebuilt the way the spec built them: same window, batch, sine form and
call layout, toolkit 2.3.2. The point's predicted time is the sum of its engine calls' figures (layer table and call
I/O) times the constants, so a point may be many calls (Audio8's split step: 24 per token).

The constants per SoC: the terms the board data pins are fitted (non-negative least squares on the relative
error); the others are set from public figures and named as such. Leave-one-out: each point predicted by the
constants fitted without it. Writes bench/results/board_time.{md,json,png} and rkaudio/gates/board_time_constants.json
(what the manifests' `predicted_board_ms` uses). RK3566 has no board figure: its constants are RK3588's, scaled
under the assumption stated in the JSON.

Engines are built (or reused) under --work (default /tmp/bench-board-time, one folder per engine). The real-shape
Qwen3 B=64 step and the Audio8 graphs are long builds (about 20 and 15 min, 8.5 and 5.1 GB): point --work at a
folder that has them to refit only. --refit refits from the figures of bench/results/board_time.json without
building."""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from rkaudio.gates.board_time import CONSTANTS_FILE, TERMS, CallFigures, Constants

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
TOOLKIT = "2.3.2"

# Public figures for the terms the board data cannot pin (see the module docstring of rkaudio/gates/board_time.py).
CLOCK_GHZ = 1.0  # RK3588 NPU clock (TRM, as quoted publicly): 1 estimated cycle = 1 ns
DISPATCH_MS_PER_LAYER = 0.006  # nsbb/rknn-stt on an RK3588: about 6 us per layer


@dataclass(frozen=True)
class Engine:
    """One engine of a calibration point and how many calls of it the measured unit makes."""
    key: str  # folder under the work directory
    calls: int = 1


@dataclass
class Point:
    name: str
    target: str
    measured_ms: float
    unit: str
    engines: tuple[Engine, ...]
    source: str  # where the board figure is, and how it became ms per unit
    fitted: bool = True
    note: str = ""
    figures: dict = field(default_factory=dict)  # CallFigures summed over the calls (filled by `collect`)


def points() -> list[Point]:
    split_step = (*(Engine(f"audio8_kv_l{i}") for i in range(8)), *(Engine(f"audio8_block_l{i}_s128") for i in range(8)),
                  *(Engine(f"audio8_head_{i}") for i in range(8)))
    return [
        Point("piper decoder 93/45/24", "rk3588", 0.46 * 45, "ms per window (45 emitted slices)",
              (Engine("piper_decoder_w93_c24"),),
              "0.46 ms per emitted slice (lessac medium, 1,030 ms of decoder for 25.18 s); joe is the same medium "
              "architecture"),
        Point("kokoro W=128 clipped sine", "rk3588", 9609 / 17, "ms per window",
              (Engine("kokoro_w128_clip"),), "9,609 ms of generator over 17 windows (185 Russian characters)"),
        Point("kokoro W=128 folded sine (Floor)", "rk3588", 9609 / 17 * 28400 / 20849, "ms per window",
              (Engine("kokoro_w128_floor"),),
              "the clipped row x 28,400 / 20,849 ms (the folded engine against the clipped one, interleaved, "
              "33.6 s utterance): +36%"),
        Point("qwen3 vocoder B=64 step", "rk3588", 3090.0, "ms per 64-token step",
              (Engine("qwen3_b64"),),
              "3,090 ms per 64-token step (the core-use section: 259.69 MB of weights per step over 3,090 ms)",
              note="The spec's offline table gives 64.1 ms per token (300 Russian characters), 4,102 ms per 64 tokens: "
              "that figure is the decoder stage per token, the step's CPU work included (the code embedding and "
              "the PCM hand-off around each call) and the padded last step spread over fewer tokens (300 tokens "
              "take 5 steps: 19,230 ms / 5 = 3,846 ms per step). The model predicts the engine call only, so the "
              "fit uses the per-step figure; against 4,102 ms it would be 21% low."),
        *(Point(f"piper encoder {width} bin (today's form)", "rk3588", measured, "ms per call",
                (Engine(f"piper_encoder_w{width}"),), source, fitted=False,
                note="Not a calibration point: the spec's encoder bins held constant-index gathers and Toeplitz "
                "weights (2.9 GB at the 384 bin), today's is banded relative attention, and that form cannot be "
                "rebuilt here. Shown to say how far today's engine is from the old one's board time; the model "
                "has no weight-streaming term, which a Toeplitz point would need (a board run of today's bins "
                "would make them calibration points).")
          for width, measured, source in ((128, 67.0, "63-71 ms at 109-115 tokens (mid-range)"),
                                          (384, 730.5, "688-773 ms at 285-373 tokens (mid-range)"))),
        Point("audio8 encoder", "rk3576", (408.55 + 389.64 + 413.23 + 405.26) / 4, "ms per call",
              (Engine("audio8_encoder"),), "389.6-413.2 ms over the 2/4/6/8 s clips, mean"),
        Point("audio8 adapter T100", "rk3576", (58.06 + 45.97 + 62.38 + 58.87) / 4, "ms per call",
              (Engine("audio8_adapter_t100"),),
              "46.0-62.4 ms for T25..T100 (not ordered by T), mean; the T100 graph stands for all"),
        Point("audio8 prefill", "rk3576", (103.95 + 84.42 + 150.35 + 165.19) / 4, "ms per call",
              (Engine("audio8_prefill"),), "84.4-165.2 ms at 35-110 prompt tokens (one fixed-length graph), mean"),
        Point("audio8 decoder token, split layout, bucket 128", "rk3576", (2844.99 + 3482.55) / (18 + 22),
              "ms per token (24 calls)", split_step,
              "decoder NPU total 2,845 ms / 18 steps (4 s clip) and 3,483 ms / 22 steps (6 s), both in bucket 128 "
              "(the first token comes from the prefill)"),
    ]


def _figures(directory: Path, calls: int) -> dict:
    """CallFigures of the engine built in `directory` (its manifest and build log), times `calls`."""
    from rkaudio.core.manifest import read_manifest
    from rkaudio.gates.board_time import figures_from_log

    (manifest_path,) = directory.glob("*.manifest.json")
    manifest = read_manifest(manifest_path)
    figures = figures_from_log(manifest, (directory / manifest["build_log"]).read_text(errors="replace")).to_json()
    return {name: value * calls for name, value in figures.items()}


def _build(key: str, work: Path) -> None:
    """Export and compile one calibration engine into `work`/`key`, every gate recording only (the figure is the
    point)."""
    from rkaudio.engine.build import BuildOptions, build_engine

    options = BuildOptions("rk3576" if key.startswith("audio8") else "rk3588", TOOLKIT, max_regtask_lines=10**9,
                           fail_on_cpu_ops=False, min_simulator_snr_db=-math.inf)
    out = work / key
    if key == "piper_decoder_w93_c24":
        from rkaudio.families.piper import FAMILY, decoder

        record = decoder.export(FAMILY.job("decoder", target="rk3588", out=out,
                                           options={"window": 93, "context": 24}))[0]
        build_engine(record.onnx, out, options, selfcheck=record.selfcheck)
    elif key.startswith("piper_encoder_w"):
        from rkaudio.families.piper import FAMILY, encoder

        record = encoder.export_width(FAMILY.job("duration_encoder", target="rk3588", out=out), encoder.Voice(None),
                                      int(key.rsplit("w", 1)[1]))
        build_engine(record.onnx, out, options, selfcheck=record.selfcheck)
    elif key.startswith("kokoro_w128_"):
        from rkaudio.families.kokoro import FAMILY
        from rkaudio.families.kokoro.export import export
        from rkaudio.families.kokoro.sources import load_generator

        config, state, label, taps = load_generator(None, None, out, use_cache=False)
        job = FAMILY.job(target="rk3588", out=out, options={"frames": 128, "fine_layout": "plain"})
        record = export(job, config, state, label, key.rsplit("_", 1)[1], taps)[0]
        build_engine(record.onnx, out, options, selfcheck=record.selfcheck)
    elif key == "qwen3_b64":
        _build_qwen3(out, options)
    elif key.startswith("audio8_"):
        _build_audio8(options, work)
    else:
        raise ValueError(f"no calibration engine {key!r}")


def _build_qwen3(out: Path, options) -> None:
    """The real-shape B=64 main step from a random-init snapshot (seed 3): about 20 min, 8.5 GB in the child."""
    import subprocess

    from rkaudio.engine.build import build_engine
    from rkaudio.families.qwen3_vocoder.random_model import write_random_snapshot
    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG

    write_random_snapshot(out / "snapshot", REAL_SHAPE_DECODER_CONFIG, seed=3)
    onnx_path = out / "step_64.onnx"
    subprocess.run([sys.executable, "-m", "rkaudio.cli", "qwen3-vocoder", "--model-dir", str(out / "snapshot"),
                    "--codes-length", "64", "--role", "main", "--skip-rknn", "--target", "rk3588",
                    "--output", str(onnx_path)], cwd=REPO, check=True)
    build_engine(onnx_path, out, options)


def _link(source: Path, stem: str, work: Path, key: str) -> None:
    """`work`/<key>/ with links to `source`'s <stem>.manifest.json and <stem>.build.log (one engine per folder)."""
    folder = work / key
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in (".manifest.json", ".build.log"):
        link = folder / f"{stem}{suffix}"
        link.unlink(missing_ok=True)
        link.symlink_to(source / f"{stem}{suffix}")


def _build_audio8(options, work: Path) -> None:
    """Every Audio8 calibration engine at once, real shape (random weights, seed 0), rk3576: the encoder, the
    adapter (T100), the prefill and the head shards from `convert audio8`'s export, and the spec's split step
    (per layer a K/V projection and a block over bucket 128) from bench/audio8.py's layouts."""
    from rkaudio.engine.build import build_engine
    from rkaudio.families.audio8 import graphs_job, model as M
    from rkaudio.families.audio8.export import export_all

    import audio8 as audio8_bench

    model = M.build_random(M.real_shape_config(), seed=0)
    graphs, engines = work / "audio8_graphs", work / "audio8_graphs" / "engines"
    plan = export_all(graphs_job(graphs, [128], 8), model)
    wanted = {"encoder": "audio8_encoder", "adapter": "audio8_adapter_t100", "prefill": "audio8_prefill",
              **{f"head_{i}": f"audio8_head_{i}" for i in range(8)}}
    for entry in plan["graphs"]:
        stem = entry["onnx"].removesuffix(".onnx")
        if stem in wanted:
            build_engine(graphs / entry["onnx"], engines, options)
            _link(engines, stem, work, wanted[stem])
    layouts = work / "audio8_layouts"
    audio8_bench.step_layouts(model, layouts, [128], 1, 8, options.target, options.toolkit)
    for i in range(8):
        for stem in (f"kv_l{i}", f"block_l{i}_s128"):
            _link(layouts / f"engines_{options.target}", stem, work, f"audio8_{stem}")


def collect(selected: list[Point], work: Path) -> list[Point]:
    for point in selected:
        total: dict = {}
        for engine in point.engines:
            directory = work / engine.key
            if not list(directory.glob("*.manifest.json")):
                print(f"building {engine.key} ...", flush=True)
                _build(engine.key, work)
            for name, value in _figures(directory, engine.calls).items():
                total[name] = total.get(name, 0) + value
        point.figures = total
    return selected



# The fits, in order (a later one of the same SoC replaces the earlier): the constants the board data pins per SoC
# (`free`), and the ones borrowed from another SoC's fit, times a factor. RK3588's points carry at most 10 MB of call
# I/O, too little to pin its rate: it is RK3576's halved (Cortex-A76 at 2.4 GHz converting against A72 at 2.2 GHz).
# Audio8's graphs move too little elementwise traffic (at most 70 MB a call) to pin RK3576's rates: RK3588's (the
# same LPDDR4x/5 class). The first RK3588 fit (call I/O at 0) only seeds RK3576's.
FITS = (
    ("rk3588", ("ms_per_elementwise_mb", "ms_per_cpu_mb"), {}),
    ("rk3576", ("ms_per_cycle", "ms_per_io_mb"), {"ms_per_elementwise_mb": ("rk3588", 1.0),
                                                  "ms_per_cpu_mb": ("rk3588", 1.0)}),
    ("rk3588", ("ms_per_elementwise_mb", "ms_per_cpu_mb"), {"ms_per_io_mb": ("rk3576", 0.5)}),
)
PUBLIC = {"ms_per_cycle": 1e-6 / CLOCK_GHZ, "ms_per_layer": DISPATCH_MS_PER_LAYER, "ms_per_io_tensor": 0.0,
          "ms_per_io_mb": 0.0, "ms_per_elementwise_mb": 0.0, "ms_per_cpu_mb": 0.0}
UNITS = {"ms_per_cycle": ("cycles", 1), "ms_per_elementwise_mb": ("elementwise_bytes", 1 / 1024**2),
         "ms_per_cpu_mb": ("cpu_bytes", 1 / 1024**2),
         "ms_per_layer": ("layers", 1), "ms_per_io_tensor": ("io_tensors", 1), "ms_per_io_mb": ("io_bytes", 1 / 1024**2)}


def _row(point: Point, names) -> list[float]:
    return [point.figures[UNITS[name][0]] * UNITS[name][1] for name in names]


def fit(selected: list[Point], free: tuple[str, ...], fixed: dict) -> dict:
    """Constants minimising the squared relative error over `selected`: `free` by non-negative least squares, the
    others from `fixed`."""
    import numpy as np
    from scipy.optimize import nnls

    fixed_ms = np.array([sum(v * fixed[n] for v, n in zip(_row(p, fixed), fixed) if n not in free) for p in selected])
    measured = np.array([p.measured_ms for p in selected])
    design = np.array([_row(p, free) for p in selected]) / measured[:, None]
    solution, _ = nnls(design, (measured - fixed_ms) / measured)
    return {**fixed, **dict(zip(free, map(float, solution)))}


def predicted(point: Point, constants: dict) -> dict:
    terms = Constants.from_json(constants).terms(CallFigures(**point.figures))
    return {"ms": sum(terms.values()), "terms": terms}


def evaluate(all_points: list[Point]) -> tuple[dict, list[dict]]:
    """Per SoC (FITS): the constants fitted on every fitted point, and per point its prediction, error and
    leave-one-out error (the free constants refitted without it, the borrowed ones held)."""
    socs = {}
    for soc, free, borrowed in FITS:
        fitted = [p for p in all_points if p.target == soc and p.figures and p.fitted]
        if not fitted or any(source not in socs for source, _ in borrowed.values()):
            continue
        fixed = {**PUBLIC, **{name: socs[source]["constants"][name] * factor
                              for name, (source, factor) in borrowed.items()}}
        socs[soc] = {"constants": fit(fitted, free, fixed), "fixed": fixed, "fitted": list(free),
                     "points": [p.name for p in fitted],
                     "basis": f"fitted on {len(fitted)} {soc.upper()} board figures (bench/board_time.py)"}
    rows = []
    for point in all_points:
        if point.target not in socs or not point.figures:
            continue
        entry = socs[point.target]
        whole = predicted(point, entry["constants"])
        others = [p for p in all_points if p.target == point.target and p.fitted and p.figures and p is not point]
        loo = predicted(point, fit(others, tuple(entry["fitted"]), entry["fixed"]))["ms"] \
            if point.fitted and len(others) >= len(entry["fitted"]) else None
        rows.append({"point": point.name, "target": point.target, "unit": point.unit,
                     "measured_ms": point.measured_ms, "predicted_ms": whole["ms"],
                     "error_pct": 100 * (whole["ms"] / point.measured_ms - 1), "loo_predicted_ms": loo,
                     "loo_error_pct": None if loo is None else 100 * (loo / point.measured_ms - 1),
                     **{f"{t}_ms": whole["terms"][t] for t in TERMS}, "fitted": point.fitted,
                     "figures": point.figures, "source": point.source, "note": point.note})
    if "rk3588" in socs:
        socs["rk3566"] = {"constants": rk3566_constants(socs["rk3588"]["constants"]), "fitted": [],
                          "points": [], "basis": "unfitted: RK3588's constants scaled (" + RK3566_ASSUMPTION + ")"}
    return socs, rows


RK3566_ASSUMPTION = ("no RK3566 board figure exists; its layer table already counts its one core's cycles; assumed "
                     "the same 1 GHz NPU clock and dispatch cost as the RK3588, half its elementwise bandwidth (32-bit "
                     "LPDDR4 against 64-bit LPDDR4x/5) and twice its CPU-side rates, CPU ops and call I/O (Cortex-A55 "
                     "at 1.8 GHz against A76 at 2.4 GHz)")


def rk3566_constants(rk3588: dict) -> dict:
    doubled = ("ms_per_elementwise_mb", "ms_per_cpu_mb", "ms_per_io_tensor", "ms_per_io_mb")
    return {**rk3588, **{name: 2 * rk3588[name] for name in doubled}}


def plot(rows: list[dict], path: Path) -> Path | None:
    """Predicted (whole fit, and leave-one-out) against measured ms, log-log, with the +-30% band."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return None
    figure, axes = pyplot.subplots(figsize=(6.5, 5.5))
    values = [r["measured_ms"] for r in rows] + [r["predicted_ms"] for r in rows]  # every point on the axes
    span = [min(values) / 1.6, max(values) * 1.6]
    axes.plot(span, span, color="grey", linewidth=1)
    axes.fill_between(span, [v * 0.7 for v in span], [v * 1.3 for v in span], color="grey", alpha=0.12,
                      label="+-30%")
    for target, marker in (("rk3588", "o"), ("rk3576", "s")):
        mine = [r for r in rows if r["target"] == target and r["fitted"]]
        axes.scatter([r["measured_ms"] for r in mine], [r["predicted_ms"] for r in mine], marker=marker,
                     label=f"{target} fit")
        apart = [r for r in rows if r["target"] == target and not r["fitted"]]
        if apart:
            axes.scatter([r["measured_ms"] for r in apart], [r["predicted_ms"] for r in apart], marker="x",
                         color="red", label=f"{target}, not a calibration point")
            for r in apart:
                axes.annotate(r["point"], (r["measured_ms"], r["predicted_ms"]), textcoords="offset points",
                              xytext=(4, 4), fontsize=7, color="red")
        loo = [r for r in mine if r["loo_predicted_ms"] is not None]
        axes.scatter([r["measured_ms"] for r in loo], [r["loo_predicted_ms"] for r in loo], marker=marker,
                     facecolors="none", edgecolors="black", label=f"{target} leave-one-out")
        for r in mine:
            axes.annotate(r["point"], (r["measured_ms"], r["predicted_ms"]), textcoords="offset points",
                          xytext=(4, -10), fontsize=7)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("measured on the board (ms per unit, spec)")
    axes.set_ylabel("predicted from the layer table (ms)")
    axes.set_title("Board-time model against the spec's board figures", fontsize=10)
    axes.grid(True, alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    return path


def report(socs: dict, rows: list[dict]) -> str:
    from rkaudio.release.package import format_table

    shown = [{**r, **{k: (None if r[k] is None else round(r[k], 1)) for k in
                      ("measured_ms", "predicted_ms", "error_pct", "loo_predicted_ms", "loo_error_pct",
                       *(f"{t}_ms" for t in TERMS))}} for r in rows]
    constants = [{"soc": soc, **{k: f"{v:.4g}" for k, v in entry["constants"].items()},
                  "fitted": ",".join(entry["fitted"]) or "-"} for soc, entry in socs.items()]
    text = ["Board-time model (rkaudio/gates/board_time.py) fitted to the spec's board figures (bench/board_time.py, "
            f"toolkit {TOOLKIT}). Terms: compute = cycles x ms_per_cycle; elementwise = RW MB of the layers the table "
            "costs at 0 cycles x ms_per_elementwise_mb; dispatch = layers x ms_per_layer; call_io = tensors x "
            "ms_per_io_tensor + fp32 I/O MB x ms_per_io_mb; cpu_ops = RW MB of the ops on the CPU x ms_per_cpu_mb. "
            "The `fitted` column names what each SoC's board data fitted; the rest are public figures (ms_per_cycle "
            "1 GHz on the RK3588, ms_per_layer 6 us: nsbb/rknn-stt) or borrowed from the other SoC (bench/board_time.py "
            "FITS says which and why). Leave-one-out refits the fitted constants without the point.", "",
            "```", format_table(shown, ["point", "target", "unit", "measured_ms", "predicted_ms", "error_pct",
                                        "loo_predicted_ms", "loo_error_pct", *(f"{t}_ms" for t in TERMS),
                                        "fitted"]), "```", "", "Constants:", "", "```",
            format_table(constants, ["soc", *Constants.__dataclass_fields__, "fitted"]), "```", "",
            "Where each board figure comes from:", ""]
    text += [f"- {r['point']}: {r['source']}." + (f" {r['note']}" if r["note"] else "") for r in rows]
    text += ["", f"RK3566: {socs['rk3566']['basis']}." if "rk3566" in socs else ""]
    return "\n".join(text) + "\n"


# the constants file's "regenerate" key (rkaudio.gates.board_time reads "socs" only)
REGENERATE = ("make bench NAME=board_time (ARGS=--refit: from the figures of bench/results/board_time.json, "
              "no build); see bench/results/board_time.md")


def write(socs: dict, rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "board_time.md").write_text(report(socs, rows))
    plot(rows, RESULTS / "board_time.png")
    CONSTANTS_FILE.write_text(json.dumps({
        "regenerate": REGENERATE,
        "socs": {soc: {"constants": entry["constants"], "basis": entry["basis"], "fitted": entry["fitted"]}
                 for soc, entry in socs.items()}}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-board-time"), metavar="DIR",
                        help="where the calibration engines are built, or found (one folder per engine)")
    parser.add_argument("--refit", action="store_true",
                        help="refit from the figures of bench/results/board_time.json, building nothing")
    options = parser.parse_args(argv)
    if options.refit:
        last = json.loads((RESULTS / "board_time.json").read_text())
        by_name = {r["point"]: r["figures"] for r in last["rows"]}
        selected = [replace(p, figures=by_name[p.name]) for p in points() if p.name in by_name]
    else:
        selected = collect(points(), options.work)
    socs, rows = evaluate(selected)
    write(socs, rows)
    return [{**row, "constants": socs[row["target"]]["constants"]} for row in rows]


if __name__ == "__main__":
    import run

    run.script(__file__)

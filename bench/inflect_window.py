"""Inflect v2 decoder window sweep (Micro and Nano shapes, random weights: cycles, traffic, memory, REGTASK lines and
CPU ops depend on the shape only; the fidelity columns are the export's own gates on these weights): per target and
window, the layer table's estimated cycles and RW traffic per emitted slice, the first window's cycles, engine /
weight / internal memory, REGTASK lines, CPU ops, the worst interior and tail SNR against a full-length fp32 decode
and the simulator on the self-check. Writes bench/results/inflect_window.{md,png} (bench/run.py writes the JSON).

No real Inflect snapshot is reachable here. The sweep's rule is the fewest predicted board ms per emitted slice
(rkaudio/gates/board_time.py) among windows with 0 REGTASK lines, 0 CPU ops and every gate passing: on rk3576 and
rk3566, where the multi-level polyphase form is needed, the recipes ship its 237 and 127; on rk3588 they ship the
spec's 256, where 512 ranks first (the recipes say so). Builds here use no stride-phase levels (the option's
default; the recipes' counts come from bench/inflect_stride_phase.py at the shipped windows). On the real weights
the export gates judge the fidelity again at build time."""
from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import _window_sweep as sweep  # bench/ is no package: run.py puts it on sys.path

from rkaudio.pipeline import pipeline
from rkaudio.engine.build import BuildOptions
from rkaudio.families import inflect
from rkaudio.families.inflect.reference import MICRO, NANO
from rkaudio.core.errors import GateFailure

TOOLKIT = "2.3.2"
CONTEXT = 32
# Per target: 256 and 512, and on the SoCs with a time field a window whose second level (64 samples per slice)
# fits it, so only the last two levels run in polyphase form: rk3566 127 (8,128 samples, the widest), rk3576 237
# (15,168; Piper's window there, where 255 logs REGTASK lines).
WINDOWS = {"rk3588": (256, 512), "rk3576": (237, 256, 512), "rk3566": (127, 256, 512)}
BASELINE = 256
RESULTS = Path(__file__).resolve().parent / "results"


def _worst(verdicts, prefix: str) -> float | None:
    values = [float(v.value) for v in verdicts if v.name.startswith(prefix)]
    return min(values) if values else None


def sweep_row(scratch: Path, official: dict, size: str, target: str, window: int) -> dict:
    out = scratch / size / target / f"w{window}"
    row = {"size": size, "target": target, "window": window, "context": CONTEXT, "emitted": window - 2 * CONTEXT}
    started = time.perf_counter()
    try:
        job = inflect.FAMILY.job(target=target, out=out,
                                 options={"window": window, "context": CONTEXT, "dec_mask": True})
        exported = inflect.export(job, official["decode"], official["duration"], say=lambda *_: None)
    except GateFailure as failure:
        return {**row, "status": f"export gate failed: {failure}"}
    verdicts = [v for record in exported for v in record.verdicts]
    options = BuildOptions(target, TOOLKIT, max_regtask_lines=10**9, fail_on_cpu_ops=False, min_simulator_snr_db=0.0)
    try:  # the export's verdicts are figures here, not gates
        (result,) = pipeline.build([replace(record, verdicts=()) for record in exported], out, options,
                                   context=f"inflect w{window}", say=lambda line: None)
    except GateFailure as failure:
        return {**row, "status": f"build gate failed: {failure}"}
    return {**row, **sweep.manifest_row(result.manifest_data, row["emitted"], target), "status": "built",
            "fp32_worst_interior_db": _worst(verdicts, "interior_snr_min"), "fp32_tail_db": _worst(verdicts, "tail_snr["),
            "build_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.families.inflect.reference import export_official
    from rkaudio.release.package import format_table

    run.parser(__file__, __doc__).parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rkaudio-inflect-window-") as scratch:
        for config in (MICRO, NANO):
            official = export_official(Path(scratch) / config.name, config, seed=0)
            rows += [sweep_row(Path(scratch), official, config.name, target, window)
                     for target, windows in WINDOWS.items() for window in windows]
    RESULTS.mkdir(parents=True, exist_ok=True)
    for config in (MICRO, NANO):
        sweep.relative_to([r for r in rows if r["size"] == config.name and r["status"] == "built"], BASELINE)
        sweep.plot([r for r in rows if r["size"] == config.name and r["status"] == "built"],
                   RESULTS / f"inflect_window_{config.name}.png",
                   f"Inflect v2 {config.name} decoder (random weights), context {CONTEXT}, toolkit {TOOLKIT}",
                   ylabel="predicted board ms per emitted slice")
    (RESULTS / "inflect_window.md").write_text(
        f"Inflect v2 decoder window sweep (bench/inflect_window.py), Micro and Nano shapes with random weights, "
        f"context {CONTEXT}, toolkit {TOOLKIT}\n\n```\n" + format_table(rows) + "\n```\n")
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

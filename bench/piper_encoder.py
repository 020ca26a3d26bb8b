"""Piper duration encoder (joe voice, banded relative attention), per token width on rk3588 / toolkit 2.3.2:
engine bytes (and bytes / N^2, which must not grow), peak RSS of the converter child during the build, build
time, estimated cycles, RW traffic, CPU ops, REGTASK lines, the export gates and the fp16 duration drift of
the simulator engine against fp32 on real phoneme chunks.

Each width runs in its own Python process (`run.in_child`, the worker `measure`) so the child RSS (getrusage of
children) belongs to that build only."""
from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

WIDTHS = (128, 192, 256, 384, 512)
TARGET, TOOLKIT = "rk3588", "2.3.2"


def measure(width: int, out: str) -> dict:
    """The per-width worker: one width exported and built into `out`, its row."""
    from rkaudio.engine.build import BuildOptions, build_engine
    from rkaudio.families.piper import FAMILY, encoder

    out = Path(out)
    voice = encoder.Voice(None)
    started = time.perf_counter()
    job = FAMILY.job("duration_encoder", target=TARGET, out=out, toolkit=TOOLKIT)
    record = encoder.export_width(job, voice, width)
    exported = time.perf_counter()
    result = build_engine(record.onnx, out, BuildOptions(TARGET, TOOLKIT, max_regtask_lines=0, fail_on_cpu_ops=True),
                          selfcheck=record.selfcheck, export_verdicts=record.verdicts)
    built = time.perf_counter()
    build_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    chunks = encoder.drift_chunks(voice, list(WIDTHS))[width]
    drifts = encoder.measure_drift(voice, record.onnx, width, TARGET, TOOLKIT, chunks)
    manifest = result.manifest_data
    figures = {v.name.split("[")[0]: v.value for v in result.verdicts}
    return {
        "width": width, "export_s": round(exported - started, 1), "build_s": round(built - exported, 1),
        "engine_bytes": manifest["rknn"]["bytes"], "bytes_per_n2": round(manifest["rknn"]["bytes"] / width**2, 1),
        "build_rss_mb": round(build_rss_mb), "est_cycles": manifest["est_cycles"], "rw_kb": manifest["rw_kb"],
        "cpu_ops": manifest["ops"]["cpu"], "regtask_lines": manifest["regtask"]["lines"],
        "rewrite_db": round(figures["relshift_rewrite_vs_raw"], 1), "padded_db": round(figures["padded_vs_exact"], 1),
        "sim_snr_db": round(min(v.value for v in result.verdicts if v.name.startswith("simulator_snr")), 1),
        "chunk_tokens": [len(c) for c in chunks], "drift_pct": [round(d, 2) for d in drifts],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    run.parser(__file__, __doc__).parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-piper-encoder-") as scratch:
        for width in WIDTHS:
            worker, row = run.in_child(measure, [width, scratch], capture_output=True, text=True)
            if worker.returncode != 0:
                raise RuntimeError(f"width {width} failed:\n{worker.stderr[-3000:]}")
            rows.append(row)
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

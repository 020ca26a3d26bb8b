"""Inflect v2 decoder engines (Micro- and Nano-shaped, random weights, rk3588, toolkit 2.3.2): engine and
weight bytes, nodes of decode.onnx / the slice before and after the fold, estimated cycles and traffic per
window, simulator SNR, the context-width table (global SNR of a 480-slice prior latent against a
full-length decode, per context) and the host walk of a ~25 s latent against one full-length decode.

Random weights decay faster over distance than trained ones, so the context table here is not the
spec's trained-model table (5.1 / 40.0 / 82.1 / 128.8 dB at 0 / 20 / 24 / 32)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

CONTEXTS = (0, 8, 16, 20, 24, 32)
UTTERANCE_SECONDS = 25.0
TARGET, TOOLKIT = "rk3588", "2.3.2"


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def main(argv: list[str] | None = None) -> list[dict]:
    import onnx

    import run
    from rkaudio.engine.build import BuildOptions, build_engine
    from rkaudio.board.inflect import InflectWindow
    from rkaudio.board.window_walk import walk
    from rkaudio.families.inflect import CONTEXT, FAMILY, WINDOW, export
    from rkaudio.families.inflect import decoder as D
    from rkaudio.families.inflect.reference import MICRO, NANO, export_official
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.core.contract import contract_of

    run.parser(__file__, __doc__).parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-inflect-") as scratch:
        for cfg in (MICRO, NANO):
            work = Path(scratch) / cfg.name
            paths = export_official(work / "official", cfg, seed=0)
            job = FAMILY.job(target=TARGET, out=work, options={"window": WINDOW, "context": CONTEXT, "dec_mask": True})
            [record], export_s = _timed(lambda: export(job, paths["decode"], paths["duration"], say=lambda *_: None))
            window = InflectWindow.of(contract_of(record.onnx))
            result, build_s = _timed(lambda: build_engine(record.onnx, work, BuildOptions(TARGET, TOOLKIT),
                                                          selfcheck=record.selfcheck, export_verdicts=record.verdicts))
            manifest = result.manifest_data
            decode = OnnxBackend(paths["decode"])
            duration = OnnxBackend(paths["duration"])
            backend = OnnxBackend(record.onnx)
            prior = D.prior_latent(duration, D.INTERIOR_LENGTH, seed=D.INTERIOR_LENGTH)
            table = D.context_table(backend, decode, prior, window, CONTEXTS)
            slices = int(UTTERANCE_SECONDS * cfg.sampling_rate / cfg.hop_length)
            long_latent = D.prior_latent(duration, slices, seed=1)
            walked, walk_s = _timed(lambda: walk(backend, long_latent, window))
            _, full_s = _timed(lambda: D.full_decode(decode, long_latent))
            row = {
                "model": cfg.name, "C": cfg.inter_channels,
                "decode_nodes": len(onnx.load(str(paths["decode"])).graph.node),
                "slice_nodes": window.nodes_before_fold, "folded_nodes": window.nodes_after_fold,
                "engine_bytes": manifest["rknn"]["bytes"], "weight_bytes": manifest["weight_bytes"],
                "est_cycles_per_window": manifest["est_cycles"], "rw_kb_per_window": manifest["rw_kb"],
                "cpu_ops": manifest["ops"]["cpu"], "regtask_lines": manifest["regtask"]["lines"],
                "sim_snr_db": min(v.value for v in result.verdicts if v.name.startswith("simulator_snr")),
                "export_s": round(export_s, 2), "build_s": round(build_s, 2),
                "utterance_slices": slices, "windows": len(walked.windows),
                "host_walk_s": round(walk_s, 2), "host_full_s": round(full_s, 2),
                "walk_over_full": round(walk_s / full_s, 2),
            }
            row.update({f"ctx{c}_snr_db": round(snr, 1) for c, snr in table.items()})
            rows.append(row)
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)

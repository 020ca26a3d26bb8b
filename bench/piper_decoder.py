"""Piper decoder engine (joe voice): engine bytes, build time, estimated NPU cycles per window per target
and decoder mask (rk3576/rk3566 engines run the last level in polyphase form); host onnxruntime time of
the windowed walk against one full-length decode of a 25 s utterance, and peak RSS; and the context table
(worst interior-window SNR against a full-length fp32 decode)."""
from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families.piper import FAMILY, decoder
from rkaudio.families.piper.voice import resolve_voice
from rkaudio.gates.walk_vs_full import WalkBesideFull
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.window_walk import walk

TARGETS = ("rk3588", "rk3576", "rk3566")
TOOLKIT = "2.3.2"
UTTERANCE_S = 25.0
CONTEXTS = (5, 8, 16, 24, 32)
EMITTED = 45
TABLE_TEXT = ("The quick brown fox jumps over the lazy dog, while five wizards box quickly. "
              "Rockchip boards speak clearly when every window sees enough context on both sides.")


def _rss_mb(who) -> float:
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux reports KiB


def engine_rows(scratch: Path) -> list[dict]:
    rows = []
    for dec_mask in (False, True):
        for target in TARGETS:
            out = scratch / f"mask{int(dec_mask)}" / target
            started = time.perf_counter()
            (export,) = decoder.export(FAMILY.job("decoder", target=target, out=out,
                                                  options={"window": 93, "context": 24, "dec_mask": dec_mask}))
            exported = time.perf_counter()
            result = build_engine(export.onnx, out,
                                  BuildOptions(target, TOOLKIT, max_regtask_lines=0, fail_on_cpu_ops=True),
                                  selfcheck=export.selfcheck, export_verdicts=export.verdicts)
            manifest = result.manifest_data
            gates = {v.name: v.value for v in result.verdicts}
            rows.append({"kind": "engine", "target": target, "dec_mask": dec_mask,
                         "polyphase": manifest["contract"].get("polyphase"), "export_s": round(exported - started, 2),
                         "build_s": round(time.perf_counter() - exported, 2), "engine_bytes": manifest["rknn"]["bytes"],
                         "est_cycles_per_window": manifest["est_cycles"], "rw_kb": manifest["rw_kb"],
                         "regtask_lines": manifest["regtask"]["lines"], "cpu_ops": gates.get("cpu_compute_ops"),
                         "simulator_snr_db": round(gates["simulator_snr[output]"], 2)})
    return rows


def walk_timing(scratch: Path) -> dict:
    voice = resolve_voice(None)
    import onnx

    piece = decoder.slice_voice(onnx.load(str(voice.onnx_path)))
    engine, contract = decoder.fixed_window_model(piece, 93, 24, False, "joe", 22050)
    slices = int(UTTERANCE_S * 22050 / piece.hop)
    z = decoder.white_noise_latent(piece.channels, slices)
    full, windowed = OnnxBackend(piece.model, threads=1), OnnxBackend(engine, threads=1)
    decoder.full_decode(full, z[:, :, :93], None)  # warm both sessions
    windowed.run({decoder.LATENT: z[:, :, :93], decoder.MASK: np.ones((1, 1, 93), np.float32)})
    started = time.perf_counter()
    decoder.full_decode(full, z, None)
    full_s = time.perf_counter() - started
    started = time.perf_counter()
    result = walk(windowed, z, contract)
    walk_s = time.perf_counter() - started
    return {"kind": "host walk", "latent_slices": slices, "windows": len(result.windows),
            "full_decode_s": round(full_s, 2), "windowed_walk_s": round(walk_s, 2),
            "walk_over_full": round(walk_s / full_s, 2), "bench_peak_rss_mb": _rss_mb(resource.RUSAGE_SELF)}


def context_rows() -> list[dict]:
    import onnx

    voice = resolve_voice(None)
    model = onnx.load(str(voice.onnx_path))
    piece = decoder.slice_voice(model)
    full = OnnxBackend(piece.model, threads=1)
    latents = [item["z"] for seed in (0, 1, 2)
               for item in decoder.voice_latents(model, piece.seam, voice.config, text=TABLE_TEXT, seed=seed)]
    noise = [decoder.white_noise_latent(piece.channels, 400, seed=seed) for seed in (0, 1)]
    cases = {"voice": [(z, decoder.full_decode(full, z, None)) for z in latents],
             "white_noise": [(z, decoder.full_decode(full, z, None)) for z in noise]}
    rows = []
    for context in CONTEXTS:
        engine, contract = decoder.fixed_window_model(piece, EMITTED + 2 * context, context, False, "joe", 22050)
        runner = OnnxBackend(engine, threads=1)
        row = {"kind": "context", "window": contract.window, "context": context, "emitted": EMITTED}
        for name, pairs in cases.items():
            snrs = []
            for z, reference in pairs:
                snrs += WalkBesideFull.run(runner, z, contract, reference).interior()
            row[f"{name}_worst_interior_db"] = round(min(snrs), 1)
            row[f"{name}_median_interior_db"] = round(float(np.median(snrs)), 1)
            row[f"{name}_interior_windows"] = len(snrs)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    run.parser(__file__, __doc__).parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-piper-decoder-") as scratch:
        return [*context_rows(), walk_timing(Path(scratch)), *engine_rows(Path(scratch))]


if __name__ == "__main__":
    import run

    run.script(__file__)

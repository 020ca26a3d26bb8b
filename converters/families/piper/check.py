"""`convert check piper`: render text through the windowed decoder and through the full voice graph."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def render_check(text: str, voice_onnx: Path | None, engine: Path | None, out: Path, window: int, context: int,
                 dec_mask: bool) -> dict:
    """Write `out` (windowed path) and `<out>.full.wav` (full voice), print SNR, per-window SNR and the
    largest sample step of both; return the figures."""
    from converters.families.piper.decoder import export, slice_voice, voice_latents
    from converters.families.piper.voice import load_voice, sample_rate
    from runtime.board.numeric import snr_db
    from runtime.host.audio import max_step, write_wav
    from runtime.host.backends import OnnxBackend
    from runtime.board.piper import VoiceDecoder
    from runtime.host.piper import engine_contract

    out = Path(out)
    voice, voice_model = load_voice(voice_onnx)
    piece = slice_voice(voice_model)
    if engine is None:
        (exported,) = export(voice.onnx_path, out.parent / f"{out.stem}_engine", window, context, dec_mask)
        engine = exported.onnx
    decoder = VoiceDecoder(OnnxBackend(engine, threads=1), engine_contract(engine), piece.channels)
    windowed, full, rows = [], [], []
    for sentence, item in enumerate(voice_latents(voice_model, piece.seam, voice.config, text=text)):
        result = decoder.decode(item["z"], item["g"])
        reference = np.asarray(item["audio"]).reshape(-1)
        test = np.asarray(result.output).reshape(-1)
        for win in result.windows:
            span = result.span(win)
            rows.append({"sentence": sentence, "window": win.index, "kind": win.kind,
                         "snr_db": snr_db(reference[span], test[span])})
        windowed.append(test)
        full.append(reference)
    windowed_audio, full_audio = np.concatenate(windowed), np.concatenate(full)
    rate = sample_rate(voice.config)
    write_wav(out, windowed_audio, rate)
    full_path = write_wav(out.with_suffix(".full.wav"), full_audio, rate)
    figures = {"snr_db": snr_db(full_audio, windowed_audio), "max_step_windowed": max_step(windowed_audio),
               "max_step_full": max_step(full_audio), "windows": rows}
    print(f"engine {engine}: {len(rows)} windows over {len(windowed)} sentence(s), {windowed_audio.size / rate:.2f} s")
    for row in rows:
        print(f"  sentence {row['sentence']} window {row['window']:2d} {row['kind']:8s} {row['snr_db']:7.1f} dB")
    print(f"SNR windowed vs full voice: {figures['snr_db']:.1f} dB")
    print(f"max sample-to-sample step: windowed {figures['max_step_windowed']:.4f}, full {figures['max_step_full']:.4f}")
    print(f"wrote {out} and {full_path}")
    _plot(rows, out.with_suffix(".png"))
    return figures


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [min(r["snr_db"], 160.0) for r in rows]
    figure, axes = plt.subplots(figsize=(8, 3))
    axes.bar(range(len(values)), values, color=["tab:blue" if r["kind"] == "interior" else "tab:gray" for r in rows])
    axes.set_xlabel("window (all sentences; blue = interior)")
    axes.set_ylabel("SNR vs full voice (dB, capped at 160)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    print(f"wrote {path}")

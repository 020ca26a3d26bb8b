"""`convert check inflect`: tokens -> duration.onnx -> noise head -> the windowed decoder, rendered through the
slice's fp32 ONNX and through the engine (onnxruntime or the toolkit simulator), beside a full-length decode.onnx
decode of the same latent; hear all three (rkaudio.host.hearing). A .rknn engine runs on the board instead
(`render_on_board`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def synthesis(duration_onnx: Path, config: Path | None):
    """(the model's InflectModel, a backend of duration.onnx)."""
    from rkaudio.board.inflect import config_beside
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.host.inflect import runtime_model

    return runtime_model(duration_onnx, config or config_beside(duration_onnx)), OnnxBackend(duration_onnx)


def full_render(decode_onnx: Path | None, latent: np.ndarray) -> np.ndarray | None:
    """decode.onnx's full-length decode of `latent` (mono), or None without `decode_onnx`."""
    if decode_onnx is None:
        return None
    from rkaudio.families.inflect.decoder import full_decode
    from rkaudio.host.backends import OnnxBackend

    return full_decode(OnnxBackend(decode_onnx), latent).reshape(-1)


def render_check(ids: list[int], duration_onnx: Path, engine: Path | None, out: Path, config: Path | None,
                 decode_onnx: Path | None, variation: float, length_scale: float, seed: int, text: str | None,
                 engines) -> dict:
    """Write `out` (the engine render), `<out>.fp32.wav` (the same walk through the slice's fp32 ONNX),
    `<out>.full.wav` (with `decode_onnx`: its full-length decode of the same latent) and `<out>.png`; print the
    engine's SNR against fp32 per window and overall and, with `text`, what a recogniser heard. The decoder is
    `engine` (a slice written by `convert inflect`) or --package's. Returns the figures."""
    from rkaudio.core.errors import SetupError
    from rkaudio.core.manifest import engine_contract
    from rkaudio.board.inflect import InflectSynth
    from rkaudio.host.hearing import Render, compare, spans_of_walk

    engine = engines.chosen_onnx(engine, "decoder", "--engine")
    if engine is None:
        raise SetupError("give the decoder: --engine (a slice written by `convert inflect --skip-rknn`, or its "
                         ".rknn on a board) or --package DIR (a package built by `convert engines`)")
    contract = engine_contract(engine)
    model, duration = synthesis(duration_onnx, config)
    fp32 = InflectSynth(duration, engines.fp32(engine), contract, model, engine.name)
    latent = fp32.latent(ids, variation, length_scale, seed)
    walked = fp32.walk(latent)
    with engines.open(engine) as backend:
        rendered = InflectSynth(None, backend, contract, model, engine.name).decode(latent)
    full = full_render(decode_onnx, latent)
    rate = model.sample_rate
    title = (f"inflect {engine.stem}, W={fp32.window.window} C={fp32.window.context}, {latent.shape[2]} latent "
             f"slices ({engines.label})")
    return compare(out, Render(walked.output.reshape(-1), rate), Render(rendered, rate), spans_of_walk(walked),
                   title=title, text=text, full=None if full is None else Render(full, rate))


def render_on_board(ids: list[int], duration_onnx: Path, engine: Path, out: Path, config: Path | None,
                    decode_onnx: Path | None, variation: float, length_scale: float, seed: int) -> None:
    """A .rknn engine with rknn-toolkit-lite2 (on a board): write `out` and, with `decode_onnx`, the full-length
    decode of the same latent beside it as `<out>.full.wav`, and the SNR between the two."""
    from rkaudio.board.inflect import InflectSynth
    from rkaudio.board.numeric import snr_db
    from rkaudio.board.speech import write_wav
    from rkaudio.host.inflect import load_engine

    model, duration = synthesis(duration_onnx, config)
    backend, contract = load_engine(engine)
    synth = InflectSynth(duration, backend, contract, model, engine.name)
    latent = synth.latent(ids, variation, length_scale, seed)
    waveform = synth.decode(latent)
    write_wav(out, waveform, model.sample_rate)
    print(f"wrote {out}: {latent.shape[2]} latent slices, {waveform.size / model.sample_rate:.2f} s")
    full = full_render(decode_onnx, latent)
    if full is not None:
        full_out = write_wav(out.with_name(out.stem + ".full.wav"), full, model.sample_rate)
        print(f"wrote {full_out}; windowed engine vs full-length decode: {snr_db(full, waveform):.1f} dB")

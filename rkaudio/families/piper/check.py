"""`convert check piper`: render text through the windowed decoder, as the fp32 ONNX and as the engine
(onnxruntime or the toolkit simulator), beside the full voice graph; hear all three (rkaudio.host.hearing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def render_check(text: str, export, engine: Path | None, out: Path, engines) -> dict:
    """Write `out` (the engine render), `<out>.fp32.wav` (the same walk through fp32), `<out>.full.wav` (the full
    voice) and `<out>.png`; print the engine's SNR against fp32 per window and overall, the windowing's own SNR
    against the full voice, the largest sample step of each, and (English voices) what a recogniser heard.
    The voice is `export`'s (a decoder job: rkaudio.pipeline.declaration.Job); the decoder is `engine` (an ONNX
    written by `convert piper`), --package's, or a fresh export of that job. Returns the figures."""
    from rkaudio.families.piper.decoder import export as export_decoder, slice_voice, voice_latents
    from rkaudio.families.piper.voice import load_voice, sample_rate
    from rkaudio.board.piper import VoiceDecoder
    from rkaudio.core.manifest import engine_contract
    from rkaudio.host.audio import max_step
    from rkaudio.host.hearing import Render, Span, compare, spans_of_walk

    out = Path(out)
    voice, voice_model = load_voice(export.source.voice_onnx)
    piece = slice_voice(voice_model)
    engine = engines.chosen_onnx(engine, "decoder", "--engine")
    if engine is None:
        print(f"exporting the decoder at window {export.options.window}, context {export.options.context} for "
              f"{engines.target} ...")
        (exported,) = export_decoder(export)
        engine = exported.onnx
    contract = engine_contract(engine)
    latents = voice_latents(voice_model, piece.seam, voice.config, text=text)
    fp32_decoder = VoiceDecoder(engines.fp32(engine), contract, piece.channels)
    fp32, rendered, full, spans = [], [], [], []
    with engines.open(engine) as backend:
        engine_decoder = VoiceDecoder(backend, contract, piece.channels)
        offset = 0
        for item in latents:
            walked = fp32_decoder.decode(item["z"], item["g"])
            fp32.append(np.asarray(walked.output).reshape(-1))
            rendered.append(np.asarray(engine_decoder.decode(item["z"], item["g"]).output).reshape(-1))
            full.append(np.asarray(item["audio"]).reshape(-1))
            spans += [Span(offset + span.start, offset + span.stop, span.kind) for span in spans_of_walk(walked)]
            offset += fp32[-1].size
    rate = sample_rate(voice.config)
    english = str(voice.config.get("language", {}).get("family", voice.config.get("espeak", {}).get("voice", "")))
    window = fp32_decoder.window
    title = f"piper {voice.onnx_path.stem}, decoder W={window.window} C={window.context} ({engines.label})"
    figures = compare(out, Render(np.concatenate(fp32), rate), Render(np.concatenate(rendered), rate), spans,
                      title=title, text=text if english.startswith("en") else None,
                      full=Render(np.concatenate(full), rate))
    figures["max_step"] = {name: max_step(np.concatenate(audio))
                           for name, audio in (("engine", rendered), ("fp32", fp32), ("full", full))}
    print("max sample-to-sample step: " + ", ".join(f"{k} {v:.4f}" for k, v in figures["max_step"].items()))
    return figures

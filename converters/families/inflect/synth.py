"""Inflect v2 text-to-waveform on the windowed decoder engine: duration.onnx (CPU) -> noise head
(CPU, its own `variation` knob) -> window walk over the engine -> waveform.

The engine is per model: its contract (latent channels, hop, window) must match the model loaded
here, otherwise the walk would feed it latents of the wrong width or stitch at the wrong hop."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from converters.families.inflect.decoder import (
    DEFAULT_VARIATION,
    DURATION_OUTPUTS,
    InflectModel,
    check_duration,
    config_values,
    noise_head,
)
from core.errors import SetupError


def runtime_model(duration_path: Path, config_path: Path | None = None) -> InflectModel:
    """Latent channels from duration.onnx, hop and sample rate from config.json (v2 defaults without it)."""
    import onnx

    duration = onnx.load(str(duration_path), load_external_data=False)
    m_p = next((v for v in duration.graph.output if v.name == DURATION_OUTPUTS[0]), None)
    if m_p is None:
        raise SetupError(f"{duration_path} has no output {DURATION_OUTPUTS[0]!r}: not an Inflect v2 duration.onnx")
    channels = m_p.type.tensor_type.shape.dim[1].dim_value
    check_duration(duration_path, channels)
    hop, rate = config_values(config_path if config_path and Path(config_path).is_file() else None)
    return InflectModel(channels, hop, rate)


def check_engine_matches(contract: dict, model: InflectModel, engine_name: str) -> None:
    """Refuse an engine compiled for another model (latent channels or hop differ)."""
    wanted = {"latent_channels": model.channels, "hop": model.hop}
    wrong = {k: contract.get(k) for k, v in wanted.items() if contract.get(k) != v}
    if wrong:
        command = contract.get("producer", {}).get("command", "convert inflect ...")
        raise SetupError(f"engine {engine_name} was compiled for {wrong} but the loaded model has "
                         f"{ {k: wanted[k] for k in wrong} }: it belongs to another Inflect model "
                         f"(Micro C=192, Nano C=128). Rebuild it for this model (it was made by: {command})")


class InflectSynth:
    """duration.onnx on the CPU, the decoder engine (any backend with `run`) over the window walk."""

    def __init__(self, duration_path: Path, backend, contract: dict, model: InflectModel, engine_name: str = "engine"):
        import onnxruntime as ort

        from runtime.window_walk import WindowContract

        check_engine_matches(contract, model, engine_name)
        self.model = model
        self.window = WindowContract.from_contract(contract)
        self.backend = backend
        self.duration = ort.InferenceSession(str(duration_path), providers=["CPUExecutionProvider"])

    def latent(self, tokens, variation: float = DEFAULT_VARIATION, length_scale: float = 1.0,
               seed: int = 0) -> np.ndarray:
        """Prior latent [1,C,N] for `tokens` (blank-interleaved ids): duration.onnx, then the noise head."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        m_p, logs_p, _ = self.duration.run(list(DURATION_OUTPUTS), {
            "tokens": tokens, "lengths": np.array([tokens.shape[1]], np.int64),
            "length_scale": np.array(length_scale, np.float32)})
        return noise_head(m_p, logs_p, variation, np.random.default_rng(seed))

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Mono float32 waveform of a finished latent, walked window by window over the engine."""
        from runtime.window_walk import walk

        return walk(self.backend, latent, self.window).output.reshape(-1)


def load_engine(path: Path):
    """(backend, contract) for a decoder engine: a slice .onnx runs in onnxruntime (contract in its
    metadata); a .rknn runs with rknn-toolkit-lite2 (contract in the manifest beside it)."""
    path = Path(path)
    if not path.is_file():
        raise SetupError(f"no engine at {path}")
    if path.suffix == ".onnx":
        from runtime.backends import OnnxBackend
        from core.contract import get_contract

        contract = get_contract(path)
        if not contract:
            raise SetupError(f"{path} carries no rkaudio contract: give the slice written by `convert inflect`")
        return OnnxBackend(path), contract
    from runtime.backends import RknnLiteBackend

    manifest = path.with_name(path.stem + ".manifest.json")
    if not manifest.is_file():
        raise SetupError(f"no manifest {manifest} beside {path}: the engine's window contract is read from it")
    return RknnLiteBackend(path), json.loads(manifest.read_text())["contract"]

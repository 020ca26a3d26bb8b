"""The windowed VITS (Piper) decoder of one voice over any backend (an engine file's contract is read on the host
by rkaudio.core.manifest.engine_contract).

A decoder engine is compiled for one latent window (rkaudio.board.vits); this walks it along a voice's latent with
the speaker embedding `g` fed to every window, after checking the engine was built for this voice."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from rkaudio.board.contract import EngineContract
from rkaudio.board.errors import SetupError
from rkaudio.board.golden import by_role, only_engine
from rkaudio.board.vits import VitsWindow
from rkaudio.board.window_walk import walk


@dataclass(frozen=True)
class PiperWindow(VitsWindow):
    """A Piper decoder engine's window: the VITS window and the voice it was compiled for."""

    voice: Optional[str] = None          # the voice's file name without .onnx (said when a voice does not fit)
    cond_input: Optional[str] = None     # the speaker-embedding input of a multi-speaker voice (None: one speaker)
    cond_channels: Optional[int] = None  # that embedding's width (None: one speaker)


class VoiceDecoder:
    """The windowed decoder for one voice over any backend; refuses an engine built for another voice."""

    def __init__(self, backend, contract: EngineContract, voice_channels: int):
        self.window = PiperWindow.of(contract)
        if self.window.latent_channels != voice_channels:
            command = (contract.producer or {}).get("command", "unknown")
            raise SetupError(
                f"engine expects a {self.window.latent_channels}-channel latent but this voice has "
                f"{voice_channels}: it was compiled for another voice ({self.window.voice or '?'}; produced by: "
                f"{command}). Rebuild it for this voice with: convert piper --voice-onnx VOICE.onnx")
        self.backend = backend

    def decode(self, z: np.ndarray, g: np.ndarray | None = None):
        """The waveform of latent `z` [1, C, N] (a `walk` result: output plus the windows it ran)."""
        cond = self.window.cond_input
        return walk(self.backend, z, self.window, {cond: g} if cond else {})


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of the Piper decoder: one voice latent `z` [1, C, N] (with the speaker embedding `g`
    of a multi-speaker voice) walked window by window through the decoder engine, as a consumer decodes an
    utterance; returns the waveform as `audio`. One engine call per window of the walk."""
    engine = only_engine(by_role(engines, "main", "decoder"))
    z = np.asarray(inputs["z"], dtype=np.float32)
    return {"audio": VoiceDecoder(engine, engine.contract, z.shape[1]).decode(z, inputs.get("g")).output}

"""The windowed VITS (Piper) decoder of one voice over any backend (an engine file's contract is read on the host
by rkaudio.host.piper.engine_contract).

A decoder engine is compiled for one latent window (rkaudio.board.window_walk); this walks it along a voice's latent
with the speaker embedding `g` fed to every window, after checking the engine was built for this voice."""
from __future__ import annotations

import numpy as np

from rkaudio.board.errors import SetupError
from rkaudio.board.golden import by_role, only_engine
from rkaudio.board.window_walk import WindowContract, walk


class VoiceDecoder:
    """The windowed decoder for one voice over any backend; refuses an engine built for another voice."""

    def __init__(self, backend, contract: dict, voice_channels: int):
        self.window = WindowContract.from_contract(contract)
        if self.window.latent_channels != voice_channels:
            command = contract.get("producer", {}).get("command", "unknown")
            raise SetupError(
                f"engine expects a {self.window.latent_channels}-channel latent but this voice has "
                f"{voice_channels}: it was compiled for another voice ({contract.get('voice', '?')}; produced by: "
                f"{command}). Rebuild it for this voice with: convert piper --voice-onnx VOICE.onnx")
        self.backend = backend
        self.cond_input = contract.get("cond_input")

    def decode(self, z: np.ndarray, g: np.ndarray | None = None):
        """The waveform of latent `z` [1, C, N] (a `walk` result: output plus the windows it ran)."""
        return walk(self.backend, z, self.window, {self.cond_input: g} if self.cond_input else {})


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of the Piper decoder: one voice latent `z` [1, C, N] (with the speaker embedding `g`
    of a multi-speaker voice) walked window by window through the decoder engine, as a consumer decodes an
    utterance; returns the waveform as `audio`. One engine call per window of the walk."""
    engine = only_engine(by_role(engines, "main", "decoder"))
    z = np.asarray(inputs["z"], dtype=np.float32)
    return {"audio": VoiceDecoder(engine, engine.contract, z.shape[1]).decode(z, inputs.get("g")).output}

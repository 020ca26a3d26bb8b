"""The speaker-embedding (g) path, on a random multi-speaker VITS exported by piper-tts's own exporter."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from rkaudio.families.piper import decoder
from rkaudio.board.numeric import snr_db
from rkaudio.gates.walk_vs_full import WalkBesideFull
from rkaudio.host.backends import OnnxBackend


def multispeaker_feeds(length: int, speaker: int, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, 20, size=(1, length)).astype(np.int64)
    return {"input": ids, "input_lengths": np.array([length], dtype=np.int64),
            "scales": np.array([0.667, 1.0, 0.8], dtype=np.float32), "sid": np.array([speaker], dtype=np.int64)}


@pytest.fixture(scope="module")
def speaker(multispeaker_onnx):
    model = onnx.load(str(multispeaker_onnx))
    piece = decoder.slice_voice(model)
    seam = piece.seam
    taps = OnnxBackend(decoder.seeded(model, 0), extra_outputs=(seam.latent, seam.mask, seam.cond), threads=1)
    latents = []
    for sid in (0, 2):
        out = taps.run(multispeaker_feeds(40, sid))
        latents.append({"z": out[seam.latent], "g": out[seam.cond], "audio": out[seam.output]})
    return piece, latents


def test_seam_finds_the_speaker_embedding(speaker):
    piece, latents = speaker
    assert piece.seam.cond is not None
    assert [i.name for i in piece.model.graph.input] == [decoder.LATENT, decoder.MASK, decoder.COND]
    assert (piece.channels, piece.cond_channels, piece.strides) == (16, 8, [4, 2])
    assert decoder.seam_verdict(OnnxBackend(piece.model, threads=1), latents).passed
    assert not np.allclose(latents[0]["g"], latents[1]["g"])


@pytest.mark.parametrize("dec_mask", [False, True])
def test_windowed_decode_with_g_matches_full_decode(speaker, dec_mask):
    piece, latents = speaker
    engine, window = decoder.fixed_window_model(piece, window=100, context=32, dec_mask=dec_mask, voice_name="ms",
                                                sample_rate=16000)
    assert (window.cond_input, window.cond_channels) == (decoder.COND, 8)
    full, windowed = OnnxBackend(piece.model, threads=1), OnnxBackend(engine, threads=1)
    z = decoder.white_noise_latent(piece.channels, 290)
    outputs = []
    for item in latents:
        compared = WalkBesideFull.run(windowed, z, window, decoder.full_decode(full, z, item["g"]),
                                      decoder.cond_feeds(item["g"]))
        verdicts = decoder.window_verdicts("ms", compared, decoder.MIN_INTERIOR_DB)
        assert verdicts and all(v.passed for v in verdicts), [v.line() for v in verdicts]
        outputs.append(compared.output)
    assert snr_db(outputs[0], outputs[1]) < 20.0  # g really conditions the decoder
    short = z[:, :, :37]
    compared = WalkBesideFull.run(windowed, short, window, decoder.full_decode(full, short, latents[0]["g"]),
                                  decoder.cond_feeds(latents[0]["g"]))
    verdict = decoder.padded_verdict("ms short", compared, dec_mask)
    assert verdict.passed, verdict.line()

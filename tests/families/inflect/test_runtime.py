"""End to end on the CPU: duration.onnx -> noise head -> windowed slice -> WAV; the runtime refuses an
engine compiled for another model."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.families.inflect.decoder import full_decode
from rkaudio.core.contract import contract_of
from rkaudio.core.errors import SetupError
from rkaudio.board.numeric import snr_db
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.inflect import InflectSynth, check_engine_matches
from rkaudio.host.inflect import load_engine, runtime_model

TOKENS = [0, 12, 0, 40, 0, 77, 0, 3, 0, 150, 0, 9, 0]


def test_synthesis_walks_the_engine_and_matches_a_full_decode(nano_official, nano_slice):
    cfg, paths = nano_official
    model = runtime_model(paths["duration"], paths["config"])
    assert (model.channels, model.hop, model.sample_rate) == (cfg.inter_channels, cfg.hop_length, cfg.sampling_rate)
    backend, contract = load_engine(nano_slice)
    synth = InflectSynth(OnnxBackend(paths["duration"]), backend, contract, model)
    latent = synth.latent(TOKENS, variation=0.667, seed=3)
    waveform = synth.decode(latent)
    assert waveform.shape == (latent.shape[2] * cfg.hop_length,)
    decode = OnnxBackend(paths["decode"])
    assert snr_db(full_decode(decode, latent).reshape(-1), waveform) >= 90.0
    # The variation knob is the runtime's own: 0 gives the prior mean, a different draw otherwise.
    assert not np.allclose(synth.latent(TOKENS, variation=0.0), latent)
    np.testing.assert_array_equal(synth.latent(TOKENS, variation=0.667, seed=3), latent)


def test_engine_of_another_model_is_refused(micro_official, nano_slice):
    contract = contract_of(nano_slice)
    micro = runtime_model(micro_official[1]["duration"], micro_official[1]["config"])
    with pytest.raises(SetupError, match=r"compiled for \{'latent_channels': 128\}.*Rebuild it"):
        InflectSynth(OnnxBackend(micro_official[1]["duration"]), None, contract, micro, "nano.rknn")
    nano_like = type(micro)(128, 128, 24000)
    with pytest.raises(SetupError, match=r"compiled for \{'hop': 256\}"):
        check_engine_matches(contract, nano_like, "nano.rknn")


def test_an_engine_without_its_contract_is_refused_in_one_line(nano_slice, tmp_path):
    """A slice stripped of its metadata, a .rknn without the manifest beside it, and a manifest that is not one."""
    import onnx

    bare = onnx.load(str(nano_slice))
    del bare.metadata_props[:]
    onnx.save(bare, str(tmp_path / "bare.onnx"))
    with pytest.raises(SetupError, match="bare.onnx carries no rkaudio contract"):
        load_engine(tmp_path / "bare.onnx")
    with pytest.raises(SetupError, match="no engine at"):
        load_engine(tmp_path / "absent.rknn")
    (tmp_path / "engine.rknn").write_bytes(b"rknn")
    with pytest.raises(SetupError, match="no manifest .*engine.manifest.json beside"):
        load_engine(tmp_path / "engine.rknn")
    (tmp_path / "engine.manifest.json").write_text("[1, 2]")
    with pytest.raises(SetupError, match="is not an engine manifest with a contract"):
        load_engine(tmp_path / "engine.rknn")

"""The family's end-to-end golden (board self-test kit): a short latent's tail window through
InflectSynth.decode, declared by the family's export, equal to the runtime's own decode over onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.engine import goldens
from rkaudio.families.inflect import GOLDEN_TAIL_SLICES, MIN_TAIL_DB
from rkaudio.families.inflect.decoder import full_decode
from rkaudio.pipeline.pipeline import Exported
from rkaudio.core.contract import contract_of
from rkaudio.core.errors import SetupError
from rkaudio.board.numeric import snr_db
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.golden import EnginePool, run_loop
from rkaudio.board.inflect import InflectModel, InflectSynth, InflectWindow
from rkaudio.host.inflect import runtime_model
from rkaudio.board.window_walk import walk


@pytest.fixture(scope="module")
def record(nano_record):
    return nano_record


@pytest.fixture(scope="module")
def recording(record):
    [recorded] = goldens.record_end_to_end([record], say=lambda *_: None)
    return recorded


def test_export_declares_the_tail_golden(record):
    assert record.end_to_end is not None and record.end_to_end.name == "inflect_tail_c128_w256.e2e.json"
    assert Exported.from_onnx(record.onnx, "inflect") == record  # an --onnx build reads it back


def test_one_padded_window_with_its_mask(recording, record):
    latent = recording.inputs["latent"]
    assert latent.shape == (1, 128, GOLDEN_TAIL_SLICES) and GOLDEN_TAIL_SLICES < 256
    [(engine, feeds, outputs)] = recording.calls
    assert engine == record.onnx.with_suffix(".rknn").name
    assert feeds["z"].shape == (1, 128, 256) and feeds["y_mask"].shape == (1, 1, 256)
    np.testing.assert_array_equal(feeds["z"][:, :, :GOLDEN_TAIL_SLICES], latent)
    assert not feeds["z"][:, :, GOLDEN_TAIL_SLICES:].any()
    np.testing.assert_array_equal(feeds["y_mask"][0, 0], (np.arange(256) < GOLDEN_TAIL_SLICES).astype(np.float32))
    assert outputs["waveform"].shape == (1, 1, 256 * 256)


def test_loop_equals_the_runtime_decode_and_a_full_decode(recording, record, nano_official):
    cfg, paths = nano_official
    latent, waveform = recording.inputs["latent"], recording.outputs["waveform"]
    contract = contract_of(record.onnx)
    synth = InflectSynth(OnnxBackend(paths["duration"]), OnnxBackend(record.onnx), contract,
                         runtime_model(paths["duration"], paths["config"]))
    np.testing.assert_array_equal(waveform, synth.decode(latent))
    np.testing.assert_array_equal(
        waveform, walk(OnnxBackend(record.onnx), latent, InflectWindow.of(contract)).output.reshape(-1))
    assert waveform.shape == (GOLDEN_TAIL_SLICES * cfg.hop_length,)
    assert snr_db(full_decode(OnnxBackend(paths["decode"]), latent).reshape(-1), waveform) >= MIN_TAIL_DB


def test_replay_makes_one_call_whatever_the_backend_returns(recording, record):
    """The board and a replay double rely on it: the recorded output gives the recorded waveform back, and
    zeros still make exactly one call."""
    spec = recording.spec
    [(engine, _, outputs)] = recording.calls
    for given in (outputs, {k: np.zeros_like(v) for k, v in outputs.items()}):
        backend = goldens.ReplayBackend([given], [{"name": n, "dtype": "float32"} for n in ("z", "y_mask")],
                                         ["waveform"])
        with EnginePool([(engine, contract_of(record.onnx))], lambda _: backend) as pool:
            replayed = run_loop(spec["loop"], pool.engines, recording.inputs, spec["params"])
        assert not backend._outputs  # the one recorded call made, none more (it would raise)
        expected = recording.outputs["waveform"] if given is outputs else np.zeros_like(recording.outputs["waveform"])
        np.testing.assert_array_equal(replayed["waveform"], expected)


def test_synth_without_duration_decodes_only(record):
    contract = contract_of(record.onnx)
    synth = InflectSynth(None, OnnxBackend(record.onnx), contract, InflectModel(128, InflectWindow.of(contract).hop,
                                                                                24000))
    with pytest.raises(SetupError, match="without duration.onnx"):
        synth.latent([0, 12, 0])

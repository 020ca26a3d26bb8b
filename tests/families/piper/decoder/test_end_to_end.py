"""The decoder's end-to-end golden: a short real sentence's latent over exactly 3 windows, run through
rkaudio.board.piper.golden_loop (the consumer's walk), recorded call by call on onnxruntime fp32."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rkaudio.engine import goldens
from rkaudio.families.piper import decoder
from rkaudio.pipeline.pipeline import Exported
from rkaudio.core.contract import contract_of
from rkaudio.core.paths import end_to_end_inputs
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.contract import EngineContract
from rkaudio.board.golden import Engine, run_loop
from rkaudio.board.piper import VoiceDecoder
from rkaudio.board.window_walk import plan_windows


@pytest.mark.slow
def test_golden_is_the_walk_over_three_windows(joe_exports):
    record = joe_exports[False]  # the default 109/45/32
    (recording,) = goldens.record_end_to_end([record])
    spec = json.loads(record.end_to_end.read_text())
    assert spec["loop"] == "rkaudio.board.piper:golden_loop" and spec["onnx"] == [record.onnx.name]
    z = recording.inputs["z"]
    assert set(recording.inputs) == {"z"} and z.shape[:2] == (1, 192)  # joe has one speaker: no g
    # the same sentence runs exactly 3 windows at this window and at the spec's 93/45/24
    assert len(plan_windows(z.shape[2], 93, 24, 45)) == 3 and len(plan_windows(z.shape[2], 109, 32, 45)) == 3
    assert [name for name, _, _ in recording.calls] == [record.onnx.with_suffix(".rknn").name] * 3
    assert [feeds["y_mask"].sum() for _, feeds, _ in recording.calls] == [109.0] * 3  # every window real
    expected = VoiceDecoder(OnnxBackend(record.onnx), contract_of(record.onnx), 192).decode(z).output
    np.testing.assert_array_equal(recording.outputs["audio"], expected)
    assert recording.outputs["audio"].size == z.shape[2] * 256


@pytest.mark.slow
def test_each_export_names_its_own_golden(joe_exports):
    """Two windows exported into one folder keep one golden each, and `--onnx` finds it again."""
    plain, masked = joe_exports[False], joe_exports[True]
    assert plain.end_to_end != masked.end_to_end and plain.onnx.parent == masked.onnx.parent
    for record in (plain, masked):
        assert Exported.from_onnx(record.onnx, "piper").end_to_end == record.end_to_end
        with np.load(end_to_end_inputs(record.end_to_end)) as data:
            assert data["z"].shape[2] == 178  # decoder.END_TO_END_TEXTS[0] on joe


@pytest.mark.slow
def test_a_window_the_sentence_does_not_fit_still_gets_three_windows(joe):
    item = decoder.end_to_end_latent(joe.model, joe.piece, joe.voice.config, joe.latents, 64, 16)
    assert len(plan_windows(item["z"].shape[2], 64, 16, 32)) == 3


def test_golden_loop_feeds_g_to_every_window(multispeaker_onnx):
    import onnx

    model = onnx.load(str(multispeaker_onnx))
    piece = decoder.slice_voice(model)
    engine_model, window = decoder.fixed_window_model(piece, window=100, context=32, dec_mask=False, voice_name="ms",
                                                      sample_rate=16000)
    contract = EngineContract(family="piper", component="decoder", role="main", fields=window.to_fields())
    backend = OnnxBackend(engine_model, threads=1)
    seen = []
    engine = Engine("ms.rknn", contract, lambda: backend, on_run=lambda e, feeds, out: seen.append(feeds))
    z = decoder.white_noise_latent(piece.channels, 150)
    g = np.random.default_rng(1).standard_normal((1, piece.cond_channels, 1)).astype(np.float32)
    outputs = run_loop("rkaudio.board.piper:golden_loop", [engine], {"z": z, "g": g}, {})
    assert len(seen) == len(plan_windows(150, window.window, window.context, window.emitted)) == 3
    assert all(np.array_equal(feeds["g"], g) for feeds in seen)
    expected = VoiceDecoder(backend, contract, piece.channels).decode(z, g).output
    np.testing.assert_array_equal(outputs["audio"], expected)


@pytest.mark.slow
@pytest.mark.parametrize("window, sentence", [(109, 0), (127, 1), (237, 2), (301, 3)])
def test_each_shipped_window_hears_a_whole_sentence_over_three_windows(joe, window, sentence):
    """The golden the board self-test transcribes is a whole sentence, with its text, at every shipped window."""
    item = decoder.end_to_end_latent(joe.model, joe.piece, joe.voice.config, joe.latents, window, 32)
    assert item["text"] == decoder.END_TO_END_TEXTS[sentence]
    assert len(plan_windows(item["z"].shape[2], window, 32, window - 64)) == 3


@pytest.mark.slow
def test_a_cut_sentence_carries_no_text(joe):
    item = decoder.end_to_end_latent(joe.model, joe.piece, joe.voice.config, joe.latents, 64, 16)
    assert item["text"] is None

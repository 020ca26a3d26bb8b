"""The fewer-pass forms of the Snake sine polynomial and the masked instance norm's variance, against
independent numpy float64 references."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rkaudio.surgery.modules.instance_norm import mask_instance_norm
from rkaudio.surgery.modules.snake import half_turn_sin2, half_turn_sin2_reference, sin2_coefficients, vertex_sin2


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


def masked_norm_reference(x, mask, weight, bias, gain, shift, eps=1e-5):
    """numpy float64: instance norm over the frames where mask is 1, its affine, the AdaIN affine, the mask."""
    real = mask[0, 0] == 1
    frames = x[..., real]
    normed = (x - frames.mean(-1, keepdims=True)) / np.sqrt(frames.var(-1, keepdims=True) + eps)
    return ((normed * weight[:, None] + bias[:, None]) * gain + shift) * mask


def test_centred_variance_norm_matches_float64():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 50)) * 3 + 1
    mask = np.zeros((1, 1, 50))
    mask[..., :37] = 1
    weight = rng.uniform(0.5, 2, 6).astype(np.float32).astype(np.float64)  # the module holds fp32 parameters
    bias = rng.standard_normal(6).astype(np.float32).astype(np.float64)
    gain, shift = rng.uniform(0.5, 2, (1, 6, 1)), rng.standard_normal((1, 6, 1))
    original = torch.nn.InstanceNorm1d(6, affine=True)
    with torch.no_grad():
        original.weight.copy_(torch.tensor(weight))
        original.bias.copy_(torch.tensor(bias))
    norm = mask_instance_norm(torch.nn.Sequential(original))[0].double()
    out = norm(*(torch.tensor(a) for a in (x, mask, gain, shift))).detach().numpy()
    np.testing.assert_allclose(out, masked_norm_reference(x, mask, weight, bias, gain, shift), atol=1e-12)
    assert np.all(out[..., 37:] == 0)

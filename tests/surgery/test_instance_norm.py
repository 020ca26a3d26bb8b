"""mask_instance_norm (the masked instance norm fused with its affine and the AdaIN gain/shift, statistics by
GlobalAveragePool, variance in the centred form) against a numpy float64 reference over the real frames, in fp32 and
in float64; the padding comes out zero."""
from __future__ import annotations

import numpy as np
import torch

from rkaudio.surgery.modules.instance_norm import mask_instance_norm


def masked_norm_reference(x, mask, weight, bias, gain, shift, eps=1e-5):
    """numpy float64: instance norm over the frames where mask is 1, its affine, the AdaIN affine, the mask."""
    real = mask[0, 0] == 1
    frames = x[..., real]
    normed = (x - frames.mean(-1, keepdims=True)) / np.sqrt(frames.var(-1, keepdims=True) + eps)
    return ((normed * weight[:, None] + bias[:, None]) * gain + shift) * mask


def test_masked_instance_norm_matches_float64():
    """The fused form (instance norm, its own affine, the AdaIN gain/shift, the mask) on the real frames only."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 50)) * 3 + 1
    mask = np.zeros((1, 1, 50))
    mask[..., :37] = 1
    weight, bias = rng.uniform(0.5, 2, 6), rng.standard_normal(6)
    gain, shift = rng.uniform(0.5, 2, (1, 6, 1)), rng.standard_normal((1, 6, 1))
    original = torch.nn.InstanceNorm1d(6, affine=True)
    with torch.no_grad():
        original.weight.copy_(torch.tensor(weight))
        original.bias.copy_(torch.tensor(bias))
    norm = mask_instance_norm(torch.nn.Sequential(original))[0]
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    out = norm(f32(x), f32(mask), f32(gain), f32(shift)).detach().double().numpy()
    expected = masked_norm_reference(x, mask, weight, bias, gain, shift)
    np.testing.assert_allclose(out[..., :37], expected[..., :37], atol=2e-5)
    assert np.all(out[..., 37:] == 0)


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

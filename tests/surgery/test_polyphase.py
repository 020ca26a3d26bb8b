"""polyphase_weights (the one ConvTranspose1d -> polyphase conv formula, used by PolyphaseUpsample and the Qwen3
step's row transposed convs) and polyphase_upsample (a module's ConvTranspose1d layers replaced by PolyphaseUpsample)
against a float64 numpy transposed convolution written from its definition."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rkaudio.surgery.modules.polyphase import polyphase_upsample, polyphase_weights


def transposed_conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """x [cin, T] -> [cout, (T-1)*stride + K]: input frame t scatters weight[:, :, k] to output t*stride + k."""
    cin, cout, kernel = weight.shape
    out = np.zeros((cout, (x.shape[1] - 1) * stride + kernel))
    for t in range(x.shape[1]):
        out[:, t * stride : t * stride + kernel] += np.einsum("i,ick->ck", x[:, t], weight)
    return out + bias[:, None]


def polyphase_apply(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, cout: int, stride: int) -> np.ndarray:
    """The polyphase conv (tap q reads frame m - (taps-1-q), zeros outside the input), phases interleaved."""
    taps = weight.shape[-1]
    zeros = np.zeros((x.shape[0], taps - 1))
    padded = np.concatenate([zeros, x, zeros], axis=1)
    frames = padded.shape[1] - taps + 1
    phases = np.stack([np.einsum("oiq,iq->o", weight, padded[:, m : m + taps]) for m in range(frames)], -1)
    phases += bias[:, None]
    return phases.reshape(stride, cout, frames).transpose(1, 2, 0).reshape(cout, frames * stride)


@pytest.mark.parametrize("cin, cout, kernel, stride, with_bias",
                         [(3, 2, 10, 5, True), (4, 3, 7, 3, True), (2, 2, 4, 4, False), (3, 1, 5, 2, True)])
def test_polyphase_weights_match_the_transposed_conv(cin, cout, kernel, stride, with_bias):
    rng = np.random.default_rng(kernel * 10 + stride)
    weight = rng.standard_normal((cin, cout, kernel))
    bias = rng.standard_normal(cout) if with_bias else None
    x = rng.standard_normal((cin, 9))
    phase_weight, phase_bias = polyphase_weights(torch.tensor(weight), None if bias is None else torch.tensor(bias),
                                                 stride)
    taps = -(-kernel // stride)
    assert tuple(phase_weight.shape) == (stride * cout, cin, taps) and tuple(phase_bias.shape) == (stride * cout,)
    bias = np.zeros(cout) if bias is None else bias
    expected = transposed_conv(x, weight, bias, stride)
    got = polyphase_apply(x, phase_weight.numpy(), phase_bias.numpy(), cout, stride)
    # The polyphase output covers whole phases: the transposed convolution is its prefix, and the rest (past
    # the last input frame's reach) is the bias alone.
    length = expected.shape[1]
    np.testing.assert_allclose(got[:, :length], expected, atol=1e-12)
    np.testing.assert_allclose(got[:, length:], np.repeat(bias[:, None], got.shape[1] - length, axis=1), atol=1e-12)


@pytest.mark.parametrize("channels_in, channels_out, kernel, stride", [(8, 4, 20, 10), (4, 3, 12, 6), (3, 2, 7, 3)])
def test_polyphase_upsample_matches_float64(channels_in, channels_out, kernel, stride):
    torch.manual_seed(2)
    transposed = torch.nn.ConvTranspose1d(channels_in, channels_out, kernel, stride)
    x = np.random.default_rng(1).standard_normal((1, channels_in, 9))
    poly = polyphase_upsample(torch.nn.Sequential(transposed))[0].double()
    assert not any(isinstance(m, torch.nn.ConvTranspose1d) for m in poly.modules())
    out = poly(torch.tensor(x)).detach().numpy()
    expected = transposed_conv(x[0], transposed.weight.detach().double().numpy(),
                               transposed.bias.detach().double().numpy(), stride)[None]
    np.testing.assert_allclose(out, expected, atol=1e-12)

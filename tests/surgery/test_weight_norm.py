"""fold_weight_norm: the plain weight it bakes in is g * v / ||v|| computed in numpy float64, and no weight_g is
left."""
from __future__ import annotations

import numpy as np
import torch

from rkaudio.surgery.modules.weight_norm import fold_weight_norm


def test_weight_norm_fold_matches_float64():
    torch.manual_seed(1)
    conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(3, 4, 5))
    g = conv.weight_g.detach().double().numpy()
    v = conv.weight_v.detach().double().numpy()
    expected = g * v / np.sqrt((v**2).sum(axis=(1, 2), keepdims=True))
    folded = fold_weight_norm(torch.nn.Sequential(conv))[0]
    assert not hasattr(folded, "weight_g")
    np.testing.assert_allclose(folded.weight.detach().double().numpy(), expected, rtol=1e-6, atol=1e-7)

"""skew_reference (what a relative-shift chain computes, in numpy) against the skew's definition, index by index,
both ways: relative slab to absolute positions and back."""
from __future__ import annotations

import numpy as np

from rkaudio.surgery.graph.relshift import skew_reference


def test_skew_reference_matches_definition():
    rng = np.random.default_rng(1)
    n = 5
    relative = rng.standard_normal((2, n, 2 * n - 1))
    absolute = skew_reference(relative, "rel_to_abs")
    weights = rng.standard_normal((2, n, n))
    back = skew_reference(weights, "abs_to_rel")
    for i in range(n):
        for j in range(n):
            assert absolute[:, i, j].tolist() == relative[:, i, j - i + n - 1].tolist()
            assert back[:, i, j - i + n - 1].tolist() == weights[:, i, j].tolist()
    assert np.count_nonzero(back) == weights.size  # every other relative slot is zero

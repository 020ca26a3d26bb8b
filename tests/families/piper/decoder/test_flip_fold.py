"""On joe: the slice holds the flow's four channel flips (negative-step Slices the NPU would run on the CPU), and
the exported decoder graphs hold none (the pass itself: tests/surgery/test_flip_fold.py)."""
from __future__ import annotations

import pytest

from rkaudio.gates import opscan


@pytest.mark.slow
def test_joe_engine_graph_has_no_flip_left(joe, joe_exports):
    import onnx

    flips = [p for p in opscan.scan(joe.piece.model) if "negative step" in p.reason]
    assert len(flips) == 4  # the unfolded slice: four flips the NPU would run on the CPU
    for export in joe_exports.values():
        assert opscan.verdict(opscan.scan(onnx.load(str(export.onnx)), "rk3588")).passed

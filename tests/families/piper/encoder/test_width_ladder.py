"""rkaudio.board.ladder.WidthLadder over stand-in backends: which width runs a chunk, padding, cropping, fallback."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.board.ladder import WidthLadder


class Recorder:
    """A fixed-width backend: cumulative sum along the last axis (so padding after the chunk cannot leak in),
    recording the widths it was fed."""

    def __init__(self, width: int | None):
        self.width, self.seen = width, []

    def run(self, feeds):
        x = feeds["x"]
        if self.width is not None:
            assert x.shape[-1] == self.width
        self.seen.append(x.shape[-1])
        return {"y": np.cumsum(x, axis=-1)}


@pytest.fixture
def ladder():
    engines = {192: Recorder(192), 128: Recorder(128), 256: Recorder(256)}
    return WidthLadder(engines, fallback=Recorder(None))


@pytest.mark.parametrize("length, width", [(1, 128), (128, 128), (129, 192), (192, 192), (193, 256), (256, 256),
                                           (257, None), (600, None)])
def test_smallest_width_that_fits(ladder, length, width):
    assert ladder.width_for(length) == width


def test_padded_run_is_cropped_to_the_chunk(ladder):
    x = np.arange(1, 141, dtype=np.float32)[None, None, :]
    out = ladder.run({"x": x}, 140)["y"]
    assert ladder.engines[192].seen == [192] and ladder.engines[128].seen == []
    np.testing.assert_array_equal(out, np.cumsum(x, axis=-1))


def test_above_the_widest_goes_to_the_fallback(ladder):
    x = np.ones((1, 2, 300), dtype=np.float32)
    out = ladder.run({"x": x}, 300)["y"]
    assert ladder.fallback.seen == [300] and all(not e.seen for e in ladder.engines.values())
    assert out.shape == (1, 2, 300)


def test_without_fallback_a_long_chunk_is_refused():
    ladder = WidthLadder({128: Recorder(128)})
    with pytest.raises(ValueError, match="exceeds the widest engine"):
        ladder.run({"x": np.ones((1, 1, 129), dtype=np.float32)}, 129)


def test_feed_length_must_match_the_chunk(ladder):
    with pytest.raises(ValueError, match="expected the chunk length"):
        ladder.run({"x": np.ones((1, 1, 10), dtype=np.float32)}, 12)

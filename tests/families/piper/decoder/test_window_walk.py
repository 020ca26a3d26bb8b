"""The window walk: tiling, context on both sides, end alignment, padding mask; exact on a local operator."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.board.contract import EngineContract
from rkaudio.board.window_walk import WindowContract, plan_windows, walk

SHAPES = [(93, 24, 45), (256, 32, 192), (128, 28, 72)]


@pytest.mark.parametrize("window,context,emitted", SHAPES)
def test_windows_tile_the_latent_with_real_context(window, context, emitted):
    for length in range(1, 3 * window + 7):
        windows = plan_windows(length, window, context, emitted)
        covered = np.concatenate([np.arange(w.emit_start, w.emit_end) for w in windows])
        assert np.array_equal(covered, np.arange(length))
        if length < window:
            assert [w.kind for w in windows] == ["padded"]
            continue
        for win in windows:
            assert 0 <= win.start and win.start + window <= length
            if win.kind == "interior":
                assert win.emit_start - win.start == context
                assert win.start + window - win.emit_end == context
                assert win.emit_end - win.emit_start == emitted
        if length > window:
            assert windows[0].kind == "first" and windows[0].emit_end == window - context
            last = windows[-1]
            assert last.kind == "last" and last.start == length - window and last.emit_end == length
            assert last.emit_start - last.start >= context


class LocalOperator:
    """A decoder stand-in with a receptive field of `radius` slices: masked moving sum, then `hop`
    samples per slice. It records the mask of every run."""

    def __init__(self, radius: int, hop: int):
        self.radius, self.hop, self.masks = radius, hop, []

    def apply(self, z, mask):
        x = z * mask
        padded = np.pad(x, ((0, 0), (0, 0), (self.radius, self.radius)))
        weights = np.arange(1, 2 * self.radius + 2, dtype=np.float64)
        summed = sum(w * padded[:, :, i : i + x.shape[2]] for i, w in enumerate(weights))
        return np.repeat(summed.sum(axis=1, keepdims=True), self.hop, axis=2) * np.repeat(mask, self.hop, axis=2)

    def run(self, feeds):
        self.masks.append(feeds["m"].copy())
        return {"y": self.apply(feeds["z"].astype(np.float64), feeds["m"])}


@pytest.mark.parametrize("window,context,emitted", SHAPES)
def test_walk_is_exact_when_context_covers_the_receptive_field(window, context, emitted):
    contract = WindowContract(window, context, emitted, hop=3, latent_input="z", output="y", mask_input="m",
                              latent_channels=2)
    rng = np.random.default_rng(1)
    for length in (window - 11, window, window + 1, 4 * window + 5):
        z = rng.standard_normal((1, 2, length)).astype(np.float32)
        operator = LocalOperator(radius=context, hop=3)
        result = walk(operator, z, contract)
        full = operator.apply(z.astype(np.float64), np.ones((1, 1, length)))
        np.testing.assert_allclose(result.output, full, rtol=1e-12, atol=1e-9)
        if length < window:  # one window, mask 1 over the real slices and 0 over the padding
            (mask,) = operator.masks
            assert mask[0, 0, :length].min() == 1 and mask[0, 0, length:].max() == 0


def test_walk_with_too_little_context_is_not_exact():
    contract = WindowContract(20, 2, 16, hop=1, latent_input="z", output="y", mask_input="m")
    z = np.random.default_rng(2).standard_normal((1, 1, 80)).astype(np.float32)
    operator = LocalOperator(radius=4, hop=1)
    result = walk(operator, z, contract)
    assert not np.allclose(result.output, operator.apply(z.astype(np.float64), np.ones((1, 1, 80))))


def test_contract_round_trip_and_errors():
    contract = WindowContract(93, 24, 45, 256, "z", "output", "y_mask", 192)
    assert WindowContract.of(EngineContract.from_json({**contract.to_fields(), "family": "piper"})) == contract
    with pytest.raises(ValueError, match="no field 'context'"):
        WindowContract.of(EngineContract.from_json({"window": 93}))
    with pytest.raises(ValueError, match="cannot hold"):
        WindowContract(93, 24, 46, 256, "z", "output")
    with pytest.raises(ValueError, match="channels"):
        walk(LocalOperator(1, 1), np.zeros((1, 3, 10), np.float32), contract)

"""How a loop finds the engines of a ladder through their typed contracts: `by_role` in ladder order (an engine
without a ladder key sorts as 0), one pool engine per shape set, a width ladder's widths (`RungWidth`) and a rung
split by depth (`DepthSplit`)."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.board.contract import EngineContract
from rkaudio.board.golden import Engine, EnginePool, by_role
from rkaudio.board.ladder import DepthSplit, golden_loop
from rkaudio.board.shapes import ShapeRefused


class Echo:
    """A backend returning its feeds under the output names."""

    def run(self, feeds):
        return {"y": feeds["x"] * 2}

    def close(self):
        pass


def engine(name: str, **json) -> Engine:
    return Engine(name, EngineContract.from_json(json), Echo)


def test_by_role_picks_role_and_component_in_ladder_order():
    engines = [engine("w128", role="main", component="enc", ladder_key=128, frames=128),
               engine("dec", role="main", component="dec"),
               engine("w64", role="main", component="enc", ladder_key=64, frames=64),
               engine("part", role="main", component="enc", ladder_key=64.01, frames=64),
               engine("first", role="first", component="enc", ladder_key=16)]
    assert [e.name for e in by_role(engines, "main", "enc")] == ["w64", "part", "w128"]
    assert [e.name for e in by_role(engines, "main")] == ["dec", "w64", "part", "w128"]  # no ladder key: 0


def test_a_pool_holds_one_engine_per_shape_set_and_each_runs_only_its_own():
    contract = EngineContract.from_json({
        "role": "main", "component": "conv", "shape_sets": [
            {"inputs": {"x": [1, 4]}, "outputs": {"y": [1, 4]}, "contract": {"role": "first", "ladder_key": 4}},
            {"inputs": {"x": [1, 8]}, "outputs": {"y": [1, 8]}, "contract": {"role": "main", "ladder_key": 8}}]})
    with EnginePool([("ladder.rknn", contract)], lambda name: Echo()) as pool:
        first, main = pool.engines
        assert (first.contract.role, first.contract.shape_set, main.contract.role, main.contract.shape_set) == \
            ("first", 0, "main", 1)
        assert by_role(pool.engines, "main") == [main]
        assert main.run({"x": np.ones((1, 8))})["y"].shape == (1, 8)
        with pytest.raises(ShapeRefused, match="through the view of set 0"):
            first.run({"x": np.ones((1, 8))})


def test_the_width_ladder_reads_each_engine_width_from_its_contract():
    engines = [engine("w4", frames=4), engine("w8", frames=8)]
    inputs = {"x@0": np.ones((1, 3)), "x@1": np.ones((1, 6))}
    outputs = golden_loop(engines, inputs, {"width_key": "frames", "axis": -1})
    assert {name: value.shape for name, value in outputs.items()} == {"y@0": (1, 3), "y@1": (1, 6)}


def test_a_rung_in_one_piece_is_part_0_of_1():
    assert (DepthSplit.of(EngineContract()).part, DepthSplit.of(EngineContract()).parts) == (0, 1)
    split = DepthSplit.of(EngineContract().with_fields(chain={"part": 1, "parts": 2}))
    assert (split.part, split.parts) == (1, 2)

"""A width ladder: fixed-width engines of one component, walked to the smallest that fits a chunk, with a
dynamic-shape fallback (onnxruntime on the CPU) above the widest.

Inputs are right-padded with zeros along one axis (the token axis) up to the chosen width; outputs are cut
back to the chunk's length along the same axis. The fallback runs the chunk unpadded. Any backend with
`run(feeds) -> outputs` works (onnxruntime, the toolkit simulator, rknnlite on a board).

Also the contract fields a ladder's engines are told apart by: a rung's width (`RungWidth`) and its place in a rung
split by depth (`DepthSplit`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from rkaudio.board.contract import ContractFields


@dataclass(frozen=True)
class RungWidth(ContractFields):
    """The width of an engine of a width ladder (the Piper encoder's, the example's)."""

    frames: int  # positions the engine is compiled for along the padded axis


@dataclass(frozen=True)
class DepthSplit(ContractFields):
    """An engine's place in a rung split by depth into a chain of engines (CosyVoice3's flow estimator)."""

    chain: Optional[Dict[str, int]] = None  # {"part": p, "parts": n}; None: the rung is one engine

    @property
    def part(self) -> int:
        return int((self.chain or {}).get("part", 0))

    @property
    def parts(self) -> int:
        return int((self.chain or {}).get("parts", 1))


class WidthLadder:
    """`engines` maps width -> backend; `fallback` takes any length (None: chunks above the widest fail)."""

    def __init__(self, engines: dict, fallback=None, axis: int = -1):
        if not engines and fallback is None:
            raise ValueError("a ladder needs at least one engine or a fallback")
        self.engines = dict(sorted(engines.items()))
        self.fallback = fallback
        self.axis = axis

    def width_for(self, length: int) -> int | None:
        """The smallest width >= length, or None when the chunk goes to the fallback."""
        for width in self.engines:
            if width >= length:
                return width
        return None

    def run(self, feeds: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
        """Run one chunk of `length` positions (every feed has exactly `length` along the axis)."""
        for name, value in feeds.items():
            if value.shape[self.axis] != length:
                raise ValueError(f"feed {name} has {value.shape[self.axis]} positions along axis {self.axis}, "
                                 f"expected the chunk length {length}")
        width = self.width_for(length)
        if width is None:
            if self.fallback is None:
                raise ValueError(f"a chunk of {length} exceeds the widest engine ({max(self.engines)}) "
                                 "and the ladder has no fallback")
            return self.fallback.run(feeds)
        padded = {name: self._pad(value, width - length) for name, value in feeds.items()}
        outputs = self.engines[width].run(padded)
        return {name: np.take(value, np.arange(length), axis=self.axis) for name, value in outputs.items()}

    def _pad(self, value: np.ndarray, extra: int) -> np.ndarray:
        pad = [(0, 0)] * value.ndim
        pad[self.axis] = (0, extra)
        return np.pad(value, pad)


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of a width ladder: chunk k's feeds are the inputs named `<input>@k`; each chunk runs
    through the smallest engine that fits it (an engine's width is its `RungWidth`, the field that the
    `params["width_key"]` every package carries names: `frames`), padding along `params["axis"]` (default -1), and
    its outputs come back as `<output>@k`."""
    ladder = WidthLadder({RungWidth.of(engine.contract).frames: engine for engine in engines},
                         axis=int(params.get("axis", -1)))
    outputs = {}
    for chunk in sorted({name.rpartition("@")[2] for name in inputs}, key=int):
        feeds = {name.rpartition("@")[0]: value for name, value in inputs.items() if name.rpartition("@")[2] == chunk}
        length = next(iter(feeds.values())).shape[ladder.axis]
        outputs.update({f"{name}@{chunk}": value for name, value in ladder.run(feeds, length).items()})
    return outputs

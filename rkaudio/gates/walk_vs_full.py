"""The walk-vs-full gate of a fixed-window decoder (the VITS window of Piper and Inflect): a latent walked window by
window over the engine graph (rkaudio.board.window_walk) beside the full-length fp32 decode of the same latent.

Both families gate the same figures, each under its own names: the worst interior window (neither first nor last:
it shows a context too short for the decoder's reach) and the whole walk (its seams, or a short latent's padded
window). Every gate is held to its level or the decoder's fp32 floor less its margin, whichever is lower
(rkaudio.gates.fp32_floor: the two sides are fp32 decodes of the same weights), and judged against the whole
full-length decode (a quiet window alone is not degenerate; a silent decode is)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkaudio.board.numeric import snr_db
from rkaudio.board.verdict import Verdict, judged
from rkaudio.board.window_walk import WalkResult, WindowContract, walk
from rkaudio.gates.fp32_floor import float64_run, floor_verdict


@dataclass(frozen=True)
class WalkBesideFull:
    """A latent's walk over a fixed-window engine graph and the full-length decode of the same latent, flat."""

    reference: np.ndarray  # the full-length fp32 decode
    walked: WalkResult     # the walk: its windows, and its output (flat in `output`)

    @classmethod
    def run(cls, backend, latent: np.ndarray, window: WindowContract, reference: np.ndarray,
            feeds: dict | None = None) -> "WalkBesideFull":
        """Walk `latent` over `backend` (the engine graph of `window`, fed `feeds` besides), beside `reference`."""
        return cls(np.asarray(reference).reshape(-1), walk(backend, latent, window, feeds))

    @property
    def output(self) -> np.ndarray:
        return np.asarray(self.walked.output).reshape(-1)

    def rows(self) -> list[dict]:
        """Per window: its index, kind, start, emitted slices and the SNR (dB) of its samples against the
        reference's."""
        return [{"index": win.index, "kind": win.kind, "start": win.start, "emit": [win.emit_start, win.emit_end],
                 "snr_db": snr_db(self.reference[self.walked.span(win)], self.output[self.walked.span(win)])}
                for win in self.walked.windows]

    def interior(self) -> list[float]:
        """The SNR (dB) of each interior window, in walk order."""
        return [row["snr_db"] for row in self.rows() if row["kind"] == "interior"]

    def global_snr(self) -> float:
        """The SNR (dB) of the whole walk against the whole reference."""
        return snr_db(self.reference, self.output)

    def gate(self, name: str, value: float, min_db: float, floor_db: float, detail: str) -> Verdict:
        """`value` (dB, one of the figures above) at least `min_db`, or `floor_db` less its margin where lower, judged
        against the whole reference."""
        return judged(floor_verdict(name, value, min_db, floor_db, detail), self.reference)


def decode_floor(model, feeds: dict, output: str, reference: np.ndarray) -> float:
    """A decoder's fp32 floor on one latent: `reference` (its output `output` in fp32 on `feeds`) against the same
    graph run in float64 (rkaudio.gates.fp32_floor.float64_run), in dB."""
    return snr_db(np.reshape(float64_run(model, feeds)[output], -1), np.reshape(reference, -1))

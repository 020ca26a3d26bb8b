"""The VITS decoder window, the window kind Piper and Inflect share: a decoder (reverse flow + HiFi-GAN) cut at the
flow's input and compiled for one latent window, which the runtime walks along the latent (rkaudio.board.window_walk).
Its contract is the walk's (`WindowContract`) and what the export made of the decoder; each family adds its own
fields in a subclass (rkaudio.board.piper.PiperWindow, rkaudio.board.inflect.InflectWindow). Written by
rkaudio.surgery.graph.vits_window. Shipped in the self-test kit: numpy and the stdlib only, Python 3.8 syntax."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from rkaudio.board.window_walk import WindowContract


# The fields past the walk's have defaults because the walk's last two do (a dataclass field without one cannot
# follow them); every VITS export writes each of them.
@dataclass(frozen=True)
class VitsWindow(WindowContract):
    """A VITS decoder compiled for one latent window: the walk's contract and what the export did to the decoder."""

    sample_rate: Optional[int] = None    # waveform samples per second
    dec_mask: bool = False               # the decoder half masked too, so a short latent's zero padding stays zero
    strides: Optional[List[int]] = None  # the stride of each upsampling level (their product is the hop)
    polyphase: Optional[int] = None      # phases the trailing levels run in (None: no level in polyphase form)
    stride_phase_levels: int = 0         # leading levels run as one Conv per stride phase and an interleave

    @classmethod
    def extended(cls, window: "VitsWindow", **own):
        """`window` as a family's window (`cls`, a subclass), with the family's own fields."""
        return cls(**{entry.name: getattr(window, entry.name) for entry in dataclasses.fields(window)}, **own)

    def to_fields(self) -> dict:
        """The walk's fields (`WindowContract.to_fields`), then every field of the VITS window and of its family's,
        a None one too: a published contract holds `polyphase` (and Piper's `cond_input`) as null."""
        walk = {entry.name for entry in dataclasses.fields(WindowContract)}
        own = [entry.name for entry in dataclasses.fields(self) if entry.name not in walk]
        return {**super().to_fields(), **{name: getattr(self, name) for name in own}}

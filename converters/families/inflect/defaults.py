"""The family's contract name and its defaults, below both the declaration (`__init__`) and the slicer
(`decoder`), so that neither imports the other to read them."""
from __future__ import annotations

FAMILY = "inflect"

# The bars (fp32, onnxruntime): a short latent's tail with the decoder-half mask, and interior windows.
MIN_TAIL_DB = 90.0
MIN_INTERIOR_DB = 120.0
WINDOW, CONTEXT = 256, 32

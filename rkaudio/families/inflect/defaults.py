"""The family's defaults, below both the declaration (`__init__`) and the slicer (`decoder`), so that neither
imports the other to read them."""
from __future__ import annotations

# The bars (fp32, onnxruntime): a short latent's tail with the decoder-half mask, and interior windows.
# Both compare two fp32 decodes of the same weights, which agree to the weights' fp32 floor (decode.onnx in fp32
# against float64) and no better: the random-weight Nano and Micro measure 131.1 and 135.3 dB windowed against
# floors of 131.2 and 135.4 dB, the official checkpoints 128.8 dB (the spec) against the 120 dB interior bar. So
# each is held to its bar, or to that floor less its margin where lower (rkaudio.gates.fp32_floor).
MIN_TAIL_DB = 90.0
MIN_INTERIOR_DB = 120.0
WINDOW, CONTEXT = 256, 32

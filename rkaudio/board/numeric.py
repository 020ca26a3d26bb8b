"""Signal comparisons every gate and the board self-test share: global SNR, max|d|, whether a reference can
judge anything at all, and JSON for figures that can be infinite. Float64 throughout. Shipped in the self-test
kit: numpy and the stdlib only, Python 3.8 syntax."""
from __future__ import annotations

import math

import numpy as np


def _pair(reference, test) -> tuple[np.ndarray, np.ndarray]:
    reference = np.asarray(reference, dtype=np.float64)
    test = np.asarray(test, dtype=np.float64)
    if reference.shape != test.shape:
        raise ValueError(f"shape mismatch: reference {reference.shape} vs test {test.shape}")
    return reference, test


def snr_db(reference, test) -> float:
    """10*log10(sum(ref^2) / sum((ref-test)^2)); +inf for an exact match, -inf if test is non-finite."""
    reference, test = _pair(reference, test)
    if not np.all(np.isfinite(test)):
        return -math.inf
    noise = float(np.sum((reference - test) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def max_abs(reference, test) -> float:
    """Largest absolute difference (inf if test is non-finite)."""
    reference, test = _pair(reference, test)
    if not np.all(np.isfinite(test)):
        return math.inf
    return float(np.max(np.abs(reference - test))) if reference.size else 0.0


SILENT_RMS_RATIO = 1e-6  # a reference quieter than this fraction of its full scale is silent
SILENT_ADVICE = "the checkpoint or the inputs make the model output {what}"
DEGENERATE_ADVICE = ("the comparison has nothing to judge: check that the checkpoint holds all its weights and "
                     "buffers (a snapshot saved without them outputs zeros) and that the inputs are real ones")


def degenerate_reference(reference, full_scale: float | None = 1.0) -> str | None:
    """Why `reference` (the whole of what a gate compares with) cannot judge anything, or None: non-finite
    values, all zeros, a constant, or an RMS below 1e-6 of `full_scale` (1.0 for audio; None skips the RMS
    rule where no full scale is known). A test matching such a reference proves nothing (0 vs 0 is "inf dB")."""
    reference = np.asarray(reference, dtype=np.float64)
    if reference.size == 0:
        return "the reference output is empty"
    if not np.all(np.isfinite(reference)):
        bad = int(np.sum(~np.isfinite(reference)))
        return f"the reference output has {bad} non-finite values (NaN/Inf): the fp32 model itself overflows"
    if not np.any(reference):
        return "the reference output is silent: " + SILENT_ADVICE.format(what="zeros")
    if np.all(reference == reference.flat[0]):
        return f"the reference output is constant ({reference.flat[0]:.6g}): " + SILENT_ADVICE.format(what="a constant")
    rms = float(np.sqrt(np.mean(reference**2)))
    if full_scale is not None and rms < SILENT_RMS_RATIO * full_scale:
        return (f"the reference output is silent (RMS {rms:.3g}, below {SILENT_RMS_RATIO:g} of full scale "
                f"{full_scale:g}): " + SILENT_ADVICE.format(what="near-zeros"))
    return None


def json_safe(value):
    """JSON has no inf/nan: write them as strings ('inf' for an exact simulator match)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value

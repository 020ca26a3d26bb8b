"""Signal comparisons: global SNR, segmental SNR, max|d|. Float64 throughout."""
from __future__ import annotations

import math

import numpy as np

from gates.verdict import Verdict, at_least, at_most


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


def segmental_snr_db(reference, test, segment: int, last_axis_only: bool = True) -> np.ndarray:
    """SNR per consecutive `segment` samples along the last axis (the last partial segment included)."""
    reference, test = _pair(reference, test)
    length = reference.shape[-1]
    starts = range(0, length, segment)
    return np.array([snr_db(reference[..., s : s + segment], test[..., s : s + segment]) for s in starts])


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


def snr_verdict(name: str, reference, test, min_db: float, detail: str = "", full_scale: float | None = 1.0) -> Verdict:
    """SNR of `test` against `reference` >= min_db; a degenerate reference (see `degenerate_reference`) fails
    with the reason instead of a figure."""
    problem = degenerate_reference(reference, full_scale)
    if problem is not None:
        return Verdict(name, math.nan, float(min_db), "dB", False, problem)
    return at_least(name, snr_db(reference, test), min_db, "dB", detail)


def max_abs_verdict(name: str, reference, test, max_allowed: float, detail: str = "") -> Verdict:
    return at_most(name, max_abs(reference, test), max_allowed, "abs", detail)

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


def snr_verdict(name: str, reference, test, min_db: float, detail: str = "") -> Verdict:
    return at_least(name, snr_db(reference, test), min_db, "dB", detail)


def max_abs_verdict(name: str, reference, test, max_allowed: float, detail: str = "") -> Verdict:
    return at_most(name, max_abs(reference, test), max_allowed, "abs", detail)

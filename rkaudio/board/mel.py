"""Whisper log-mel frontend in numpy: 16 kHz, n_fft 400, hop 160, periodic Hann, Slaney mel filters,
log10 clamped to 8 decades below the peak, scaled (x + 4) / 4."""
from __future__ import annotations

import numpy as np

from rkaudio.board.dsp import stft

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160


def _hz_to_mel(hz):
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3.0)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def _mel_to_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * (200.0 / 3.0)
    log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, linear)


def mel_filters(bins: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """[bins, n_fft // 2 + 1] triangular filters, area-normalised (Slaney), 0 Hz to Nyquist."""
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), bins + 2))
    lower = (fft_freqs[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - fft_freqs[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel(audio: np.ndarray, bins: int = 128) -> np.ndarray:
    """[bins, len(audio) // HOP] log-mel features of mono 16 kHz float audio (the last STFT frame dropped)."""
    magnitude, _ = stft(np.asarray(audio, dtype=np.float64), N_FFT, HOP)
    mel = mel_filters(bins) @ (magnitude ** 2)[:, :-1]
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)

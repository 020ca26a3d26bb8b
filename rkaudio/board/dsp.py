"""Short-time Fourier transforms in numpy, as torch computes them (periodic Hann window, centred frames with
reflect padding), shared by the log-mel frontend and the iSTFT vocoder heads so both frame audio one way."""
from __future__ import annotations

import numpy as np


def hann(n_fft: int) -> np.ndarray:
    """Periodic Hann window of `n_fft` points (torch.hann_window's default)."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)


def centred_frames(signal: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """[len/hop+1, n_fft] frames `hop` apart of the signal reflect-padded by n_fft/2: frame t centred at t*hop."""
    padded = np.pad(signal, n_fft // 2, mode="reflect")
    count = 1 + (len(padded) - n_fft) // hop
    return padded[np.arange(n_fft)[None, :] + hop * np.arange(count)[:, None]]


def stft(signal: np.ndarray, n_fft: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
    """Magnitude and phase [n_fft/2+1, len/hop+1] of the Hann-windowed centred frames, as torch.stft."""
    spectrum = np.fft.rfft(centred_frames(signal, n_fft, hop) * hann(n_fft), axis=1).T
    return np.abs(spectrum), np.angle(spectrum)


def istft(magnitude: np.ndarray, phase: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """Inverse of `stft` (overlap-add, window-square normalised, centre padding removed), as torch.istft."""
    frames = magnitude.shape[1]
    window = hann(n_fft)
    pieces = np.fft.irfft((magnitude * np.exp(1j * phase)).T, n=n_fft, axis=1) * window
    length = n_fft + hop * (frames - 1)
    out, norm = np.zeros(length), np.zeros(length)
    for i in range(frames):
        out[i * hop: i * hop + n_fft] += pieces[i]
        norm[i * hop: i * hop + n_fft] += window**2
    half = n_fft // 2
    return out[half: length - half] / np.where(norm[half: length - half] > 1e-11, norm[half: length - half], 1.0)

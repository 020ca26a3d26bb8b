"""WAV I/O for rendered audio: float waveforms in [-1, 1] to 16-bit PCM and back."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def write_wav(path: Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write mono `audio` (any shape, flattened) as 16-bit PCM, clipped to [-1, 1]."""
    import soundfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pcm = np.clip(np.asarray(audio, dtype=np.float64).reshape(-1), -1.0, 1.0)
    soundfile.write(str(path), pcm, int(sample_rate), subtype="PCM_16")
    return path


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float64 samples and the sample rate."""
    import soundfile

    audio, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    return audio[:, 0], int(rate)


def max_step(audio: np.ndarray) -> float:
    """Largest sample-to-sample jump: a seam click shows as a step far above the signal's own."""
    flat = np.asarray(audio, dtype=np.float64).reshape(-1)
    return float(np.max(np.abs(np.diff(flat)))) if flat.size > 1 else 0.0

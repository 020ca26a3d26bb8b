"""Reading rendered audio back (the writer is the board kit's, rkaudio.board.speech.write_wav, so a WAV written on
the host and one written on the board are alike), and the largest sample step of a render."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float64 samples and the sample rate."""
    import soundfile

    audio, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    return audio[:, 0], int(rate)


def max_step(audio: np.ndarray) -> float:
    """Largest sample-to-sample jump: a seam click shows as a step far above the signal's own."""
    flat = np.asarray(audio, dtype=np.float64).reshape(-1)
    return float(np.max(np.abs(np.diff(flat)))) if flat.size > 1 else 0.0

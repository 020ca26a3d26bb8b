"""Hearing a render: 16-bit WAV files, resampling to the recogniser's rate, an offline English transcript
(pocketsphinx, imported only when asked for) and the word error rate between two word sequences.

The host's `convert check` and the board self-test both judge renders with this, so a transcript on the board and
one on the host come from the same code. Shipped in the self-test kit: numpy and the stdlib only (pocketsphinx is
optional and imported lazily), Python 3.8 syntax."""
from __future__ import annotations

import re
import wave
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

RECOGNISER_RATE = 16000  # pocketsphinx's en-us acoustic model is trained on 16 kHz speech
INSTALL_HINT = ("pocketsphinx is not installed: `pip install pocketsphinx==5.1.1` (wheels for x86_64 and aarch64 "
                "CPython 3.11; other Pythons build it from source) adds the word error rate")
NOT_MEASURED = "not measured"


class RecogniserMissing(RuntimeError):
    """pocketsphinx cannot be imported here (the message says how to add it)."""


def write_wav(path, audio, sample_rate: int) -> Path:
    """Mono `audio` (any shape, flattened, clipped to [-1, 1]) as a 16-bit PCM WAV; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(pcm16(audio).tobytes())
    return path


def pcm16(audio) -> np.ndarray:
    """Float samples in [-1, 1] (clipped) as little-endian int16, rounded to the nearest step."""
    flat = np.clip(np.asarray(audio, dtype=np.float64).reshape(-1), -1.0, 1.0)
    return np.round(flat * 32767.0).astype("<i2")


def resample(audio, rate: int, new_rate: int) -> np.ndarray:
    """`audio` at `new_rate`, by zero-padding or truncating its spectrum (band-limited; exact for a periodic
    signal, and at speech bandwidths the edges are inaudible to a recogniser). Same rate: returned unchanged."""
    flat = np.asarray(audio, dtype=np.float64).reshape(-1)
    if int(rate) == int(new_rate) or flat.size == 0:
        return flat
    length = max(1, int(round(flat.size * float(new_rate) / float(rate))))
    spectrum = np.fft.rfft(flat)
    kept = min(spectrum.size, length // 2 + 1)
    resized = np.zeros(length // 2 + 1, dtype=complex)
    resized[:kept] = spectrum[:kept]
    return np.fft.irfft(resized, n=length) * (float(length) / flat.size)


def transcribe(audio, sample_rate: int) -> str:
    """pocketsphinx's en-us transcript of `audio` (lower case, its own words); RecogniserMissing without it."""
    try:
        from pocketsphinx import Decoder
    except ImportError:
        raise RecogniserMissing(INSTALL_HINT) from None
    decoder = Decoder(samprate=RECOGNISER_RATE, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(pcm16(resample(audio, sample_rate, RECOGNISER_RATE)).tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return hypothesis.hypstr.strip() if hypothesis is not None else ""


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10 ** 9, "billion"), (10 ** 6, "million"), (1000, "thousand"), (100, "hundred"))


def number_words(number: int) -> List[str]:
    """A whole number as the words a speaker reads it by (`305` -> three hundred five): how a recogniser writes
    what a synthesiser said for digits."""
    if number < 20:
        return [_ONES[number]]
    if number < 100:
        return [_TENS[number // 10]] + ([_ONES[number % 10]] if number % 10 else [])
    for scale, name in _SCALES:
        if number >= scale:
            rest = number % scale
            return number_words(number // scale) + [name] + (number_words(rest) if rest else [])
    raise AssertionError(number)


def words(text: str) -> List[str]:
    """The words of `text` as a recogniser writes them: lower case, digits read out (`3.5` -> three point five),
    hyphens and punctuation dropped, apostrophes kept (`don't`)."""
    out: List[str] = []
    for token in re.findall(r"\d+(?:\.\d+)?|[a-z]+(?:'[a-z]+)*", text.lower().replace(",", "")):
        if token[0].isdigit():
            whole, _, fraction = token.partition(".")
            out += number_words(int(whole))
            if fraction:
                out += ["point"] + [_ONES[int(digit)] for digit in fraction]
        else:
            out.append(token)
    return out


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Fewest substitutions, insertions and deletions that turn `reference` into `hypothesis` (Levenshtein)."""
    previous = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        current = [i]
        for j, other in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1]


def word_error_rate(reference: str, hypothesis: str) -> Tuple[Optional[float], int, int]:
    """(errors / reference words, errors, reference words) of two texts, normalised by `words`; the rate is None
    when the reference has no words (nothing to judge)."""
    said, heard = words(reference), words(hypothesis)
    errors = edit_distance(said, heard)
    return (errors / len(said) if said else None), errors, len(said)


def hearing(audio, sample_rate: int, text: str) -> dict:
    """What a listener made of one render: {transcript, wer, errors, words} against `text`, or
    {transcript: None, wer: None, detail: "not measured: <why>"} when pocketsphinx is missing here."""
    try:
        transcript = transcribe(audio, sample_rate)
    except RecogniserMissing as missing:
        return {"transcript": None, "wer": None, "detail": f"{NOT_MEASURED}: {missing}"}
    rate, errors, count = word_error_rate(text, transcript)
    return {"transcript": transcript, "wer": rate, "errors": errors, "words": count}

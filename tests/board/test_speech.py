"""rkaudio.board.speech: the word error rate, the words a recogniser writes for digits, the resampler the board
shares with the host, WAV files, and pocketsphinx's transcript of a real render (or one line on how to add it)."""
from __future__ import annotations

import builtins
import math
import wave

import numpy as np
import pytest

from rkaudio.board import speech
from tests.real_checkpoints import real_checkpoint


@pytest.mark.parametrize("reference, hypothesis, errors", [
    ("the quick brown fox", "the quick brown fox", 0),
    ("the quick brown fox", "the quick brown box", 1),       # a substitution
    ("the quick brown fox", "the quick fox", 1),             # a deletion
    ("the quick brown fox", "the very quick brown fox", 1),  # an insertion
    ("the quick brown fox", "", 4),
    ("", "anything", 1),
])
def test_edit_distance_counts_each_kind_of_error_once(reference, hypothesis, errors):
    assert speech.edit_distance(reference.split(), hypothesis.split()) == errors


def test_word_error_rate_normalises_case_punctuation_and_digits():
    rate, errors, words = speech.word_error_rate("Flight 370, at 9:45 -- twice!", "flight three hundred seventy at "
                                                 "nine forty five twice")
    assert (rate, errors, words) == (0.0, 0, 9)
    assert speech.word_error_rate("The quick brown fox jumps over the lazy dog, twice.",
                                  "the quick brown fox jumped over the lazy dog twice")[:2] == (0.1, 1)
    assert speech.word_error_rate("", "words")[0] is None  # nothing said: nothing to judge


@pytest.mark.parametrize("number, said", [(0, "zero"), (14, "fourteen"), (40, "forty"), (227, "two hundred twenty seven"),
                                          (3500, "three thousand five hundred"), (2_000_001, "two million one")])
def test_number_words(number, said):
    assert " ".join(speech.number_words(number)) == said
    assert speech.words("3.05") == ["three", "point", "zero", "five"]


def test_resample_keeps_a_tone_at_its_frequency_and_the_length_in_seconds():
    rate, new_rate, seconds = 22050, 16000, 0.5
    t = np.arange(int(rate * seconds)) / rate
    moved = speech.resample(np.sin(2 * np.pi * 440.0 * t), rate, new_rate)
    assert moved.size == int(new_rate * seconds)
    expected = np.sin(2 * np.pi * 440.0 * np.arange(moved.size) / new_rate)
    assert np.max(np.abs(moved - expected)) < 1e-9  # 220 whole periods: exact
    assert speech.resample(t, rate, rate) is not None and np.array_equal(speech.resample(t, rate, rate), t)


def test_write_wav_is_16_bit_mono_and_clips(tmp_path):
    path = speech.write_wav(tmp_path / "a" / "x.wav", np.array([0.0, 0.5, 2.0, -2.0]), 8000)
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 8000)
        frames = np.frombuffer(wav.readframes(4), "<i2")
    assert frames.tolist() == [0, 16384, 32767, -32767]


@pytest.fixture(scope="module")
@real_checkpoint
def fox():
    """joe saying a sentence, through the full voice graph (no engine needed to test the ear)."""
    from rkaudio.families.piper.decoder import slice_voice, voice_latents
    from rkaudio.families.piper.voice import load_voice, sample_rate

    voice, model = load_voice(None)
    (item,) = voice_latents(model, slice_voice(model).seam, voice.config, text="The quick brown fox jumps over the "
                            "lazy dog, twice.")
    return np.asarray(item["audio"]).reshape(-1), sample_rate(voice.config)


@pytest.mark.slow
def test_pocketsphinx_hears_the_voice_and_not_noise(fox):
    audio, rate = fox
    heard = speech.hearing(audio, rate, "The quick brown fox jumps over the lazy dog, twice.")
    assert heard["transcript"].startswith("the quick brown fox") and heard["wer"] <= 0.2, heard
    noise = np.random.default_rng(0).standard_normal(audio.size) * 0.1
    assert speech.hearing(noise, rate, "The quick brown fox jumps over the lazy dog, twice.")["wer"] >= 0.5


@pytest.mark.slow
def test_without_pocketsphinx_the_ear_says_how_to_add_it(fox, monkeypatch):
    real_import = builtins.__import__

    def no_pocketsphinx(name, *args, **kwargs):
        if name == "pocketsphinx":
            raise ImportError("No module named 'pocketsphinx'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pocketsphinx)
    with pytest.raises(speech.RecogniserMissing, match=r"pip install pocketsphinx==5\.1\.1"):
        speech.transcribe(fox[0], fox[1])
    heard = speech.hearing(fox[0], fox[1], "anything")
    assert heard["transcript"] is None and heard["wer"] is None
    assert heard["detail"].startswith("not measured: pocketsphinx is not installed")


@pytest.mark.slow
def test_compare_reports_every_span_and_marks_what_it_could_not_hear(fox, tmp_path, monkeypatch):
    """rkaudio.host.hearing.compare: the engine's SNR per span and overall, the files, and one line (not a crash)
    when the recogniser is missing."""
    from rkaudio.host import hearing

    audio, rate = fox[0].astype(np.float64), fox[1]
    engine = audio + np.random.default_rng(1).standard_normal(audio.size) * 1e-3
    half = audio.size // 2
    spans = [hearing.Span(0, half, "first"), hearing.Span(half, audio.size, "last")]
    lines = []
    monkeypatch.setattr(hearing, "hearing", lambda *_: {"transcript": None, "wer": None,
                                                        "detail": "not measured: pocketsphinx is not installed"})
    figures = hearing.compare(tmp_path / "fox.wav", hearing.Render(audio, rate), hearing.Render(engine, rate), spans,
                              title="fox", text="The quick brown fox", say=lines.append)
    expected = [10 * math.log10(np.sum(audio[s.start:s.stop] ** 2) / np.sum((engine - audio)[s.start:s.stop] ** 2))
                for s in spans]
    assert [row["snr_db"] for row in figures["spans"]] == pytest.approx(expected, abs=1e-9)
    assert figures["asr"] == {"detail": "not measured: pocketsphinx is not installed"}
    assert any("word error rate not measured" in line for line in lines)
    for key in ("engine", "fp32", "png"):
        assert (tmp_path / figures["files"][key]).is_file()

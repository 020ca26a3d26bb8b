"""What `convert check` shows a person: the same walk, stream or ladder rendered through the fp32 ONNX and
through the engine (onnxruntime or the toolkit simulator), written as WAVs (or, for a mel, an .npy), a PNG of
both spectrograms and their difference with the SNR of every window under them and the window joins marked,
the figures printed, and, for English speech, what a recogniser heard (rkaudio.board.speech).

A family's check computes the two renders and the windows it ran; `compare` does the rest, so every family's
check reports alike."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rkaudio.board.numeric import max_abs, snr_db
from rkaudio.board.speech import hearing, word_error_rate, write_wav

SNR_PLOT_CAP_DB = 160.0  # an exact window reads +inf dB; the bar is drawn at this height


@dataclass(frozen=True)
class Span:
    """The part of a render one engine call produced: [start, stop) along the time axis (samples for audio,
    frames for a mel), and what kind of call it was (first / interior / last / padded, a stream step, a rung);
    or, where every call covers the whole render (an ODE over one rung), a part the family names (prompt,
    generated)."""

    start: int
    stop: int
    kind: str


@dataclass(frozen=True)
class Render:
    """One rendered signal: 1-D audio at `rate` samples per second, or a 2-D feature map [bins, frames] (a mel)
    whose time axis is `rate` frames per second."""

    signal: np.ndarray
    rate: float

    @property
    def is_audio(self) -> bool:
        return np.asarray(self.signal).ndim == 1


def spans_of_walk(result) -> list[Span]:
    """The spans of a rkaudio.board.window_walk.WalkResult (one per window, in output samples)."""
    return [Span(result.span(win).start, result.span(win).stop, win.kind) for win in result.windows]


def per_span_snr(fp32: np.ndarray, engine: np.ndarray, spans: list[Span]) -> list[dict]:
    """{start, stop, kind, snr_db, max_abs} of the engine render against the fp32 render, span by span."""
    rows = []
    for span in spans:
        reference, test = fp32[..., span.start:span.stop], engine[..., span.start:span.stop]
        rows.append({"start": span.start, "stop": span.stop, "kind": span.kind, "snr_db": snr_db(reference, test),
                     "max_abs": max_abs(reference, test)})
    return rows


def log_spectrogram(render: Render, bins: int = 512) -> tuple[np.ndarray, float]:
    """(dB magnitude [bins, frames], frames per second): an STFT of audio (Hann window, 1/4 overlap-hop) or the
    feature map itself for a mel (its values taken as they are)."""
    signal = np.asarray(render.signal, dtype=np.float64)
    if not render.is_audio:
        return signal, render.rate
    hop = bins // 4
    padded = np.pad(signal, (bins // 2, bins // 2 + bins))
    frames = 1 + (padded.size - bins) // hop
    stacked = np.stack([padded[i * hop:i * hop + bins] for i in range(frames)], axis=1) * np.hanning(bins)[:, None]
    magnitude = np.abs(np.fft.rfft(stacked, axis=0))
    return 20.0 * np.log10(np.maximum(magnitude, 1e-6)), render.rate / hop


def plot(path: Path, fp32: Render, engine: Render, rows: list[dict], title: str) -> Path:
    """The PNG: the fp32 and engine spectrograms and their difference on one colour scale each, then the SNR of
    every span as a bar over its time range; dashed lines where spans join."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference, per_second = log_spectrogram(fp32)
    test, _ = log_spectrogram(engine)
    difference = np.asarray(engine.signal, np.float64) - np.asarray(fp32.signal, np.float64)
    noise, _ = log_spectrogram(Render(difference, engine.rate))
    top = float(np.max(reference))
    scale = dict(vmin=top - 90.0, vmax=top) if fp32.is_audio else dict(vmin=float(reference.min()), vmax=top)
    # STFT column i is centred on sample i * hop (log_spectrogram pads half a window in front) and the padding
    # adds columns past the end: draw each column over its centre and end the axes with the signal, so the
    # spectrograms line up with the SNR bars (a short render is visibly stretched otherwise).
    shift = 0.5 / per_second if fp32.is_audio else 0.0
    extent = (-shift, reference.shape[1] / per_second - shift, 0.0,
              fp32.rate / 2.0 if fp32.is_audio else float(reference.shape[0]))
    # The colour bars get a column of their own (empty beside the SNR bars), so the four panels are one width and
    # a join drawn at one time lines up from top to bottom.
    figure, grid = plt.subplots(4, 2, figsize=(11, 10),
                                gridspec_kw={"height_ratios": [3, 3, 3, 2], "width_ratios": [80, 1]})
    axes = grid[:, 0]
    grid[3, 1].axis("off")
    panels = [(reference, "fp32 render", scale), (test, "engine render", scale),
              (noise, "engine - fp32", scale if fp32.is_audio else {})]
    for ax, bar, (image, label, limits) in zip(axes, grid[:3, 1], panels):
        ax.sharex(axes[3])
        ax.tick_params(labelbottom=False)
        shown = ax.imshow(image, origin="lower", aspect="auto", extent=extent, cmap="magma", **limits)
        ax.set_ylabel("Hz" if fp32.is_audio else "bin")
        ax.set_title(label, fontsize=9, loc="left")
        figure.colorbar(shown, cax=bar, label="dB" if fp32.is_audio else "value")
    to_seconds = 1.0 / fp32.rate
    for row in rows:
        left, width = row["start"] * to_seconds, (row["stop"] - row["start"]) * to_seconds
        value = row["snr_db"]
        height = SNR_PLOT_CAP_DB if value == math.inf else max(value, 0.0) if math.isfinite(value) else 0.0
        axes[3].bar(left, height, width=width, align="edge", edgecolor="white",
                    color="tab:blue" if row["kind"] == "interior" else "tab:gray")
        axes[3].text(left + width / 2, height, f"{value:.0f}", ha="center", va="bottom", fontsize=7)
    for ax in axes:
        for row in rows[1:]:
            ax.axvline(row["start"] * to_seconds, color="white" if ax is not axes[3] else "black",
                       linestyle="--", linewidth=0.7, alpha=0.8)
    axes[3].set_xlim(0.0, np.asarray(fp32.signal).shape[-1] / fp32.rate)
    axes[3].set_ylabel("SNR dB")
    axes[3].set_xlabel("seconds (dashed: where spans join; blue: interior windows)")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return Path(path)


def _write(path: Path, render: Render) -> Path:
    """Audio as a 16-bit WAV; a feature map as an .npy beside it."""
    if render.is_audio:
        return write_wav(path, render.signal, int(round(render.rate)))
    path = Path(path).with_suffix(".npy")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.asarray(render.signal, np.float32))
    return path


def compare(out: Path, fp32: Render, engine: Render, spans: list[Span], *, title: str, text: str | None = None,
            full: Render | None = None, apart_from_full: str = "the windowing alone",
            say: Callable[[str], None] = print) -> dict:
    """Write `<out>` (the engine render), `<stem>.fp32.wav` (the same walk through the fp32 ONNX), `<stem>.full.wav`
    (a full-length reference, when given) and `<stem>.png`; print the engine render's SNR against the fp32 render
    per span and overall, the fp32 render's against `full` (`apart_from_full` says what sets them apart), and, when `text` is given (English speech), each render's word error rate against it
    and the engine's against the fp32 render's transcript. Returns every figure (JSON-ready but for infinities)."""
    out = Path(out)
    reference = np.asarray(fp32.signal, np.float64)
    test = np.asarray(engine.signal, np.float64).reshape(reference.shape)
    rows = per_span_snr(reference, test, spans)
    figures = {"snr_db": snr_db(reference, test), "max_abs": max_abs(reference, test), "spans": rows,
               "files": {"engine": str(_write(out, engine)),
                         "fp32": str(_write(out.with_name(out.stem + ".fp32" + out.suffix), fp32))}}
    if full is not None:
        full_signal = np.asarray(full.signal, np.float64).reshape(reference.shape)
        figures["fp32_vs_full_snr_db"] = snr_db(full_signal, reference)
        figures["files"]["full"] = str(_write(out.with_name(out.stem + ".full" + out.suffix), full))
    figures["files"]["png"] = str(plot(out.with_suffix(".png"), fp32, engine, rows, title))
    say(f"{title}: {len(rows)} span(s), {reference.shape[-1] / fp32.rate:.2f} s")
    for number, row in enumerate(rows):
        say(f"  span {number:3d} {row['kind']:9s} [{row['start']}, {row['stop']})  engine vs fp32 "
            f"{row['snr_db']:7.1f} dB  max|d| {row['max_abs']:.3g}")
    say(f"engine render vs fp32 render: {figures['snr_db']:.1f} dB overall, max|d| {figures['max_abs']:.3g}")
    if full is not None:
        say(f"fp32 render vs full-length reference ({apart_from_full}): {figures['fp32_vs_full_snr_db']:.1f} dB")
    if text is not None:
        figures["asr"] = listen(text, {"fp32": fp32, "engine": engine, **({"full": full} if full else {})}, say)
    for path in figures["files"].values():
        say(f"wrote {path}")
    return figures


def listen(text: str, renders: dict, say: Callable[[str], None] = print) -> dict:
    """Each render's transcript and word error rate against `text`, and the engine render's against the fp32
    render's transcript (how much the engine alone changes what is heard). Without pocketsphinx: one line on how
    to add it, and {"detail": "not measured: ..."}."""
    heard = {name: hearing(render.signal, int(round(render.rate)), text) for name, render in renders.items()}
    if any(h["transcript"] is None for h in heard.values()):
        detail = next(h["detail"] for h in heard.values() if h["transcript"] is None)
        say(f"word error rate {detail}")
        return {"detail": detail}
    for name, item in heard.items():
        say(f"heard ({name}): {item['transcript']!r}  WER vs text {item['wer']:.1%} "
            f"({item['errors']}/{item['words']})")
    rate, errors, count = word_error_rate(heard["fp32"]["transcript"], heard["engine"]["transcript"])
    heard["engine_vs_fp32"] = {"wer": rate, "errors": errors, "words": count}
    say(f"engine render vs fp32 render's transcript: WER "
        + (f"{rate:.1%} ({errors}/{count})" if rate is not None else "- (the fp32 render was heard as nothing)"))
    return heard

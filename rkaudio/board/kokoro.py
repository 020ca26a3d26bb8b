"""Kokoro generator over a fixed-window engine, with the CPU parts around it in numpy.

The engine maps one window of W latent frames (x [1,512,W], har [1,22,60W+1], style, masks at the coarse 10W and
fine 60W+1 rates) to spec_phase [1,22,60W+1]; a row-form engine (contract `fine_rows`, `fine_row_length`) takes
har and mask_fine and gives spec_phase as rows [1, C, R, L] of that fine axis, zero past its end. Around it, on the CPU: the harmonic-plus-noise source (F0 ->
sine harmonics -> linear + tanh), its STFT (`har` = magnitude and phase), and the iSTFT head (exp of the
log-magnitude rows, sin of the phase rows). The windows come from `rkaudio.board.window_walk.plan_windows` (context
frames each side, emitted frames per step, the last window aligned to the end, a short utterance one padded
window). Two parameters of the exec plan:
- `overlap` (frames): the walk advances by emitted - overlap and the shared columns are blended with a raised
  cosine (a seam knob);
- `gain`: each window's log-magnitude is shifted so its loudness matches a full-length CPU decode of the same
  frames, and the top five log-magnitude rows (near Nyquist) are capped at that decode's level per column (the
  NPU's fp16 accumulation leaves content-locked clicks there).

`golden_loop` is the board self-test kit's end-to-end golden (rkaudio/board/golden.py): `walk`, then the iSTFT head."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from rkaudio.board.contract import ContractFields, EngineContract
from rkaudio.board.dsp import istft
from rkaudio.board.golden import only_engine
from rkaudio.board.window_walk import WindowContract, WindowSpan, plan_windows

NYQUIST_ROWS = 5  # top log-magnitude rows capped by `gain`


@dataclass(frozen=True)
class SourceParams:
    """Kokoro's SourceModuleHnNSF: 8 harmonics over F0, voiced above 10 Hz, and its Linear(9, 1) weights."""

    linear_weight: np.ndarray  # [1, harmonics+1]
    linear_bias: np.ndarray  # [1]
    sample_rate: int = 24000
    samples_per_frame: int = 300
    sine_amp: float = 0.1
    noise_std: float = 0.003
    voiced_threshold: float = 10.0

    @property
    def harmonics(self) -> int:
        return self.linear_weight.shape[-1]


def _linear_resample(values: np.ndarray, factor: float) -> np.ndarray:
    """torch's `interpolate(mode="linear", align_corners=False, scale_factor=factor)` along the first axis."""
    length = int(np.floor(values.shape[0] * factor))
    position = np.clip((np.arange(length) + 0.5) / factor - 0.5, 0, values.shape[0] - 1)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, values.shape[0] - 1)
    frac = (position - low)[:, None]
    return values[low] * (1 - frac) + values[high] * frac


def source_signal(f0: np.ndarray, params: SourceParams, noise: np.ndarray) -> np.ndarray:
    """The merged source [samples] for per-frame F0 [frames]; `noise` [samples, harmonics] is standard normal.

    Phase is accumulated at the frame rate and linearly interpolated to samples, as in kokoro's SineGen."""
    up = params.samples_per_frame
    f0_samples = np.repeat(np.asarray(f0, np.float64), up)[:, None]  # nearest upsampling
    harmonics = f0_samples * np.arange(1, params.harmonics + 1)[None, :]
    turns = (harmonics / params.sample_rate) % 1
    phase = np.cumsum(_linear_resample(turns, 1 / up), axis=0) * 2 * np.pi
    sines = np.sin(_linear_resample(phase * up, up)) * params.sine_amp
    voiced = (f0_samples > params.voiced_threshold).astype(np.float64)
    noise_amp = voiced * params.noise_std + (1 - voiced) * params.sine_amp / 3
    waves = sines * voiced + noise_amp * noise
    return np.tanh(waves @ params.linear_weight.T.astype(np.float64) + params.linear_bias)[:, 0]


def spec_phase_to_audio(spec_phase: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """The iSTFT head: exp of the log-magnitude rows, sin of the phase rows (kokoro's Generator tail)."""
    bins = n_fft // 2 + 1
    values = np.asarray(spec_phase, np.float64)[0]
    return istft(np.exp(values[:bins]), np.sin(values[bins:]), n_fft, hop)


ROW_FIELDS = ("fine_rows", "fine_row_length", "row_samples_limit")  # KokoroFields a row-form engine alone has


@dataclass(frozen=True)
class KokoroFields(ContractFields):
    """The generator engine's own contract fields, beside its window (`WindowContract`: window, context,
    emitted, hop = fine columns per latent frame, the input and output names)."""

    inputs: List[str]  # the engine's inputs, in their order (x, har, style, mask_coarse, mask_fine)
    coarse_length: int  # coarse columns of one window (10 per latent frame)
    fine_length: int  # fine samples of one window (60 per latent frame, and one)
    sample_rate: int  # audio samples per second of the iSTFT head's output
    n_fft: int  # FFT size of the iSTFT head (spec_phase holds n_fft/2 + 1 log-magnitude rows, then the phases)
    istft_hop: int  # audio samples per fine column of the iSTFT head
    sine_form: str  # the Snake sine in the graph (one of rkaudio.surgery.modules.snake.SINE_FORMS)
    snake_fold: bool  # Snake's alpha folded into the AdaIN affine and the next conv
    source: str  # where the generator's weights came from
    fine_layout: str = "plain"  # the fine stage on one axis ("plain"; engines before the row form) or on "rows"
    fine_rows: Optional[int] = None  # row form (rkaudio/families/kokoro/rows.py): rows of the fine axis
    fine_row_length: Optional[int] = None  # row form: samples per row, zero past the window's 60W+1
    row_samples_limit: Optional[int] = None  # row form: the most samples a row may take (its register field)

    def to_fields(self) -> dict:
        """The fields an exporter stores: the row form's only for a row-form engine."""
        return {name: value for name, value in super().to_fields().items()
                if value is not None or name not in ROW_FIELDS}


@dataclass(frozen=True)
class KokoroWindow(WindowSpan):
    """How `walk` runs a generator engine: its window, the fine and coarse rates around it, the iSTFT head's FFT
    size, its row form and the exec-plan params."""

    hop: int  # fine columns per latent frame (60)
    coarse_hop: int  # coarse columns per latent frame (10)
    n_fft: int
    overlap: int = 0
    gain: bool = False
    fine_rows: int = 0  # row form (rkaudio/families/kokoro/rows.py): har, mask_fine and spec_phase as rows
    fine_row_length: int = 0  # [1, C, fine_rows, fine_row_length], zero past the window's 60W+1 samples

    @classmethod
    def from_contract(cls, contract: EngineContract, params: dict | None = None) -> "KokoroWindow":
        """The engine's window and rates (`WindowContract`, `KokoroFields`) and its exec params (`params` over the
        contract's own); ValueError for an overlap the window cannot blend."""
        window, fields = WindowContract.of(contract), KokoroFields.of(contract)
        params = {**(contract.exec_params or {}), **(params or {})}
        layout = cls(window.window, window.context, window.emitted, window.hop, fields.coarse_length // window.window,
                     fields.n_fft, int(params.get("overlap", 0)), bool(params.get("gain", False)),
                     fields.fine_rows or 0, fields.fine_row_length or 0)
        widest = min(layout.context, layout.emitted - 1)
        if not 0 <= layout.overlap <= widest:
            raise ValueError(f"params.overlap must be an integer in [0, {widest}] for this engine (context "
                             f"{layout.context}, emitted {layout.emitted}), got {layout.overlap}")
        return layout

    def plan(self, frames: int) -> list:
        """The windows (rkaudio.board.window_walk.Window) `walk` runs over an utterance of `frames` latent
        frames: it advances by emitted - overlap."""
        return plan_windows(frames, self.window, self.context, self.emitted - self.overlap)


def to_rows(array: np.ndarray, rows: int, length: int) -> np.ndarray:
    """[..., T] -> [..., rows, length]: the signal cut into rows, zero past its end (the row form's inputs)."""
    array = np.asarray(array)
    if array.shape[-1] > rows * length:
        raise ValueError(f"{array.shape[-1]} samples do not fit {rows} rows of {length}")
    padded = np.zeros(array.shape[:-1] + (rows * length,), array.dtype)
    padded[..., : array.shape[-1]] = array
    return padded.reshape(array.shape[:-1] + (rows, length))


def from_rows(array: np.ndarray, columns: int) -> np.ndarray:
    """[1, C, rows, length] -> [1, C, columns] (the row form's output back on one axis); a 3-D array as is."""
    array = np.asarray(array)
    if array.ndim == 3:
        return array
    return array.reshape(array.shape[:-2] + (-1,))[..., :columns]


def row_feeds(feeds: dict, layout) -> dict:
    """Plain window feeds (har, mask_fine on one fine axis) in the engine's row form when it has one."""
    if not layout.fine_rows or np.asarray(feeds["har"]).ndim == 4:
        return feeds
    return {**feeds, **{name: to_rows(feeds[name], layout.fine_rows, layout.fine_row_length)
                        for name in ("har", "mask_fine")}}


def window_feeds(x, har, style, start: int, layout: KokoroWindow) -> dict:
    """Inputs of the window starting at latent frame `start`; frames past the utterance are zero, mask 0
    (har and mask_fine as rows for a row-form engine)."""
    frames, w = x.shape[-1], layout.window
    real = min(w, frames - start)
    fine = layout.hop * w + 1
    x_win = np.zeros((1, x.shape[1], w), np.float32)
    x_win[..., :real] = x[..., start: start + real]
    har_win = np.zeros((1, har.shape[1], fine), np.float32)
    har_win[..., : layout.hop * real + 1] = har[..., layout.hop * start: layout.hop * (start + real) + 1]
    mask_coarse = np.zeros((1, 1, layout.coarse_hop * w), np.float32)
    mask_coarse[..., : layout.coarse_hop * real] = 1
    mask_fine = np.zeros((1, 1, fine), np.float32)
    mask_fine[..., : layout.hop * real + 1] = 1
    return row_feeds({"x": x_win, "har": har_win, "style": np.asarray(style, np.float32),
                      "mask_coarse": mask_coarse, "mask_fine": mask_fine}, layout)


def _raised_cosine(columns: int) -> np.ndarray:
    """Weights of the earlier window over `columns` shared columns, 1 -> 0 (the later one gets 1 - w)."""
    return 0.5 * (1 + np.cos(np.pi * (np.arange(columns) + 0.5) / columns))


def apply_gain(window_out: np.ndarray, reference: np.ndarray, bins: int) -> np.ndarray:
    """Shift the log-magnitude rows so the window's magnitude RMS matches `reference` over the same columns,
    then cap the top NYQUIST_ROWS log-magnitude rows at the reference's level column by column."""
    out = np.array(window_out, np.float64)
    ours, theirs = out[:, :bins], np.asarray(reference, np.float64)[:, :bins]
    shift = 0.5 * (np.log(np.mean(np.exp(2 * theirs))) - np.log(np.mean(np.exp(2 * ours))))
    out[:, :bins] += shift
    top = slice(bins - NYQUIST_ROWS, bins)
    out[:, top] = np.minimum(out[:, top], theirs[:, top])
    return out


def walk(backend, x: np.ndarray, har: np.ndarray, style: np.ndarray, layout: KokoroWindow,
         full_decode=None) -> np.ndarray:
    """spec_phase [1, 22, 60N+1] of an utterance of N latent frames, window by window through `backend.run`.

    `full_decode(x, har, style) -> spec_phase` (a full-length CPU decode) is required when `layout.gain` is set."""
    if layout.gain and full_decode is None:
        raise ValueError("params.gain needs a full-length CPU decode of the utterance (full_decode)")
    frames = x.shape[-1]
    bins = layout.n_fft // 2 + 1
    reference = full_decode(x, har, style) if layout.gain else None
    windows = layout.plan(frames)
    out = np.zeros((1, har.shape[1], layout.hop * frames + 1))
    weight = np.zeros(out.shape[-1])
    shared = 0  # columns the previous window emitted past this window's emit_start
    for i, win in enumerate(windows):
        spec = np.asarray(backend.run(window_feeds(x, har, style, win.start, layout))["spec_phase"], np.float64)
        spec = from_rows(spec, layout.hop * layout.window + 1)
        last = i == len(windows) - 1
        tail = 0 if last else min(layout.overlap, frames - win.emit_end)
        lo = layout.hop * win.emit_start
        hi = layout.hop * (win.emit_end + tail) + (1 if last else 0)
        piece = spec[..., lo - layout.hop * win.start: hi - layout.hop * win.start]
        if reference is not None:
            piece = apply_gain(piece, reference[..., lo:hi], bins)
        blend = np.ones(hi - lo)
        if shared:  # rising edge where the previous window's falling tail lies
            blend[:shared] = 1 - _raised_cosine(shared)
        shared = layout.hop * tail
        if tail:
            blend[hi - lo - shared:] = _raised_cosine(shared)
        out[..., lo:hi] += piece * blend
        weight[lo:hi] += blend
    return (out / weight).astype(np.float32)


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of the Kokoro generator: the utterance's `x`, `har` and `style` walked through the one
    engine (`walk`, at the contract's window with `params` over its exec params), then the iSTFT head:
    {"audio": float32 samples}. One engine call per window whatever the engine returns. `gain` needs a
    full-length CPU decode, which a board loop does not have: the golden runs with it off."""
    engine = only_engine(engines)
    layout = KokoroWindow.from_contract(engine.contract, params)
    if layout.gain:
        raise ValueError("the kokoro golden runs with params.gain off: gain needs a full-length CPU decode")
    spec_phase = walk(engine, inputs["x"], inputs["har"], inputs["style"], layout)
    audio = spec_phase_to_audio(spec_phase, layout.n_fft, KokoroFields.of(engine.contract).istft_hop)
    return {"audio": audio.astype(np.float32)}

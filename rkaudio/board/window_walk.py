"""Walk a latent of any length over an engine compiled for one fixed window.

RKNN has no dynamic shapes, so a decoder is compiled for `window` latent slices and the runtime
slides it along the latent. Each step decodes `window` slices and keeps `emitted` of them, with
`context` real slices on each side so the receptive field sees the same neighbours a full-length
decode sees. The first window starts at the latent's start (as the full decode does), the window
that reaches the end moves left so it ends exactly at the latent's end (extending its left
context), and a latent shorter than the window is one zero-padded window whose mask is 0 over the
padding (a padded slice marked 1 leaks its conv biases into the real slices).

The walk knows nothing about models: it runs any backend with `run(feeds) -> outputs` and reads
its window contract (window/context/emitted/hop/input names, the latent's time axis) from the engine contract's
fields. The output is walked along its last axis (time-last, as every vocoder here writes it)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkaudio.board.contract import ContractFields
from rkaudio.board.golden import by_role, only_engine


@dataclass(frozen=True)
class Window:
    """One engine run: it decodes latent slices [start, start+window) and keeps [emit_start, emit_end)."""

    index: int
    start: int
    emit_start: int
    emit_end: int
    kind: str  # "first", "interior", "last" (reaches the end) or "padded" (latent shorter than the window)

    @property
    def has_seam(self) -> bool:
        return self.kind != "padded"


@dataclass(frozen=True)
class WindowSpan(ContractFields):
    """The latent frames one engine run decodes (`window`), keeps (`emitted`) and reads around them (`context`).
    What `emitted` is depends on the window's role: `two_sided` (a decoder window walked with context on both
    sides: Piper, Inflect, Kokoro) or `left_context` (a causal step that reads only past frames: Qwen3's window
    role). The contract stores `emitted` too, so a kit reads it without knowing the role."""

    window: int
    context: int
    emitted: int

    @classmethod
    def two_sided(cls, window: int, context: int, **rest):
        """A window that keeps `window - 2*context` frames: `context` on each side is read, not kept."""
        return cls(window=window, context=context, emitted=window - 2 * context, **rest)

    @classmethod
    def left_context(cls, window: int, context: int, **rest):
        """A window that keeps `window - context` frames: only the first `context` are read, not kept."""
        return cls(window=window, context=context, emitted=window - context, **rest)


@dataclass(frozen=True)
class WindowContract(WindowSpan):
    """The fixed-window contract an engine was compiled for (stored in its ONNX metadata)."""

    hop: int
    latent_input: str
    output: str
    mask_input: str | None = None
    latent_channels: int | None = None
    time_axis: int | None = None  # the latent's time axis when it is not the last ([1, T, 80] mel: 1)

    def __post_init__(self) -> None:
        if self.emitted < 1 or self.context < 0 or self.emitted + 2 * self.context > self.window:
            raise ValueError(f"window {self.window} cannot hold {self.emitted} emitted slices with "
                             f"{self.context} context slices on each side")

    def to_fields(self) -> dict:
        """The contract fields an exporter stores (inverse of `of`): mask_input and latent_channels only when set."""
        out = {"window": self.window, "context": self.context, "emitted": self.emitted, "hop": self.hop,
               "latent_input": self.latent_input, "output": self.output}
        if self.mask_input is not None:
            out["mask_input"] = self.mask_input
        if self.latent_channels is not None:
            out["latent_channels"] = int(self.latent_channels)
        if self.time_axis is not None:
            out["time_axis"] = int(self.time_axis)
        return out


def plan_windows(length: int, window: int, context: int, emitted: int) -> list[Window]:
    """The windows that cover a latent of `length` slices; their emitted ranges tile [0, length)."""
    if length < 1:
        raise ValueError("latent has no slices")
    if length <= window:
        return [Window(0, 0, 0, length, "padded" if length < window else "last")]
    windows = [Window(0, 0, 0, window - context, "first")]
    while windows[-1].emit_end < length:
        emit_start = windows[-1].emit_end
        start = emit_start - context
        if start + window >= length:  # this window reaches the end: align it to the end
            windows.append(Window(len(windows), length - window, emit_start, length, "last"))
        else:
            windows.append(Window(len(windows), start, emit_start, emit_start + emitted, "interior"))
    return windows


@dataclass
class WalkResult:
    output: np.ndarray           # emitted output concatenated along the last (time) axis
    windows: list[Window]
    hop: int

    def span(self, window: Window) -> slice:
        """Output samples that `window` produced."""
        return slice(window.emit_start * self.hop, window.emit_end * self.hop)


def walk(backend, latent: np.ndarray, contract: WindowContract, feeds: dict | None = None) -> WalkResult:
    """Decode `latent` [1, C, N] (time on the contract's `time_axis` when it has one: [1, N, C] for axis 1) window by
    window through `backend.run`; `feeds` are extra per-utterance inputs passed unchanged to every run (e.g. a
    speaker embedding)."""
    latent = np.asarray(latent, dtype=np.float32)
    if latent.ndim != 3 or latent.shape[0] != 1:
        raise ValueError(f"latent must be [1, channels, slices], got {latent.shape}")
    time_axis = 2 if contract.time_axis is None else contract.time_axis % 3
    latent = np.moveaxis(latent, time_axis, 2)  # walked as [1, C, N]; each window is fed in the engine's layout
    if contract.latent_channels is not None and latent.shape[1] != contract.latent_channels:
        raise ValueError(f"latent has {latent.shape[1]} channels, the engine expects {contract.latent_channels}")
    length = latent.shape[2]
    w = contract.window
    windows = plan_windows(length, w, contract.context, contract.emitted)
    pieces = []
    for win in windows:
        chunk = np.zeros((1, latent.shape[1], w), dtype=np.float32)
        real = min(w, length - win.start)
        chunk[:, :, :real] = latent[:, :, win.start : win.start + real]
        run_feeds = {contract.latent_input: np.ascontiguousarray(np.moveaxis(chunk, 2, time_axis)), **(feeds or {})}
        if contract.mask_input is not None:
            mask = np.zeros((1, 1, w), dtype=np.float32)
            mask[:, :, :real] = 1.0
            run_feeds[contract.mask_input] = mask
        out = np.asarray(backend.run(run_feeds)[contract.output])
        offset = win.emit_start - win.start
        pieces.append(out[..., offset * contract.hop : (offset + win.emit_end - win.emit_start) * contract.hop])
    return WalkResult(np.concatenate(pieces, axis=-1), windows, contract.hop)


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of a window-walked decoder (`convert build --window`): the latent `latent` walked window by
    window over the one engine, as a runtime decodes an utterance; returns the output as `audio`. One engine call per
    window of the walk."""
    engine = only_engine(by_role(engines, "main"))
    return {"audio": walk(engine, inputs["latent"], WindowContract.of(engine.contract)).output}

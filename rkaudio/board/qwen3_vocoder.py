"""Stateful streaming over fixed-B step engines (cache in, cache out), and the stateless window role.

A step engine decodes `frames` code frames from a flat fp32 cache and returns the next cache. The cache
layout does not depend on B, so a small first engine (time to first audio) hands its cache to the large
main engine. Every part of the decoder is causal, which gives two simple rules used below:
- a short last group is padded on the right with code 0 and only its real frames' samples are kept (the
  padding only changes the cache, which ends with the stream);
- the window role decodes [left context + new] frames from a zeroed cache and drops the context audio,
  as the CPU streaming decoder does (a short window is right-padded the same way).

Contracts (`StepContract`, `WindowRole`: frames, cache_numel, samples_per_frame, window/context/emitted) are the
engine contract's fields; backends are anything with `run(feeds) -> outputs` (rkaudio.host.backends)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from rkaudio.board.contract import ContractFields, EngineContract
from rkaudio.board.window_walk import WindowSpan

CODES, CACHE_IN, PCM, CACHE_OUT = "codes", "cache_in", "pcm", "cache_out"
# Steps exported before the contract named `codes_dtype` take int64 code ids (published packages); later ones
# float32 (the exporter's one-hot quantizer runs on the NPU only on float inputs).
CODES_DTYPE_BEFORE = "int64"
# Qwen3-TTS "12 Hz": 24 kHz audio, 1920 samples per code frame. A toy config keeps the frame rate, so its audio
# lasts as long as the codes do.
CODE_FRAME_RATE_HZ = 12.5


@dataclass(frozen=True)
class StepContract(ContractFields):
    """A step engine's contract fields: `frames` code frames per run over a flat cache of `cache_numel` floats. The
    window role's contract holds them too (the same decoder, run from a zeroed cache) beside `WindowRole`'s."""

    frames: int             # code frames per run (B; the window role: its context + new frames)
    cache_numel: int        # floats in the flat fp32 cache (the same for every B of one decoder)
    samples_per_frame: int  # pcm samples per code frame
    num_quantizers: int     # code ids per frame: codes are [1, num_quantizers, frames]
    head_dim: int           # the pre-transformer's attention head size
    kv_len: int             # K/V history rows the cache holds per layer
    kv_heads: int           # the pre-transformer's K/V heads
    cache_layout: List[Dict[str, Any]]  # the flat cache's entries: {name, offset, shape, ...} in order
    codes_dtype: str = CODES_DTYPE_BEFORE  # the dtype the engine takes code ids in
    row_samples_limit: Optional[int] = None  # the longest time axis, in samples, the graph holds (absent: older)
    sine_degree: Optional[int] = None  # the round SnakeBeta sine's polynomial degree (absent: older)
    sine_form: Optional[str] = None    # how the graph evaluates SnakeBeta's sine: exact, clip, floor or round
    halo_form: Optional[str] = None    # how its row convs meet their halos (qwen3_vocoder/cache.py; absent: older)


def _padded(codes: np.ndarray, frames: int, dtype: str) -> np.ndarray:
    """codes [K, n<=frames] -> [1, K, frames] in the engine's `dtype`, right-padded with code 0."""
    out = np.zeros((1, codes.shape[0], frames), dtype=dtype)
    out[0, :, : codes.shape[1]] = codes
    return out


class StatefulStream:
    """Push code frames as they arrive; each full group is decoded at once, continuing the cache.

    The first group goes to `first` (when given: B=16 for a short time to first audio), later groups to
    `main` (B=64). `flush()` decodes what is left (right-padded) and ends the stream."""

    def __init__(self, main, main_contract: EngineContract, first=None, first_contract: EngineContract | None = None):
        self.main, self.main_step = main, StepContract.of(main_contract)
        self.first = first
        self.first_step = StepContract.of(first_contract) if first is not None else None
        if self.first_step is not None and (self.first_step.cache_numel, self.first_step.samples_per_frame) != (
                self.main_step.cache_numel, self.main_step.samples_per_frame):
            raise ValueError(f"first engine cache {self.first_step.cache_numel} / {self.first_step.samples_per_frame} "
                             f"samples per frame vs main {self.main_step.cache_numel} / "
                             f"{self.main_step.samples_per_frame}: not steps of one decoder")
        self.cache = np.zeros(self.main_step.cache_numel, dtype=np.float32)
        self.pending = np.zeros((self.main_step.num_quantizers, 0), dtype=np.int64)
        self.started = False
        self.steps = 0

    def _next_engine(self):
        if not self.started and self.first is not None:
            return self.first, self.first_step
        return self.main, self.main_step

    def _run(self, backend, step: StepContract, codes: np.ndarray) -> np.ndarray:
        real = codes.shape[1]
        outputs = backend.run({CODES: _padded(codes, step.frames, step.codes_dtype), CACHE_IN: self.cache})
        self.cache = np.asarray(outputs[CACHE_OUT], dtype=np.float32).reshape(-1)
        self.started, self.steps = True, self.steps + 1
        return np.asarray(outputs[PCM]).reshape(-1)[: real * step.samples_per_frame]

    def push(self, codes: np.ndarray) -> list[np.ndarray]:
        """codes [K, n] (any n) -> the pcm of every group completed by them (possibly none)."""
        self.pending = np.concatenate([self.pending, np.asarray(codes, dtype=np.int64)], axis=1)
        pieces = []
        while True:
            backend, step = self._next_engine()
            if self.pending.shape[1] < step.frames:
                return pieces
            group, self.pending = self.pending[:, : step.frames], self.pending[:, step.frames :]
            pieces.append(self._run(backend, step, group))

    def flush(self) -> np.ndarray:
        """Decode the frames still buffered (the smallest engine that holds them); the stream then ends."""
        if self.pending.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        candidates = [(b, s) for b, s in ((self.first, self.first_step), (self.main, self.main_step)) if b is not None]
        backend, step = min(((b, s) for b, s in candidates if s.frames >= self.pending.shape[1]),
                            key=lambda pair: pair[1].frames)
        pcm = self._run(backend, step, self.pending)
        self.pending = self.pending[:, :0]
        return pcm


def stream_decode(codes: np.ndarray, main, main_contract: EngineContract, first=None,
                  first_contract: EngineContract | None = None, event_frames: int = 1) -> tuple[np.ndarray, list[int]]:
    """Feed codes [K,T] `event_frames` at a time, as a talker would; returns (pcm, samples out after each
    event) so a caller can see when audio became available."""
    stream = StatefulStream(main, main_contract, first, first_contract)
    pieces, available = [], []
    for start in range(0, codes.shape[1], event_frames):
        pieces += stream.push(codes[:, start : start + event_frames])
        available.append(sum(p.size for p in pieces))
    pieces.append(stream.flush())
    return np.concatenate(pieces), available


def offline_decode(codes: np.ndarray, main, main_contract: EngineContract) -> np.ndarray:
    """All codes [K,T] through the main engine in consecutive groups."""
    stream = StatefulStream(main, main_contract)
    return np.concatenate([*stream.push(codes), stream.flush()])


@dataclass(frozen=True)
class WindowRole(WindowSpan):
    """The window role's contract fields: `window` = `context` frames on the left + `emitted` new ones
    (`WindowSpan.left_context`)."""

    samples_per_frame: int  # pcm samples per code frame
    codes_dtype: str = CODES_DTYPE_BEFORE  # the dtype the engine takes code ids in


def window_decode(codes: np.ndarray, backend, contract: EngineContract) -> np.ndarray:
    """Events of `emitted` new frames, each a full decode of [up to `context` previous frames + new] from a
    zeroed cache with the context audio dropped: the CPU streaming decoder's output, one window per event."""
    role = WindowRole.of(contract)
    pieces = []
    for start in range(0, codes.shape[1], role.emitted):
        new = min(role.emitted, codes.shape[1] - start)
        context = min(role.context, start)
        codes_in = _padded(codes[:, start - context : start + new], role.window, role.codes_dtype)
        pcm = np.asarray(backend.run({CODES: codes_in})[PCM])
        pieces.append(pcm.reshape(-1)[context * role.samples_per_frame : (context + new) * role.samples_per_frame])
    return np.concatenate(pieces)


def golden_loop(engines: list, inputs: dict, params: dict) -> dict:
    """End-to-end golden of the stateful stream: codes [K, T] (`inputs["codes"]`) pushed `params["event_frames"]`
    (default 1, as a talker emits them) at a time through `stream_decode`: the first group on the `first` engine
    (B=16) when there is one, every later group on `main` (B=64), the cache carried from call to call. Engines are
    chosen by contract role; a lone `first` engine plays `main`. Returns {"pcm": the stream's audio}."""
    from rkaudio.board.golden import by_role, only_engine

    mains, firsts = by_role(engines, "main"), by_role(engines, "first")
    if not mains:
        mains, firsts = firsts, []
    main = only_engine(mains)
    first = only_engine(firsts) if firsts else None
    pcm, _ = stream_decode(np.asarray(inputs["codes"], dtype=np.int64), main, main.contract, first,
                           first.contract if first is not None else None,
                           event_frames=int(params.get("event_frames", 1)))
    return {PCM: pcm}


def golden_codes_length(contracts: List[EngineContract]) -> int:
    """Code frames of the stream's end-to-end golden for engines of these contracts: one group on `first` (when
    there is one besides `main`), then two on `main`, so the cache is carried across both engines and main->main."""
    steps = {step.role: StepContract.of(step).frames for step in contracts if step.role in ("first", "main")}
    if "main" not in steps:
        return 2 * steps["first"]
    return steps.get("first", 0) + 2 * steps["main"]

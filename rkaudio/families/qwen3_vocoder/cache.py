"""The flat fp32 cache of the streaming step and the causal convs that keep their left context in it: on rows
[1, C, rows, row_length] after the transformer (each row's halo from the rows before it, the first row's from the
cache), time-major before it. The cache layout depends on the config only, never on the step's `B`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rkaudio.board.soc import ROW_SAMPLES_LIMIT
from rkaudio.surgery.modules.polyphase import polyphase_weights


@dataclass(frozen=True)
class CacheEntry:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# Every cache entry starts at a multiple of this many floats (the gap after an entry holds zeros). The flat cache
# reaches the NPU as one channel vector [1, N, 1, 1]: with the 31 (tiny) / 71 (real shape) validity flags shifting
# every later entry off the channel groups, the Concat that joins the entries ran on the CPU (rk3576 tiny step;
# rk3588 real shape).
CACHE_ALIGNMENT = 16


def aligned_slots(count: int) -> int:
    """`count` floats rounded up to the next multiple of CACHE_ALIGNMENT."""
    return -(-count // CACHE_ALIGNMENT) * CACHE_ALIGNMENT


class CacheLayout:
    """Ordered (name, shape) entries of the flat cache vector, each at an offset aligned to CACHE_ALIGNMENT."""

    def __init__(self) -> None:
        self.entries: list[CacheEntry] = []

    def add(self, name: str, shape: tuple[int, ...]) -> str:
        if any(e.name == name for e in self.entries):
            raise ValueError(f"cache entry {name} declared twice")
        self.entries.append(CacheEntry(name, tuple(int(d) for d in shape)))
        return name

    @staticmethod
    def _slots(entry: CacheEntry) -> int:
        """The floats an entry occupies: its own, then zeros up to the next aligned offset."""
        return aligned_slots(entry.numel)

    def _offsets(self) -> list[int]:
        offsets, offset = [], 0
        for entry in self.entries:
            offsets.append(offset)
            offset += self._slots(entry)
        return offsets

    @property
    def numel(self) -> int:
        return sum(self._slots(e) for e in self.entries)

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {entry.name: flat[offset : offset + entry.numel].reshape(entry.shape)
                for entry, offset in zip(self.entries, self._offsets())}

    def join(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        pieces = []
        for entry in self.entries:
            pieces.append(parts[entry.name].reshape(-1))
            if self._slots(entry) > entry.numel:
                pieces.append(torch.zeros(self._slots(entry) - entry.numel, dtype=pieces[-1].dtype))
        return torch.cat(pieces)

    def to_json(self) -> list[dict]:
        return [{"name": entry.name, "shape": list(entry.shape), "offset": offset}
                for entry, offset in zip(self.entries, self._offsets())]


# The conv decoder never holds one time axis past the NPU's 13-bit field (rkaudio.board.soc.ROW_SAMPLES_LIMIT):
# it works on rows, [1, C, rows, row_length], each row a run of consecutive samples whose left context (the halo)
# comes from the rows before it, or from the cache for the first row.


def extend_rows(x: torch.Tensor, tail: torch.Tensor, context: int, channels_first: bool = False):
    """x rows of one signal, [1,R,L,C] channels last or [1,C,R,L] channels first; tail the `context` samples before
    it, [1,1,context,C] or [1,C,1,context] -> (extended rows, each preceded by the `context` samples before it in the
    signal; the new tail), in x's order."""
    row_axis, time_axis = (2, 3) if channels_first else (1, 2)
    rows, length = int(x.shape[row_axis]), int(x.shape[time_axis])  # python ints: the graph stays fixed-shape
    spans = -(-context // length)  # how many rows back a halo reaches
    if spans == 1:
        halo = tail
        if rows > 1:
            halo = torch.cat([halo, x.narrow(row_axis, 0, rows - 1).narrow(time_axis, length - context, context)],
                             dim=row_axis)
    else:
        padding_shape = list(tail.shape)
        padding_shape[time_axis] = spans * length - context
        joined = torch.cat([torch.zeros(padding_shape, dtype=x.dtype), tail], dim=time_axis)
        before_shape = list(x.shape)
        before_shape[row_axis] = spans
        stacked = torch.cat([joined.reshape(before_shape), x], dim=row_axis)  # spans + R rows
        halo = torch.cat([stacked.narrow(row_axis, spans - back, rows) for back in range(spans, 0, -1)],
                         dim=time_axis).narrow(time_axis, spans * length - context, context)
    extended = torch.cat([halo, x], dim=time_axis)
    last_row = (x if spans == 1 else extended).narrow(row_axis, rows - 1, 1)
    return extended, last_row.narrow(time_axis, int(last_row.shape[time_axis]) - context, context)


def add_row_tail(layout: CacheLayout, name: str, channels: int, context: int) -> str:
    """A row conv's tail in the cache, time-major [1, 1, context, C]: a slice of the flat cache read in that order
    is a plain NPU Reshape. Channel-major [1, C, 1, context] reshapes landed on the CPU (rk3588, 34 of them in the
    real-shape step: the narrow context axis is the innermost one; rk3588 and rk3566, one per read and one per write
    in 2026-12 probes of one residual unit, and 20 CPU ops with a 87 MB engine in the tiny B=64 step on rk3588)."""
    return layout.add(name, (1, 1, context, channels))


# How a row conv's halo meets its rows [1,C,R,L] (`extend_rows_from_cache`), all with the time-major cache tail:
# - channels_last: the rows transposed to [1,R,L,C], joined with the tail, transposed back;
# - tail_transpose: the rows stay channel-major; only the tail crosses, as a rank-2 [context, C] <-> [C, context]
#   Transpose on its way in and out;
# - tail_matmul: as tail_transpose, the time-major side of each crossing multiplied by a [context, context] identity
#   (exact), which the compiler lowers as a MatMul instead of a layout change.
HALO_FORMS = ("channels_last", "tail_transpose", "tail_matmul")


def _time_major_rows(tail: torch.Tensor, form: str) -> torch.Tensor:
    """tail [context, C] as the compiler should meet it in `form`."""
    if form == "tail_matmul":
        return torch.matmul(torch.eye(int(tail.shape[0]), dtype=tail.dtype), tail)
    return tail


def extend_rows_from_cache(x: torch.Tensor, state: dict, new_state: dict, name: str, context: int,
                           form: str = "channels_last") -> torch.Tensor:
    """`extend_rows` of rows x [1,C,R,L] with the tail read from and written back to the cache entry `name`
    ([1,1,context,C], time-major), the halo meeting the rows in `form` (HALO_FORMS).

    Why not channels_last everywhere: the rk3588 compiler runs a [1,C,R,L] -> [1,R,L,C] Transpose of more than 2^18
    elements on the CPU (measured alone: 64x4x1024 NPU, 64x4x1025 CPU; rk3576 none at 2.9 M), so the real-shape step
    kept 13 of them (14 / 15 CPU ops at B=16 / B=64), and the RK3566 compiler runs them on its CPU after a SnakeBeta at
    any size. The tail forms leave the rows where they are. One residual unit on rk3588 at the real shape's widest
    rows (96x4x7680 / 768x4x128, toolkit 2.3.2), CPU ops and predicted ms: channels_last 1 / 273.0 ms, 1 / 42.2 ms;
    tail_transpose 0 / 265.6, 0 / 41.0; tail_matmul 0 / 252.8, 0 / 39.2. The tiny B=64 step (65 CPU ops on rk3566 in
    channels_last): tail_transpose 53, 8.9 ms against 14.1; tail_matmul 64, 10.2 ms; on rk3588 tail_transpose keeps
    10 rank-2 Transposes on the CPU and tail_matmul none. The family picks per target (step_export.HALO_FORMS).

    Tried and dropped before (figures kept from issue #26): sending only each row's last `context` samples channels
    last (481 REGTASK lines in the B=16 step); the tail kept channel major and moved by grouped convs with 0/1 weights
    (7.5 M selector weights at real shape, the B=16 compile OOM-killed past 11.4 GB; commit 77f7664); the halo joined
    time first, [1,L,C,R] (all NPU, but one 96x4x7680 row conv's engine is 120.7 MB instead of 0.34 MB)."""
    if form == "channels_last":
        extended, new_state[name] = extend_rows(x.permute(0, 2, 3, 1), state[name], context)
        return extended.permute(0, 3, 1, 2)
    if form not in HALO_FORMS:
        raise ValueError(f"halo form {form!r}: one of {', '.join(HALO_FORMS)}")
    channels = int(x.shape[1])
    tail = _time_major_rows(state[name].reshape(context, channels), form).t().reshape(1, channels, 1, context)
    extended, new_tail = extend_rows(x, tail, context, channels_first=True)
    new_state[name] = _time_major_rows(new_tail.reshape(channels, context).t(), form).reshape(1, 1, context, channels)
    return extended


class RowCausalConv(nn.Module):
    """The package's causal conv (`.conv`, same weights) on rows: left context from the halo, not zeros."""

    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, kernel: int, dilation: int = 1,
                 groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation
        self.tail = add_row_tail(layout, name, cin, self.context) if self.context else None
        self.halo_form = "channels_last"  # StreamingDecoder.with_halo_form

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        weight = self.conv.weight.unsqueeze(2)
        if self.tail is not None:
            x = extend_rows_from_cache(x, state, new_state, self.tail, self.context,
                                       self.halo_form)
        return F.conv2d(x, weight, self.conv.bias, dilation=(1, self.conv.dilation[0]), groups=self.conv.groups)


class RowTransposedConv(nn.Module):
    """The package's causal transposed conv (`.conv`, right side trimmed) on rows, in polyphase form: one conv
    whose output channel p*cout + c is phase p of channel c (rkaudio.surgery.modules.polyphase.polyphase_weights), then
    the phases interleaved by Reshape + Concat + Reshape, all NPU layers. The rk3588 compiler lowers a stride-5
    or stride-3 ConvTranspose to a CPU zero-insertion, and even its native stride-8 one estimates 8x the cycles
    of this form (measured on the decoder's own shapes)."""

    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.taps = -(-kernel // stride)
        self.context = self.taps - 1
        self.tail = add_row_tail(layout, name, cin, self.context) if self.context else None
        self.halo_form = "channels_last"  # StreamingDecoder.with_halo_form

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        if self.tail is not None:
            x = extend_rows_from_cache(x, state, new_state, self.tail, self.context,
                                       self.halo_form)
        cout = self.conv.out_channels
        weight, bias = polyphase_weights(self.conv.weight, self.conv.bias, self.stride, row_kernel=True)
        phases = F.conv2d(x, weight, bias)  # a [1, taps] kernel: along each row only
        rows, length = (int(d) for d in phases.shape[2:])
        # Per phase [1, cout, R, L] -> [1, cout, R*L, 1] (a view that leaves the channels alone), stacked on the last
        # axis and read back as rows, a group of rows at a time so that the R*L axis stays within the field limit.
        # Merging the rows into the channels instead, [1, cout*R, L, 1], put both Reshapes on the RK3566 CPU at the
        # real shape (8 per step, 110 of its 1,796 predicted ms at B=16); this form, measured on the 192->96 and
        # 768->384 upsamplers at 4 rows: rk3566 0 CPU ops and 317.6 / 96.5 ms against 354.2 / 111.2, rk3588 156.6 / 45.3
        # against 153.0 / 45.3, rk3576 303.4 / 93.0 against 299.5 / 93.0.
        group = max(1, min(rows, ROW_SAMPLES_LIMIT // length))
        interleaved = []
        for first in range(0, rows, group):
            taken = min(group, rows - first)
            stacked = torch.cat([phase.narrow(2, first, taken).reshape(1, cout, taken * length, 1)
                                 for phase in torch.split(phases, cout, dim=1)], dim=-1)
            interleaved.append(stacked.reshape(1, cout, taken, length * self.stride))
        return interleaved[0] if len(interleaved) == 1 else torch.cat(interleaved, dim=2)


class TimeMajorCausalConv(nn.Module):
    """The package's causal pre-conv (`.conv`) on time-major [1,B,C] input, as one matmul per tap: the
    quantizer's output is time-major, and a Concat of a channel-major tail there compiled to a one-hot
    gather convolution of 2.3 GB (rk3588, B=64)."""

    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel)
        self.context = kernel - 1
        self.tail = layout.add(name, (1, self.context, cin))

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        frames = int(x.shape[1])
        full = torch.cat([state[self.tail], x], dim=1)
        new_state[self.tail] = full[:, -self.context :]
        out = self.conv.bias
        for tap in range(self.conv.kernel_size[0]):
            out = out + F.linear(full[:, tap : tap + frames], self.conv.weight[:, :, tap])
        return out

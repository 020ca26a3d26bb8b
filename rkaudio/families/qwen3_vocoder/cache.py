"""The flat fp32 cache of the streaming step and the causal convs that keep their left context in it: on rows
[1, C, rows, row_length] after the transformer (each row's halo from the rows before it, the first row's from the
cache), time-major before it. The cache layout depends on the config only, never on the step's `B`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

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


def extend_rows(x: torch.Tensor, tail: torch.Tensor, context: int):
    """x [1,R,L,C] rows of one signal, channels last; tail [1,1,context,C] the samples before it -> (extended
    [1,R,context+L,C], each row preceded by the `context` samples before it in the signal; the new tail)."""
    rows, length, channels = (int(d) for d in x.shape[1:])  # python ints: the graph stays fixed-shape
    spans = -(-context // length)  # how many rows back a halo reaches
    if spans == 1:
        halo = tail
        if rows > 1:
            halo = torch.cat([halo, x[:, : rows - 1, length - context :]], dim=1)
    else:
        padding = torch.zeros(1, 1, spans * length - context, channels, dtype=x.dtype)
        before = torch.cat([padding, tail], dim=2).reshape(1, spans, length, channels)
        stacked = torch.cat([before, x], dim=1)  # [1, spans + R, L, C]
        halo = torch.cat([stacked[:, spans - back : spans - back + rows] for back in range(spans, 0, -1)],
                         dim=2)[:, :, spans * length - context :]
    extended = torch.cat([halo, x], dim=2)
    return extended, extended[:, rows - 1 :, -context:]


def add_row_tail(layout: CacheLayout, name: str, channels: int, context: int) -> str:
    """A row conv's tail in the cache, time-major [1, 1, context, C]: a slice of the flat cache read in that order
    is a plain NPU Reshape. Channel-major [1, C, 1, context] reshapes landed on the CPU (rk3588, 34 of them in the
    real-shape step: the narrow context axis is the innermost one)."""
    return layout.add(name, (1, 1, context, channels))


def extend_rows_from_cache(x: torch.Tensor, state: dict, new_state: dict, name: str, context: int) -> torch.Tensor:
    """`extend_rows` of rows x [1,C,R,L] with the tail read from and written back to the cache entry `name`.
    The halo is joined in the cache's own channels-last order and the extended rows transposed once after the
    join: a tail transposed to [1,C,1,context] before it was a Transpose the compiler put on the CPU, batch-major
    (context,C,1,1) (rk3588: 14 CPU Transposes in the real-shape B=16 step, 8 in the tiny one; joined channels
    last, none, at the tiny step's estimated cycles).

    Still open at real shape (rk3588): a [1,C,R,L] -> [1,R,L,C] Transpose of more than 2^18 elements runs on the
    CPU (measured alone: 64x4x1024 NPU, 64x4x1025 CPU; rk3576 none at 2.9 M), so the 12 residual units and the
    output conv keep 13 CPU Transposes. Split pieces are fused back into one by the compiler. Sending only each
    row's last `context` samples channels last clears them on each conv alone (and halves the traffic), but the
    whole B=16 step then logged 481 REGTASK lines (v2@0x5048, v2@0x4038, limit 0x1fff): issue #26's note.
    Joining channels first with the tail kept channel major in the cache and moved by grouped convs with 0/1
    weights (a ConvTranspose from the cache's channel vector, a Conv back; taps folded to [rows, 16], the kernel
    axis' register limit) leaves 0 CPU ops in the tiny step on rk3588 (37 instead of 79 on rk3566), but those
    selectors hold 7.5 M weights at real shape and the B=16 compile grew past 11.4 GB until it was OOM-killed
    (4.65 GB whole-row): reverted, commit 77f7664 has it. Joining time first, [1,L,C,R] (x permuted (0,3,1,2),
    back by (0,2,3,1), the tail time-major as now) is all NPU on rk3588 at every real row shape, at the row conv's
    own estimated cycles (the layer table costs both Transposes at 0 cycles), but the engine grows with L^2: one
    96x4x7680 row conv's engine is 120.7 MB instead of 0.34 MB (14.7 MB at 192x4x2560), not in weights (the layer
    table lists 5.8 MB per Transpose). Not taken."""
    extended, new_state[name] = extend_rows(x.permute(0, 2, 3, 1), state[name], context)
    return extended.permute(0, 3, 1, 2)


class RowCausalConv(nn.Module):
    """The package's causal conv (`.conv`, same weights) on rows: left context from the halo, not zeros."""

    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, kernel: int, dilation: int = 1,
                 groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation
        self.tail = add_row_tail(layout, name, cin, self.context) if self.context else None

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        weight = self.conv.weight.unsqueeze(2)
        if self.tail is not None:
            x = extend_rows_from_cache(x, state, new_state, self.tail, self.context)
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

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        if self.tail is not None:
            x = extend_rows_from_cache(x, state, new_state, self.tail, self.context)
        cout = self.conv.out_channels
        weight, bias = polyphase_weights(self.conv.weight, self.conv.bias, self.stride, row_kernel=True)
        phases = F.conv2d(x, weight, bias)  # a [1, taps] kernel: along each row only
        rows, length = (int(d) for d in phases.shape[2:])
        # [1, cout, R, L] per phase -> [1, cout*R, L, 1] (a view), stacked on the last axis, read back as rows.
        stacked = torch.cat([phase.reshape(1, cout * rows, length, 1) for phase in torch.split(phases, cout, dim=1)],
                            dim=-1)
        return stacked.reshape(1, cout, rows, length * self.stride)


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

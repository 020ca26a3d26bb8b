"""The flat fp32 cache of the streaming step and the causal convs that keep their left context in it: on rows
[1, C, rows, row_length] after the transformer (each row's halo from the rows before it, the first row's from the
cache), time-major before it. The cache layout depends on the config only, never on the step's `B`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from runtime.board.soc import CONV_KERNEL_AXIS_LIMIT
from surgery.modules.polyphase import polyphase_weights


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


# The conv decoder never holds one time axis past the NPU's 13-bit field (runtime.board.soc.ROW_SAMPLES_LIMIT):
# it works on rows, [1, C, rows, row_length], each row a run of consecutive samples whose left context (the halo)
# comes from the rows before it, or from the cache for the first row.


def extend_rows(x: torch.Tensor, tail: torch.Tensor, context: int):
    """x [1,C,R,L] rows of one signal; tail [1,C,1,context] the samples before it -> (extended
    [1,C,R,context+L], each row preceded by the `context` samples before it in the signal; the new tail)."""
    channels, rows, length = (int(d) for d in x.shape[1:])  # python ints: the graph stays fixed-shape
    spans = -(-context // length)  # how many rows back a halo reaches
    if spans == 1:
        halo = tail
        if rows > 1:
            halo = torch.cat([halo, x[:, :, : rows - 1, length - context :]], dim=2)
    else:
        padding = torch.zeros(1, channels, 1, spans * length - context, dtype=x.dtype)
        before = torch.cat([padding, tail], dim=3).reshape(1, channels, spans, length)
        stacked = torch.cat([before, x], dim=2)  # [1, C, spans + R, L]
        halo = torch.cat([stacked[:, :, spans - back : spans - back + rows] for back in range(spans, 0, -1)],
                         dim=3)[..., spans * length - context :]
    extended = torch.cat([halo, x], dim=3)
    return extended, extended[:, :, rows - 1 :, -context:]


def tail_kernel(context: int) -> tuple[int, int]:
    """The selector kernel (rows, taps) of a `context`-sample tail: one row of `context` taps up to the kernel-axis
    limit, else the tail padded to a multiple of the limit and folded into rows of it."""
    if context <= CONV_KERNEL_AXIS_LIMIT:
        return 1, context
    return -(-context // CONV_KERNEL_AXIS_LIMIT), CONV_KERNEL_AXIS_LIMIT


class RowTail(nn.Module):
    """A row conv's left context in the flat cache, channel major [C, slots] (the `context` samples, then zeros up
    to the selector kernel's size), moved by grouped convs with 0/1 weights: a ConvTranspose reads the cache's
    channel vector into channels-first [1,C,1,context] and a Conv writes the last row's end back, so the halo is
    joined channels first with no Transpose and no spatial Reshape. Joined channels last instead, rk3588 ran each
    [1,C,R,L] -> [1,R,L,C] Transpose past 2^18 elements on the CPU (13 in the real-shape step), and a channel-major
    Reshape of a tail read from the cache was a CPU op there too (34 in the real-shape step)."""

    def __init__(self, layout: CacheLayout, name: str, channels: int, context: int):
        super().__init__()
        self.channels, self.context = channels, context
        self.kernel = tail_kernel(context)
        self.slots = math.prod(self.kernel)
        self.name = layout.add(name, (channels, self.slots))
        picks = torch.eye(self.slots).reshape(self.slots, 1, *self.kernel)  # slot s -> kernel position s
        self.register_buffer("selector", picks.repeat(channels, 1, 1, 1), persistent=False)

    def extend(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        """`extend_rows` of x [1,C,R,L] with the tail read from the cache; the new tail written back."""
        vector = state[self.name].reshape(1, self.channels * self.slots, 1, 1)
        if self.slots == 1:  # one sample per channel: the channel vector is the tail already
            extended, row_end = extend_rows(x, vector, self.context)
            new_state[self.name] = row_end.reshape(self.channels, 1)
            return extended
        tail = F.conv_transpose2d(vector, self.selector, groups=self.channels)
        tail = tail.reshape(1, self.channels, 1, self.slots)
        padding = self.slots - self.context
        extended, row_end = extend_rows(x, tail[..., : self.context] if padding else tail, self.context)
        if padding:  # a Concat of zeros: the export health gate refuses Pad
            row_end = torch.cat([row_end, torch.zeros(1, self.channels, 1, padding, dtype=row_end.dtype)], dim=3)
        row_end = row_end.reshape(1, self.channels, *self.kernel)
        new_state[self.name] = F.conv2d(row_end, self.selector, groups=self.channels).reshape(self.channels,
                                                                                              self.slots)
        return extended


class RowCausalConv(nn.Module):
    """The package's causal conv (`.conv`, same weights) on rows: left context from the halo, not zeros."""

    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, kernel: int, dilation: int = 1,
                 groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation
        self.tail = RowTail(layout, name, cin, self.context) if self.context else None

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        weight = self.conv.weight.unsqueeze(2)
        if self.tail is not None:
            x = self.tail.extend(x, state, new_state)
        return F.conv2d(x, weight, self.conv.bias, dilation=(1, self.conv.dilation[0]), groups=self.conv.groups)


class RowTransposedConv(nn.Module):
    """The package's causal transposed conv (`.conv`, right side trimmed) on rows, in polyphase form: one conv
    whose output channel p*cout + c is phase p of channel c (surgery.modules.polyphase.polyphase_weights), then
    the phases interleaved by Reshape + Concat + Reshape, all NPU layers. The rk3588 compiler lowers a stride-5
    or stride-3 ConvTranspose to a CPU zero-insertion, and even its native stride-8 one estimates 8x the cycles
    of this form (measured on the decoder's own shapes)."""

    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.taps = -(-kernel // stride)
        self.context = self.taps - 1
        self.tail = RowTail(layout, name, cin, self.context) if self.context else None

    def forward(self, x: torch.Tensor, state: dict, new_state: dict) -> torch.Tensor:
        if self.tail is not None:
            x = self.tail.extend(x, state, new_state)
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

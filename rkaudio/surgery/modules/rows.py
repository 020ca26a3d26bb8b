"""A long non-causal signal carried as rows [1, C, R, L] with a two-sided halo per conv: no time axis past the
NPU's 13-bit register field (8191), exactly the plain convs' zero padding at the signal's ends.

Row r holds samples [r*L, (r+1)*L) of the signal (the last row padded with zeros past its end). A conv with
symmetric padding p is `halo_rows(x, p)` (each row preceded by the p samples before it and followed by the p
after it, zeros past either end of the row tensor) then a conv2d with a [1, k] kernel and no padding, so each
output row is the plain conv's output over that row's samples. The causal counterpart with a cache tail is the
Qwen3 step's `extend_rows` (rkaudio/families/qwen3_vocoder/cache.py)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rkaudio.board.soc import ROW_SAMPLES_LIMIT  # the 13-bit field: no axis of the row form longer than this


def row_layout(length: int, halo: int, limit: int = ROW_SAMPLES_LIMIT, multiple: int = 1) -> tuple[int, int]:
    """(rows, row_length) for a signal of `length` samples: the fewest rows whose length is a multiple of
    `multiple` and, extended by `halo` samples per side, stays within `limit`; ValueError when none fits."""
    widest = (limit - 2 * halo) // multiple * multiple
    if widest < max(halo, multiple, 1):
        raise ValueError(f"no row of a multiple of {multiple} samples with a {halo}-sample halo per side fits "
                         f"{limit} samples")
    rows = -(-length // widest)
    row_length = multiple * -(-length // (rows * multiple))
    if row_length < halo or (rows - 1) * row_length >= length:
        raise ValueError(f"{length} samples do not split into {rows} rows of {row_length} with a {halo}-sample halo")
    return rows, row_length


def halo_rows(x: torch.Tensor, left: int, right: int | None = None) -> torch.Tensor:
    """x [1,C,R,L] -> [1,C,R,left+L+right]: each row with the `left` samples before it and the `right` after it
    in the signal (from the neighbouring rows; zeros before the first row and after the last). Needs
    left, right <= L (a halo reaches one row)."""
    right = left if right is None else right
    channels, rows, length = (int(d) for d in x.shape[1:])  # python ints: the graph stays fixed-shape
    if max(left, right) > length:
        raise ValueError(f"a halo of {max(left, right)} samples reaches past one row of {length}")
    parts = []
    if left:
        before = x.new_zeros(1, channels, 1, left)
        if rows > 1:
            before = torch.cat([before, x[:, :, : rows - 1, length - left:]], dim=2)
        parts.append(before)
    parts.append(x)
    if right:
        after = x.new_zeros(1, channels, 1, right)
        if rows > 1:
            after = torch.cat([x[:, :, 1:, :right], after], dim=2)
        parts.append(after)
    return torch.cat(parts, dim=-1) if len(parts) > 1 else x


def row_conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """`conv` (a Conv1d with symmetric zero padding p, any stride dividing the row length) on rows [1,C,R,L]:
    the plain conv's output, rows [1,Cout,R,L/stride]. Output j of a row reads the row's samples
    stride*j - p .. stride*j - p + dilation*(k-1): the halo is p before and the rest after."""
    kernel, stride, dilation = conv.kernel_size[0], conv.stride[0], conv.dilation[0]
    pad = conv.padding[0] if not isinstance(conv.padding, str) else None
    if pad is None or conv.padding_mode != "zeros":
        raise ValueError("row_conv covers Conv1d with integer zero padding")
    right = dilation * (kernel - 1) - pad - (stride - 1)
    if int(x.shape[-1]) % stride or right < 0:
        raise ValueError(f"row_conv: rows of {int(x.shape[-1])} samples, stride {stride}, padding {pad}, kernel "
                         f"{kernel}, dilation {dilation} do not tile")
    weight = conv.weight.unsqueeze(2)  # [cout, cin/groups, 1, k]: along each row only
    return F.conv2d(halo_rows(x, pad, right), weight, conv.bias, stride=(1, stride), dilation=(1, dilation),
                    groups=conv.groups)

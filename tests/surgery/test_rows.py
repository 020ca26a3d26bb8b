"""row_conv (a conv over a signal carried as rows with a two-sided halo) against the plain conv in float64, at
several kernels, dilations, strides and paddings, the last row padded; halo_rows refuses a halo past one row, and
row_layout keeps every row and its halo within the field limit."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from rkaudio.board.kokoro import from_rows, to_rows
from rkaudio.board.numeric import snr_db
from rkaudio.surgery.modules.rows import halo_rows, row_conv, row_layout


@pytest.mark.parametrize("kernel,dilation,stride,padding", [(11, 5, 1, 25), (7, 1, 1, 3), (12, 1, 6, 3), (1, 1, 1, 0)])
def test_row_conv_is_the_plain_conv_in_float64(kernel, dilation, stride, padding):
    torch.manual_seed(1)
    conv = nn.Conv1d(3, 4, kernel, stride, padding=padding, dilation=dilation).double()
    signal = torch.randn(1, 3, 5 * 36 - 7, dtype=torch.float64)  # the last row padded with zeros
    with torch.no_grad():
        expected = conv(signal).numpy()
        rows = torch.from_numpy(to_rows(signal.numpy(), 5, 36))
        got = from_rows(row_conv(conv, rows).numpy(), expected.shape[-1])
    assert snr_db(expected, got) > 250


def test_halo_reaches_one_row_and_the_layout_keeps_every_axis_in_the_limit():
    with pytest.raises(ValueError, match="reaches past one row"):
        halo_rows(torch.zeros(1, 1, 3, 10), 11)
    for length in (8193, 15361, 30721):
        rows, row_length = row_layout(length, 25, 8191, 6)
        assert row_length % 6 == 0 and row_length + 50 <= 8191 and rows * row_length >= length
        assert (rows - 1) * row_length < length
    assert row_layout(15361, 25, 8191, 6) == (2, 7686)

"""Upsampling ConvTranspose1d as a polyphase Conv1d plus an interleave (sub-pixel form)."""
from __future__ import annotations

import copy

import torch
from torch import nn


def polyphase_weights(weight: torch.Tensor, bias: torch.Tensor | None, stride: int, row_kernel: bool = False):
    """ConvTranspose1d weights [cin, cout, K] (stride s, no padding) and bias -> the weights [s*cout, cin, taps]
    ([s*cout, cin, 1, taps] with `row_kernel`, for a conv2d along rows) and bias [s*cout] of one conv with
    taps = ceil(K/s) whose output channel p*cout + c is phase p of channel c:
    y[c, m*s + p] = sum_j W[:, c, p + j*s] . x[m - j], conv tap q reading frame m - (taps-1-q). Plain tensor
    ops, so a traced step exports them as constants the exporter folds."""
    cin, cout, kernel = (int(d) for d in weight.shape)  # python ints: a traced graph stays fixed-shape
    taps = -(-kernel // stride)
    if taps * stride > kernel:
        weight = torch.cat([weight, weight.new_zeros(cin, cout, taps * stride - kernel)], dim=-1)
    shape = (stride * cout, cin, 1, taps) if row_kernel else (stride * cout, cin, taps)
    phases = weight.reshape(cin, cout, taps, stride).flip(2).permute(3, 1, 0, 2).reshape(shape)
    return phases, (bias if bias is not None else weight.new_zeros(cout)).repeat(stride)


class PolyphaseUpsample(nn.Module):
    """ConvTranspose1d(cin, cout, K, stride s), no padding, computed as one Conv1d(cin, s*cout, ceil(K/s))
    (`polyphase_weights`), then the phases interleaved by Split + Concat on a new last axis + Reshape (all NPU
    layers), cropped to the transposed convolution's length (T-1)*s + K."""

    def __init__(self, transposed: nn.ConvTranspose1d):
        super().__init__()
        cin, cout, kernel = transposed.weight.shape
        stride = transposed.stride[0]
        if transposed.padding[0] or transposed.output_padding[0] or transposed.dilation[0] != 1 \
                or transposed.groups != 1:
            raise ValueError("polyphase form covers ConvTranspose1d without padding, dilation or groups")
        with torch.no_grad():
            weight, bias = polyphase_weights(transposed.weight, transposed.bias, stride)
            taps = weight.shape[-1]
            self.conv = nn.Conv1d(cin, stride * cout, taps, padding=taps - 1, dtype=transposed.weight.dtype)
            self.conv.weight.copy_(weight)
            self.conv.bias.copy_(bias)
        self.out_channels, self.stride, self.kernel = cout, stride, kernel

    def forward(self, x):
        phases = self.conv(x)
        frames = phases.shape[-1]
        interleaved = torch.cat([p.unsqueeze(-1) for p in torch.split(phases, self.out_channels, dim=1)], dim=-1)
        return interleaved.reshape(x.shape[0], self.out_channels, frames * self.stride)[
            ..., : (x.shape[-1] - 1) * self.stride + self.kernel]


def polyphase_upsample(module):
    """Swap every ConvTranspose1d for its polyphase Conv1d form: the rk3588 compiler lowers a transposed
    convolution as a CPU zero-insertion (exConvTransposePad) feeding an s-times-larger convolution."""
    module = copy.deepcopy(module)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.ConvTranspose1d):
                setattr(parent, name, PolyphaseUpsample(child))
    return module

"""Upsampling ConvTranspose1d as a polyphase Conv1d plus an interleave (sub-pixel form)."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F


class PolyphaseUpsample(nn.Module):
    """ConvTranspose1d(cin, cout, K, stride s), no padding, computed as one Conv1d(cin, s*cout, ceil(K/s)) whose
    output channel r*cout + c is phase r of channel c, then the phases interleaved by Split + Concat on a new
    last axis + Reshape (all NPU layers); output y[c, m*s + r] = sum_j W[:, c, r + j*s] . x[:, m - j], cropped to
    the transposed convolution's length (T-1)*s + K."""

    def __init__(self, transposed: nn.ConvTranspose1d):
        super().__init__()
        cin, cout, kernel = transposed.weight.shape
        stride = transposed.stride[0]
        if transposed.padding[0] or transposed.output_padding[0] or transposed.dilation[0] != 1 \
                or transposed.groups != 1:
            raise ValueError("polyphase form covers ConvTranspose1d without padding, dilation or groups")
        taps = math.ceil(kernel / stride)
        weight = F.pad(transposed.weight.detach(), (0, taps * stride - kernel))  # [cin, cout, taps*s]
        # conv tap q reads x[m - j] with j = taps-1-q; phase r of channel c is output channel r*cout + c
        weight = weight.reshape(cin, cout, taps, stride).flip(2).permute(3, 1, 0, 2).reshape(stride * cout, cin, taps)
        self.conv = nn.Conv1d(cin, stride * cout, taps, padding=taps - 1, dtype=transposed.weight.dtype)
        with torch.no_grad():
            self.conv.weight.copy_(weight)
            bias = transposed.bias.detach() if transposed.bias is not None else weight.new_zeros(cout)
            self.conv.bias.copy_(bias.repeat(stride))
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

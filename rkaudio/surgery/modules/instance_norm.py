"""Masked instance normalisation through GlobalAveragePool, fused with the affine that follows it."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F


class GapMaskedInstanceNorm(nn.Module):
    """`(instance_norm(x) * gain + shift) * mask` over the frames where `mask` is 1, statistics by GlobalAveragePool.

    mean = GAP(x*m)/GAP(m), var = GAP(((x-mean)*m)^2)/GAP(m); the output is `(x*scale + (shift - mean*scale)) * m`
    with the per-channel scale = gain * var^-1/2 (Pow: a per-channel Div or Reciprocal lands on the CPU of the
    rk3588 NPU, Pow does not), i.e. two full-tensor passes after the statistics (variance: `centred_variance`).
    Zero where the mask is 0, so a padded window normalises exactly as the same frames decoded unpadded. Any rank:
    [1, C, T] pools over T, rows [1, C, R, L] (rkaudio.surgery.modules.rows) over R and L together; `gain` and `shift`
    broadcast against x."""

    def __init__(self, eps: float, weight: torch.Tensor | None, bias: torch.Tensor | None):
        super().__init__()
        self.eps = float(eps)
        self.weight = None if weight is None else nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def forward(self, x, mask, gain, shift):
        channel = (1, -1) + (1,) * (x.dim() - 2)
        if self.weight is not None:  # the norm's own affine folds into the per-channel gain and shift
            shift = shift + gain * self.bias.view(channel)
            gain = gain * self.weight.view(channel)
        pool = F.adaptive_avg_pool1d if x.dim() == 3 else F.adaptive_avg_pool2d
        share = pool(mask, 1)
        mean = pool(x * mask, 1) / share
        var = centred_variance(x, mean, mask, share, pool)
        scale = gain * torch.pow(var + self.eps, -0.5)
        return (x * scale + (shift - mean * scale)) * mask


def centred_variance(x, mean, mask, share, pool):
    """GAP(((x - mean)*m)^2)/GAP(m) as x + (-mean) and Pow(., 2): 2 full-tensor reads fewer. An Add broadcasts
    the mean natively; a Sub by a computed [1, C, 1] mean is lowered as an Expand and a two-tensor Sub (rk3588),
    and on rk3566 that Expand's 11-bit length field logs REGTASK lite@0x1028 (limit 0x7ff, 8 lines per Sub at 8161
    samples, toolkit 2.3.2). Pow(x, 2) is one unary pass where a Mul x*x reads two. Not E[(x*m)^2] - mean^2: Kokoro has channels with mean^2/var up to ~1850, and that
    form already cancels in fp32 (its W=136 export fell to 110.4 dB ONNX vs torch, walk gate 100.9 dB: fails)."""
    centred = (x + (-mean)) * mask
    return pool(torch.pow(centred, 2), 1) / share


class InstanceNormIgnoringMask(nn.InstanceNorm1d):
    """nn.InstanceNorm1d with the fused call `(norm(x) * gain + shift) * mask`: the export-unfriendly original
    (statistics over the whole window, padding included), kept as the reference."""

    def forward(self, x, mask, gain, shift):
        return (super().forward(x) * gain + shift) * mask


def mask_instance_norm(module):
    """Swap every InstanceNorm1d for the masked GlobalAveragePool form: a ReduceSum/InstanceNormalization
    over the time axis lowers to a 13-bit register field on the NPU, GAP is the pooling engine's own
    reduction, and the mask keeps a padded window's statistics those of its real frames."""
    module = copy.deepcopy(module)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.InstanceNorm1d):
                setattr(parent, name, GapMaskedInstanceNorm(
                    child.eps, child.weight if child.affine else None, child.bias if child.affine else None))
    return module

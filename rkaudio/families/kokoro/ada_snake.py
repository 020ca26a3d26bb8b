"""Kokoro's AdaIN -> Snake -> conv unit, and the fold of each Snake's alpha into its neighbours."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from rkaudio.surgery.modules.rows import row_conv
from rkaudio.surgery.modules.snake import ROUND_SHIFT_FP32, half_turn_sin2

SINE_EVALUATION = "vertex"  # the round form's polynomial as rkaudio.surgery.modules.snake.vertex_sin2: 2 passes fewer


class AdaSnakeConv(nn.Module):
    """conv(snake((norm(x)*(1+gamma) + beta) * mask)) with (gamma, beta) = fc(style): AdaIN, Snake and the
    convolution after it as one unit, so the Snake's alpha can be folded into its neighbours."""

    def __init__(self, norm: nn.Module, fc: nn.Module, alpha: nn.Parameter, conv: nn.Module):
        super().__init__()
        self.norm, self.fc, self.alpha, self.conv = norm, fc, alpha, conv
        self.sine_form = "exact"
        self.folded = False
        self.register_buffer("pre_scale", torch.ones_like(alpha.detach()))
        self.register_buffer("round_shift", torch.tensor(ROUND_SHIFT_FP32), persistent=False)

    def sin2(self, w):
        """h(w) = sin(pi*w)^2/pi in this unit's sine form, the round form's polynomial by SINE_EVALUATION."""
        return half_turn_sin2(w, self.sine_form, self.round_shift, evaluation=SINE_EVALUATION)

    def forward(self, x, s, mask):
        if x.dim() == 4:
            return self.forward_rows(x, s, mask)
        gamma, beta = torch.chunk(self.fc(s).unsqueeze(-1), 2, dim=1)
        u = self.norm(x, mask, (1.0 + gamma) * self.pre_scale, beta * self.pre_scale)
        if self.folded:  # u is already w; pi/alpha lives in the conv weights
            return self.conv(u + self.sin2(u))
        half_turns = self.alpha * (1.0 / math.pi)
        w = u * half_turns
        return self.conv(u + self.sin2(w) / half_turns)

    def forward_rows(self, x, s, mask):
        """The same unit on rows [1, C, R, L] (rkaudio.surgery.modules.rows): per-channel factors [1, C, 1, 1], the
        conv along each row with its halo."""
        gamma, beta = torch.chunk(self.fc(s)[..., None, None], 2, dim=1)
        pre_scale = self.pre_scale[..., None]
        u = self.norm(x, mask, (1.0 + gamma) * pre_scale, beta * pre_scale)
        if self.folded:
            return row_conv(self.conv, u + self.sin2(u))
        half_turns = self.alpha[..., None] * (1.0 / math.pi)
        w = u * half_turns
        return row_conv(self.conv, u + self.sin2(w) / half_turns)


def fold_snake_alpha(module):
    """Fold each Snake's alpha/pi into the AdaIN affine before it and pi/alpha into the conv after it:
    exact algebra that removes two full-tensor multiplies per Snake (elementwise traffic is the NPU's cost)."""
    module = copy.deepcopy(module)
    for unit in module.modules():
        if isinstance(unit, AdaSnakeConv) and not unit.folded:
            half_turns = unit.alpha.detach() / math.pi  # [1, C, 1]
            with torch.no_grad():
                unit.pre_scale.copy_(half_turns)
                unit.conv.weight.div_(half_turns.reshape(1, -1, 1))
            unit.folded = True
    return module

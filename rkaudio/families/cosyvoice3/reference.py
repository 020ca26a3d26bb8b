"""Upstream's flow-matching solver (`cosyvoice/flow/flow_matching.py::ConditionalCFM.solve_euler`) over the
reference DiT, in whatever dtype the model is in (float64 for the gates): B=2 CFG rows (mu, spks, cond
zeroed in row 1), `(1 + r) * out[0] - r * out[1]`, Euler steps on the cosine schedule."""
from __future__ import annotations

import math

import torch


def cosine_t_span(steps: int, dtype=torch.float64) -> torch.Tensor:
    t_span = torch.linspace(0, 1, steps + 1, dtype=dtype)
    return 1 - torch.cos(t_span * 0.5 * math.pi)


@torch.no_grad()
def solve_euler(estimator, noise, mu, mask, spks, cond, steps: int = 10, cfg_rate: float = 0.7):
    """noise, mu, cond [1, mel, S], mask [1, 1, S], spks [1, spk] (torch, the estimator's dtype) -> mel."""
    dtype = next(estimator.parameters()).dtype
    x, mu, mask, spks, cond = (v.to(dtype) for v in (noise, mu, mask, spks, cond))
    t_span = cosine_t_span(steps, dtype)
    t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
    length = x.size(2)
    x_in = torch.zeros([2, x.size(1), length], dtype=dtype)
    mask_in = torch.zeros([2, 1, length], dtype=dtype)
    mu_in = torch.zeros([2, mu.size(1), length], dtype=dtype)
    t_in = torch.zeros([2], dtype=dtype)
    spks_in = torch.zeros([2, spks.size(1)], dtype=dtype)
    cond_in = torch.zeros([2, cond.size(1), length], dtype=dtype)
    for step in range(1, len(t_span)):
        x_in[:] = x
        mask_in[:] = mask
        mu_in[0] = mu
        t_in[:] = t.unsqueeze(0)
        spks_in[0] = spks
        cond_in[0] = cond
        dphi_dt = estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in)
        dphi_dt, cfg_dphi_dt = torch.split(dphi_dt, [1, 1], dim=0)
        x = x + dt * ((1.0 + cfg_rate) * dphi_dt - cfg_rate * cfg_dphi_dt)
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x

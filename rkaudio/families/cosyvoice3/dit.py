"""The CosyVoice3 flow estimator (`cosyvoice/flow/DiT/dit.py::DiT` + `modules.py` upstream), written here with
upstream's module and parameter names so that `decoder.estimator.*` of a real `flow.pt` loads strictly.

This is the reference: boolean masks, `scaled_dot_product_attention`, `masked_fill`, x-transformers RoPE on
[B, S, heads*dim_head] with rot_dim = dim_head (so only head 0's channels rotate), the causal grouped conv
position embedding (k=31, left pad 30, Mish), tanh GELU, non-affine LayerNorm eps 1e-6. It runs in any dtype
(`.double()` gives the float64 reference the export gates compare with). The graph the NPU runs is
`engine_graph.EstimatorGraph`, built over the same parameters."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FREQ_EMBED_DIM = 256  # TimestepEmbedding's sinusoid width (upstream default, not in the yaml)
TIME_SCALE = 1000.0  # SinusPositionEmbedding scale: arguments up to 1000 rad
CONV_POS_KERNEL = 31
CONV_POS_GROUPS = 16
LN_EPS = 1e-6
ROPE_BASE = 10000.0

# The estimator fields of `flow.decoder.estimator` in cosyvoice3.yaml, with upstream's DiT defaults.
CONFIG_DEFAULTS = {"depth": 8, "heads": 8, "dim_head": 64, "dropout": 0.1, "ff_mult": 4, "mel_dim": 80,
                   "mu_dim": None, "long_skip_connection": False, "spk_dim": None, "out_channels": None}


class SinusPositionEmbedding(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, scale=TIME_SCALE):
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device).float() * -emb)
        emb = scale * x.unsqueeze(1) * emb.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim, freq_embed_dim=FREQ_EMBED_DIM):
        super().__init__()
        self.time_embed = SinusPositionEmbedding(freq_embed_dim)
        self.time_mlp = nn.Sequential(nn.Linear(freq_embed_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, timestep):
        time_hidden = self.time_embed(timestep).to(timestep.dtype)
        return self.time_mlp(time_hidden)


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim, kernel_size=CONV_POS_KERNEL, groups=CONV_POS_GROUPS):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=0), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=0), nn.Mish())

    def forward(self, x):  # x [b, n, d]
        x = x.permute(0, 2, 1)
        x = self.conv1(F.pad(x, (self.kernel_size - 1, 0, 0, 0)))
        x = self.conv2(F.pad(x, (self.kernel_size - 1, 0, 0, 0)))
        return x.permute(0, 2, 1)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim, text_dim, out_dim, spk_dim=None):
        super().__init__()
        spk_dim = 0 if spk_dim is None else spk_dim
        self.spk_dim = spk_dim
        self.proj = nn.Linear(mel_dim * 2 + text_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim=out_dim)

    def forward(self, x, cond, text_embed, spks):
        to_cat = [x, cond, text_embed]
        if self.spk_dim > 0:
            to_cat.append(spks.unsqueeze(1).expand(-1, x.shape[1], -1))
        x = self.proj(torch.cat(to_cat, dim=-1))
        return self.conv_pos_embed(x) + x


class RotaryEmbedding(nn.Module):
    """x-transformers 2.11 RotaryEmbedding without xpos: the persistent `inv_freq` buffer is in flow.pt."""

    def __init__(self, dim, base=ROPE_BASE):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward_from_seq_len(self, seq_len):
        t = torch.arange(seq_len, device=self.inv_freq.device)[None]
        freqs = torch.einsum("b i , j -> b i j", t.type_as(self.inv_freq), self.inv_freq)
        return torch.stack((freqs, freqs), dim=-1).flatten(-2), 1.0  # [1, n, dim], GPT-J interleaved pairs


def rotate_half(x):
    x = x.unflatten(-1, (-1, 2))
    x1, x2 = x.unbind(dim=-1)
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(t, freqs, scale=1):
    """x-transformers' partial rotary embedding: only the first freqs.shape[-1] channels of t rotate. Applied
    to q/k at [b, n, heads*dim_head] with rot_dim = dim_head, that is head 0 alone (upstream's quirk)."""
    rot_dim, seq_len, orig_dtype = freqs.shape[-1], t.shape[-2], t.dtype
    freqs = freqs[:, -seq_len:, :]
    t, t_unrotated = t[..., :rot_dim], t[..., rot_dim:]
    t = (t * freqs.cos() * scale) + (rotate_half(t) * freqs.sin() * scale)
    return torch.cat((t, t_unrotated), dim=-1).type(orig_dtype)


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=LN_EPS)

    def forward(self, x, emb):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(emb, 6, dim=1)
        x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZero_Final(nn.Module):  # noqa: N801 (upstream's name)
    def __init__(self, dim):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 2)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=LN_EPS)

    def forward(self, x, emb):
        emb = self.linear(self.silu(emb))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FeedForward(nn.Module):
    def __init__(self, dim, dim_out=None, mult=4, dropout=0.0, approximate="none"):
        super().__init__()
        inner_dim = int(dim * mult)
        dim_out = dim_out if dim_out is not None else dim
        project_in = nn.Sequential(nn.Linear(dim, inner_dim), nn.GELU(approximate=approximate))
        self.ff = nn.Sequential(project_in, nn.Dropout(dropout), nn.Linear(inner_dim, dim_out))

    def forward(self, x):
        return self.ff(x)


class Attention(nn.Module):
    """Upstream's Attention with AttnProcessor (self-attention only)."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        self.dim, self.heads, self.inner_dim = dim, heads, dim_head * heads
        self.to_q = nn.Linear(dim, self.inner_dim)
        self.to_k = nn.Linear(dim, self.inner_dim)
        self.to_v = nn.Linear(dim, self.inner_dim)
        self.to_out = nn.ModuleList([nn.Linear(self.inner_dim, dim), nn.Dropout(dropout)])

    def forward(self, x, mask=None, rope=None):
        batch_size = x.shape[0]
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)
        if rope is not None:
            freqs, _ = rope
            query = apply_rotary_pos_emb(query, freqs, 1.0)
            key = apply_rotary_pos_emb(key, freqs, 1.0)
        head_dim = key.shape[-1] // self.heads
        query = query.view(batch_size, -1, self.heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, self.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, self.heads, head_dim).transpose(1, 2)
        x = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False)
        x = x.transpose(1, 2).reshape(batch_size, -1, self.heads * head_dim).to(query.dtype)
        x = self.to_out[1](self.to_out[0](x))
        if mask is not None:
            x = x.masked_fill(~mask[:, 0, -1].unsqueeze(-1), 0.0)
        return x


class DiTBlock(nn.Module):
    def __init__(self, dim, heads, dim_head, ff_mult=4, dropout=0.1):
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim=dim, heads=heads, dim_head=dim_head, dropout=dropout)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=LN_EPS)
        self.ff = FeedForward(dim=dim, mult=ff_mult, dropout=dropout, approximate="tanh")

    def forward(self, x, t, mask=None, rope=None):
        norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, emb=t)
        x = x + gate_msa.unsqueeze(1) * self.attn(x=norm, mask=mask, rope=rope)
        ff_norm = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(ff_norm)


class DiT(nn.Module):
    """forward(x [B,mel,S], mask [B,1,S], mu [B,mu,S], t [B], spks [B,spk], cond [B,mel,S]) -> [B,mel,S].
    Non-streaming attention (every real frame sees every real frame); the streaming chunk mask is not built."""

    def __init__(self, *, dim, depth=8, heads=8, dim_head=64, dropout=0.1, ff_mult=4, mel_dim=80, mu_dim=None,
                 long_skip_connection=False, spk_dim=None, out_channels=None, static_chunk_size=50,
                 num_decoding_left_chunks=2):
        super().__init__()
        self.time_embed = TimestepEmbedding(dim)
        mu_dim = mel_dim if mu_dim is None else mu_dim
        self.input_embed = InputEmbedding(mel_dim, mu_dim, dim, spk_dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.dim, self.depth, self.heads, self.dim_head, self.mel_dim = dim, depth, heads, dim_head, mel_dim
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(dim=dim, heads=heads, dim_head=dim_head, ff_mult=ff_mult, dropout=dropout) for _ in range(depth)])
        self.long_skip_connection = nn.Linear(dim * 2, dim, bias=False) if long_skip_connection else None
        self.norm_out = AdaLayerNormZero_Final(dim)
        self.proj_out = nn.Linear(dim, mel_dim)
        self.out_channels = out_channels
        self.static_chunk_size = static_chunk_size
        self.num_decoding_left_chunks = num_decoding_left_chunks

    def forward(self, x, mask, mu, t, spks=None, cond=None, streaming=False):
        if streaming:
            raise NotImplementedError("the streaming chunk mask is not part of this reference")
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        batch, seq_len = x.shape[0], x.shape[1]
        if t.ndim == 0:
            t = t.repeat(batch)
        t = self.time_embed(t)
        x = self.input_embed(x, cond, mu, spks)
        rope = self.rotary_embed.forward_from_seq_len(seq_len)
        residual = x
        attn_mask = mask.bool().repeat(1, seq_len, 1).unsqueeze(1)  # [B, 1, S, S]: the key mask on every row
        for block in self.transformer_blocks:
            x = block(x, t, mask=attn_mask, rope=rope)
        if self.long_skip_connection is not None:
            x = self.long_skip_connection(torch.cat((x, residual), dim=-1))
        x = self.norm_out(x, t)
        return self.proj_out(x).transpose(1, 2)


def build(config: dict) -> DiT:
    """A DiT for an estimator config (the yaml's `flow.decoder.estimator` mapping), in eval mode."""
    return DiT(**config).eval()


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

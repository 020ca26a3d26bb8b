"""The fixed-S graph the NPU runs: the same DiT parameters as `dit.DiT`, rewritten so the export carries no
IsNaN/Not/Neg/Tile and no -inf (rknn-toolkit2 marks IsNaN/Not/Neg unsupported and limits Tile to batch 1):

- the mask becomes a finite additive key bias `(mask - 1) * 1e4` (exp underflows to exactly 0 in fp16/fp32)
  and a multiplicative row mask where upstream has `masked_fill`;
- RoPE is two input tables `rope_cos`/`rope_sin` [heads, S, dim_head] (head 0's rotation, identity on the
  other heads: upstream's quirk) and rotate-half is a constant signed-permutation MatMul;
- the time sinusoid (arguments up to 1000 rad, past fp16) is the host-computed input `t_freq` [B, 256]; the
  time MLP stays in the graph;
- the speaker vector is projected once and broadcast by an Add (no repeat), the 1/sqrt(dim_head) score scale
  (a power of two for dim_head 64/16/4) is folded into to_q, and every chunk of an AdaLN linear is its own
  MatMul (no Split/Slice of a [B, 6*dim] row), and the scale/shift after each LayerNorm are expanded to
  [B, S, dim] by a ones column (a broadcast [B, 1, dim] there crashes the 2.3.2 compiler);
- tanh GELU is written out (Tanh, no Pow); LayerNorm is `plain` (x - mean) / sqrt(var + eps) or the
  scale-safe form (`layer_norm(..., form="safe")`, see there). Plain is the default: rknn-toolkit2 fuses it into
  exNorm, which holds a planted |x| ~ 1e4 residual on the rk3588 simulator (where a literal fp16 LayerNorm
  overflows), while the safe form crashes the 2.3.2 compiler (fuse_ops: _swap_transpose_expand, tiny model);
- a rung may be split by depth (`blocks`): the parts are chained through `hidden`, [B, S, dim] (`rows`) or
  [B, dim, S] (`channels`: the RK3566 compiler runs a Transpose of a row-major [B, S, dim] output on its CPU, of a
  channel-first one none, and none in the part that takes it either way)."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rkaudio.families.cosyvoice3.dit import DiT, LN_EPS
from rkaudio.board.cosyvoice3 import CHAIN_INPUT_NAMES, HIDDEN_NAME, INPUT_NAMES, OUTPUT_NAME

MASK_BIAS = 1.0e4  # additive key bias magnitude: finite in fp16, exp(-1e4) == 0 in fp16, fp32 and fp64
SAFE_LN_FLOOR = 1.0e-3  # the scale-safe LN divides by max|x| + this (any positive divisor is exact)
LN_FORMS = ("plain", "safe")
HIDDEN_LAYOUTS = ("rows", "channels")  # hidden [B, S, dim] or [B, dim, S] between the parts of a split rung
OUTPUT_NAMES = [OUTPUT_NAME]


def layer_norm(x: torch.Tensor, eps: float = LN_EPS, form: str = "plain") -> torch.Tensor:
    """Non-affine LayerNorm over the last axis. `safe`: LN_eps(x) == LN_{eps/s^2}(x/s) for any s > 0, with
    s = max|x| + floor per row, so every intermediate stays within [-2, 4] however large x is; the plain form
    squares x itself and overflows fp16 (65504) once |x - mean| passes ~256."""
    if form == "plain":
        centered = x - x.mean(-1, keepdim=True)
        return centered / torch.sqrt((centered * centered).mean(-1, keepdim=True) + eps)
    if form != "safe":
        raise ValueError(f"layer norm form {form!r}: one of {', '.join(LN_FORMS)}")
    scale = x.abs().amax(-1, keepdim=True) + SAFE_LN_FLOOR
    xs = x / scale
    centered = xs - xs.mean(-1, keepdim=True)
    inv = 1.0 / scale
    return centered / torch.sqrt((centered * centered).mean(-1, keepdim=True) + eps * (inv * inv))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def mish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tanh(F.softplus(x))


def rotate_half_matrix(dim: int) -> np.ndarray:
    """R with v @ R == x-transformers' rotate_half(v) over interleaved pairs: (v0, v1) -> (-v1, v0)."""
    matrix = np.zeros((dim, dim), dtype=np.float32)
    even = np.arange(0, dim, 2)
    matrix[even + 1, even] = -1.0
    matrix[even, even + 1] = 1.0
    return matrix


class EstimatorGraph(nn.Module):
    """x [B,mel,S], mask [B,1,S], mu [B,mu,S], t_freq [B,256], spks [B,spk], cond [B,mel,S],
    rope_cos/rope_sin [heads,S,dim_head] -> dphi_dt [B,mel,S] at one fixed S (the shapes come from the inputs)."""

    def __init__(self, model: DiT, ln_form: str = "plain", rotate_all_heads: bool = False, ignore_mask: bool = False,
                 blocks: tuple | None = None, hidden_layout: str = "rows"):
        super().__init__()
        # A depth split (`blocks` = (start, stop) of the transformer blocks): the first part takes the estimator's
        # inputs and ends at the hidden state [B, S, dim]; a later part takes `hidden` (+ mask, t_freq, the RoPE
        # tables) and the last one ends with norm_out/proj_out. Each part recomputes the time MLP (a few KFLOP).
        self.start, self.stop = (0, model.depth) if blocks is None else (int(blocks[0]), int(blocks[1]))
        if not 0 <= self.start < self.stop <= model.depth:
            raise ValueError(f"blocks {blocks}: a non-empty range within 0..{model.depth}")
        self.first, self.last = self.start == 0, self.stop == model.depth
        self.input_names = part_input_names(self.first)
        self.output_names = [OUTPUT_NAME if self.last else HIDDEN_NAME]
        if ln_form not in LN_FORMS:
            raise ValueError(f"layer norm form {ln_form!r}: one of {', '.join(LN_FORMS)}")
        if hidden_layout not in HIDDEN_LAYOUTS:
            raise ValueError(f"hidden layout {hidden_layout!r}: one of {', '.join(HIDDEN_LAYOUTS)}")
        self.channels_first_hidden = hidden_layout == "channels"
        if model.long_skip_connection is not None:
            raise NotImplementedError("long_skip_connection=True is not exported (cosyvoice3.yaml has it off)")
        self.model, self.ln_form = model, ln_form
        # Planted bugs the tests make the gates catch: RoPE on every head (upstream rotates head 0 only), the
        # mask not wired (padding leaks into the real frames).
        self.rotate_all_heads, self.ignore_mask = rotate_all_heads, ignore_mask
        self.register_buffer("rotate", torch.from_numpy(rotate_half_matrix(model.dim_head)), persistent=False)

    def _ln(self, x):
        return layer_norm(x, LN_EPS, self.ln_form)

    def _chunks(self, linear: nn.Linear, emb: torch.Tensor, count: int) -> list:
        width = linear.out_features // count
        return [F.linear(emb, linear.weight[i * width:(i + 1) * width], linear.bias[i * width:(i + 1) * width])
                for i in range(count)]

    @staticmethod
    def _rows(vector: torch.Tensor, length: int) -> torch.Tensor:
        """[B, D] -> [B, S, D] as ones [1, S, 1] * vector [B, 1, D]: rknn-toolkit2 2.3.2 segfaults (OpEmit) when a
        fused LayerNorm is followed by a Mul/Add broadcasting a computed [B, 1, D] vector. A Mul, not a ones
        MatMul: the toolkit turns a MatMul by a constant ones column into this Mul anyway (the same static engine),
        but under `--ladder dynamic` the column is a Slice of the largest rung's, no constant, and a MatMul with
        K = 1 on two computed tensors runs on the CPU; the Mul stays on the NPU."""
        return torch.ones(1, length, 1, dtype=vector.dtype) * vector[:, None, :]

    def _modulate(self, x, scale, shift):
        length = x.shape[1]
        return self._ln(x) * (1 + self._rows(scale, length)) + self._rows(shift, length)

    def _attention(self, attn, x, bias, row_mask, cos, sin):
        batch, length, _ = x.shape
        heads, head_dim = attn.heads, attn.inner_dim // attn.heads
        scale = 1.0 / math.sqrt(head_dim)

        def split(value):
            return value.reshape(batch, length, heads, head_dim).transpose(1, 2)  # [B, H, S, D]

        q = split(F.linear(x, attn.to_q.weight * scale, attn.to_q.bias * scale))
        k = split(attn.to_k(x))
        v = split(attn.to_v(x))
        q = q * cos + torch.matmul(q, self.rotate.to(q.dtype)) * sin
        k = k * cos + torch.matmul(k, self.rotate.to(k.dtype)) * sin
        scores = torch.matmul(q, k.transpose(2, 3)) + bias
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        out = out.transpose(1, 2).reshape(batch, length, heads * head_dim)
        return attn.to_out[0](out) * row_mask

    def forward(self, *args):
        feeds = dict(zip(self.input_names, args))
        m = self.model
        rope_cos, rope_sin = feeds["rope_cos"], feeds["rope_sin"]
        if self.rotate_all_heads:
            rope_cos = rope_cos[:1].expand_as(rope_cos)
            rope_sin = rope_sin[:1].expand_as(rope_sin)
        t = m.time_embed.time_mlp(feeds["t_freq"])
        silu_t = F.silu(t)
        if self.first:
            h = self._embed(feeds["x"], feeds["mu"], feeds["spks"], feeds["cond"])
        else:
            h = feeds[HIDDEN_NAME].transpose(1, 2) if self.channels_first_hidden else feeds[HIDDEN_NAME]

        mask = feeds["mask"]
        if self.ignore_mask:
            mask = torch.ones_like(mask)
        # The mask input has one consumer: with two (the bias and the row mask), rknn-toolkit2 2.3.2 places its
        # 4-D alignment Reshape of the input on the CPU at S=110 (not at S=24).
        shifted = mask - 1.0  # 0 on real frames, -1 on padding
        bias = (shifted * MASK_BIAS).unsqueeze(1)  # [B, 1, 1, S]: 0 on real keys, -1e4 on padding
        row_mask = (shifted + 1.0).transpose(1, 2)  # [B, S, 1]
        for block in m.transformer_blocks[self.start:self.stop]:
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self._chunks(
                block.attn_norm.linear, silu_t, 6)
            norm = self._modulate(h, scale_msa, shift_msa)
            h = h + gate_msa[:, None] * self._attention(block.attn, norm, bias, row_mask, rope_cos, rope_sin)
            ff_in = self._modulate(h, scale_mlp, shift_mlp)
            project_in, out_linear = block.ff.ff[0][0], block.ff.ff[2]
            h = h + gate_mlp[:, None] * out_linear(gelu_tanh(project_in(ff_in)))
        if not self.last:
            return h.transpose(1, 2) if self.channels_first_hidden else h
        scale, shift = self._chunks(m.norm_out.linear, silu_t, 2)
        h = self._modulate(h, scale, shift)
        return m.proj_out(h).transpose(1, 2)

    def _embed(self, x, mu, spks, cond):
        """Input embedding, channel-first: proj(cat(x, cond, mu, spks)) split by input, spks once per row;
        the causal conv position embedding; -> [B, S, dim]."""
        m = self.model
        proj = m.input_embed.proj
        mel, text = x.shape[1], mu.shape[1]
        w = proj.weight
        h = (torch.matmul(w[:, :mel], x) + torch.matmul(w[:, mel:2 * mel], cond)
             + torch.matmul(w[:, 2 * mel:2 * mel + text], mu))
        offset = F.linear(spks, w[:, 2 * mel + text:], proj.bias) if m.input_embed.spk_dim > 0 else proj.bias[None]
        h = h + offset.unsqueeze(-1)  # [B, dim, S]
        conv = m.input_embed.conv_pos_embed
        pad = conv.kernel_size - 1
        pos = mish(conv.conv1[0](F.pad(h, (pad, 0))))
        pos = mish(conv.conv2[0](F.pad(pos, (pad, 0))))
        return (pos + h).transpose(1, 2)  # [B, S, dim]


def part_input_names(first: bool) -> list:
    """The graph inputs of an estimator part: every estimator input for the first, the hidden state and what
    every block reads (mask, t_freq, RoPE tables) for a later one."""
    return list(INPUT_NAMES) if first else list(CHAIN_INPUT_NAMES)


def split_blocks(depth: int, parts: int) -> list:
    """(start, stop) of `parts` contiguous block ranges over `depth`, as even as can be (the first ones longer)."""
    if not 1 <= parts <= depth:
        raise ValueError(f"{parts} parts of a {depth}-block estimator: 1..{depth}")
    sizes = [depth // parts + (1 if i < depth % parts else 0) for i in range(parts)]
    bounds = [sum(sizes[:i]) for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]

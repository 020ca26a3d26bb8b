"""The fixed-shape torch graphs the NPU runs, built around the reference model's own modules.

The decoder is cut so that no graph owns a cache: K/V live on the CPU in rank-3 buffers [heads, Smax,
head_dim] per layer; one step graph per K/V bucket runs every layer for one token, reading the buffers (this
token's row not yet written) under a CPU-made additive mask and returning each layer's new K/V row, which the
CPU writes in place after the call. RoPE's rotate-half is a constant
signed permutation matmul, so no graph needs Concat."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rkaudio.board.audio8 import pooling_matrix  # noqa: F401  (the runtime computes the adapter's `pool` input)

MASKED = -1.0e4  # additive mask value: exp underflows to 0 in fp16 and fp32, and it stays finite in fp16


@dataclass(frozen=True)
class Layout:
    """How the graphs lay a target's tensors out (the default: rk3588 and rk3576). Each switch keeps ops on the NPU
    that the RK3566 compiler otherwise runs on its CPU (rknn-toolkit2 2.3.2, small model)."""

    tokens_by_conv: bool = False  # the encoder's conv_out as a Conv, chunks joined by a Concat (`EncoderGraph`;
                                  # the permute before the Linear kept a Reshape and a Transpose on the CPU)
    rank3_mix: bool = False  # the adapter's blocks at rank 3 (`AdapterGraph`; at rank 2 the last LayerNorm's output
                             # took a CPU Transpose into the pooling MatMul)
    prompt_multiple: int = 1  # the prefill's S rounded up to this (at S=110 the rk3566 prefill kept 27 CPU ops, at
                              # 112 four)
    embeds_by_channel: bool = False  # the prefill's inputs_embeds fed [1, hidden, S] and its selected row taken as
                                     # (h^T @ select^T)^T (`PrefillGraph`; fed [1, S, hidden], the RK3566 compiler put
                                     # a CPU Transpose at the residual stream's entry and one before the selecting
                                     # MatMul: tiny model, toolkit 2.3.2)
    square_by_mul: bool = False  # the prefill's RMSNorm squares as x * x (`rms_norm`)
    heads_by_weights: bool = False  # the step's heads from per-head projection weights, its token at rank 3
                                    # (`_StepLayer`)
    step_row_sum: bool = False  # the step divides by its attention weights' row sum itself, so that its Softmax
                                # may run as a bare exp (`rkaudio.surgery.graph.attention.softmax_as_row_max_exp`)
    rank3_head: bool = False  # the head shards norm at rank 3 (`HeadShardGraph`)


# The layout per target (absent targets: `Layout()`).
LAYOUTS = {"rk3566": Layout(tokens_by_conv=True, rank3_mix=True, prompt_multiple=8, embeds_by_channel=True,
                            square_by_mul=True, heads_by_weights=True, step_row_sum=True, rank3_head=True)}


def rotate_half_matrix(head_dim: int) -> np.ndarray:
    """R with x @ R == rotate_half(x) == [-x2, x1] (halves of the last axis)."""
    half = head_dim // 2
    matrix = np.zeros((head_dim, head_dim), dtype=np.float32)
    matrix[np.arange(half) + half, np.arange(half)] = -1.0
    matrix[np.arange(half), np.arange(half) + half] = 1.0
    return matrix


class _RotaryHeads(nn.Module):
    """Shared pieces: split a [tokens, hidden] projection into heads and apply RoPE."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.register_buffer("rotate", torch.from_numpy(rotate_half_matrix(head_dim)), persistent=False)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], self.heads, self.head_dim).transpose(0, 1)  # [heads, tokens, head_dim]

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.matmul(x, self.rotate) * sin


def rms_norm(norm: nn.Module, x: torch.Tensor, square_by_mul: bool = False) -> torch.Tensor:
    """A Qwen2RMSNorm as x / sqrt(mean(x^2) + eps) * weight: the exported rsqrt (Div of 1 by Sqrt) runs on the
    CPU in rknn-toolkit2 2.3.2 (rk3576), a tensor-by-tensor Div stays on the NPU. Its placement does not hang
    on the weights: identity weights (onnxslim then folds the Mul away) compile to the same CPU ops as perturbed
    ones on rk3588 and rk3576, where the rsqrt form's Divs go to the CPU
    (tests/families/audio8/test_norm_placement.py). `square_by_mul`: x * x for x^2 (the RK3566 compiler put a CPU
    Transpose after each prefill norm's Pow, and none after a Mul: toolkit 2.3.2, small model)."""
    square = x * x if square_by_mul else x.pow(2)
    return norm.weight * (x / torch.sqrt(square.mean(-1, keepdim=True) + norm.variance_epsilon))


def _attention(q, k, v, mask, head_dim):
    scores = torch.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(head_dim)) + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class EncoderGraph(nn.Module):
    """mel_chunks [chunks, 1, mel, chunk_frames] -> audio_hidden [tokens, output_dim]: the encoder after its
    chunking, which the runtime does in numpy (`rkaudio.board.audio8.mel_chunks`). Inside the graph, the [mel,
    frames] -> chunks Reshape was the one CPU op of the real-shape encoder on rk3588 (rknn-toolkit2 2.3.2)."""

    def __init__(self, encoder: nn.Module, layout: Layout = Layout()):
        super().__init__()
        self.encoder, self.tokens_by_conv = encoder, layout.tokens_by_conv

    def forward(self, mel_chunks):
        if not self.tokens_by_conv:
            return self.encoder.forward_chunks(mel_chunks)
        # conv_out (a Linear over channels x freq of each token) as a Conv whose kernel spans freq: [chunks, d_model,
        # 1, tokens_per_chunk], the chunks then joined along the token axis by a Concat, so no activation is permuted
        encoder = self.encoder
        x = encoder.downsample(mel_chunks)
        chunks, channels, freq, tokens = x.shape
        kernel = encoder.conv_out.weight.reshape(-1, channels, freq, 1)
        x = F.conv2d(x, kernel) + encoder.positional_embedding.T.reshape(1, -1, 1, tokens)
        x = torch.cat(list(x.split(1, 0)), dim=3)  # [1, d_model, 1, chunks * tokens_per_chunk]
        return encoder.encode_tokens(x.reshape(1, -1, chunks * tokens).transpose(1, 2))


class AdapterGraph(nn.Module):
    """audio_hidden [tokens, in], pool [1, rows, tokens] -> audio_embeddings [rows, out]: one graph for every
    placeholder count N <= rows. `pool` is the adaptive-average-pooling matrix for N, zero-padded to `rows`
    (`rkaudio.board.audio8.padded_pooling`); the first N output rows are the pooled ones, the runtime drops the
    rest (project() of a zero row: finite, unused). `pool` is rank 3 and the MatMul batched: a rank-2 `pool`
    input gets a CPU Transpose on rk3588 (rknn-toolkit2 2.3.2, small model; rk3576 has none either way)."""

    def __init__(self, adapter: nn.Module, layout: Layout = Layout()):
        super().__init__()
        self.adapter, self.rank3_mix = adapter, layout.rank3_mix

    def forward(self, audio_hidden, pool):
        if self.rank3_mix:
            return self.adapter.project(torch.matmul(pool, self.adapter.mix(audio_hidden[None]))[0])
        return self.adapter.project(torch.matmul(pool, self.adapter.mix(audio_hidden)[None])[0])


class PrefillGraph(nn.Module):
    """inputs_embeds [1, S, hidden], cos, sin [S, head_dim], select [1, S] -> last_hidden [1, 1, hidden],
    key_i / value_i [heads, S, head_dim] (RoPE applied): one graph for every prompt length L <= S. The prompt
    is right-padded to S: under the causal mask every real position sees only real ones, so its rows are exact;
    `select` is one-hot at L - 1 and picks that row's hidden state through a MatMul (an index Gather tends to
    land on the CPU). No LM head inside: the head shards take `last_hidden`, as in a decode step. cos/sin are
    inputs, not constants: rknn-toolkit2 2.3.2 tries to fuse a constant [S, head_dim] Mul into the rotate-half
    MatMul and fails ('operands could not be broadcast'). The hidden state stays [1, S, hidden] (batched
    MatMuls): flattened to [S, hidden], rk3588 put a Transpose before every layer's projections on the CPU
    (16 at real shape, rknn-toolkit2 2.3.2), as the adapter's rank-2 `pool` did."""

    def __init__(self, decoder: nn.Module, length: int, layout: Layout = Layout()):
        super().__init__()
        config = decoder.config
        self.decoder, self.layout = decoder, layout
        self.heads = _RotaryHeads(config.num_attention_heads, config.hidden_size // config.num_attention_heads)
        causal = np.triu(np.full((length, length), MASKED, dtype=np.float32), k=1)
        self.register_buffer("mask", torch.from_numpy(causal)[None], persistent=False)

    def forward(self, inputs_embeds, cos, sin, select):
        by_channel = self.layout.embeds_by_channel
        h, caches = (inputs_embeds.transpose(1, 2) if by_channel else inputs_embeds), []
        split = lambda projected: self.heads.split(projected.flatten(0, 1))  # noqa: E731  [heads, S, head_dim]
        norm = lambda module, x: rms_norm(module, x, self.layout.square_by_mul)  # noqa: E731
        for layer in self.decoder.model.layers:
            attn = layer.self_attn
            x = norm(layer.input_layernorm, h)
            q = self.heads.rope(split(attn.q_proj(x)), cos, sin)
            k = self.heads.rope(split(attn.k_proj(x)), cos, sin)
            v = split(attn.v_proj(x))
            out = _attention(q, k, v, self.mask, self.heads.head_dim)
            h = h + attn.o_proj(out.transpose(0, 1).reshape(h.shape))
            h = h + layer.mlp(norm(layer.post_attention_layernorm, h))
            caches += [k, v]
        if by_channel:  # the same row, with the residual stream as the MatMul's left operand
            return (torch.matmul(h.transpose(1, 2), select.unsqueeze(-1)).transpose(1, 2), *caches)
        return (torch.matmul(select.unsqueeze(1), h), *caches)


class HeadShardGraph(nn.Module):
    """hidden [1,1,hidden] -> logits [1, rows]: final RMSNorm and rows [start, stop) of the tied embedding.
    `rank3`: the norm and the MatMul on the [1,1,hidden] input as it is (the RK3566 compiler put a CPU Transpose on
    each side of the norm's Pow / Mul of the flattened [1, hidden] form, and none at rank 3: toolkit 2.3.2, small
    model)."""

    def __init__(self, decoder: nn.Module, start: int, stop: int, rank3: bool = False):
        super().__init__()
        self.norm, self.rank3 = decoder.model.norm, rank3
        self.register_buffer("rows", decoder.lm_head.weight.detach()[start:stop].clone(), persistent=False)

    def forward(self, hidden):
        if self.rank3:
            return torch.matmul(rms_norm(self.norm, hidden), self.rows.T)[0]
        return torch.matmul(rms_norm(self.norm, hidden.flatten(0, 1)), self.rows.T)


def shard_ranges(vocab: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous row ranges covering the vocabulary, sizes differing by at most one."""
    bounds = [vocab * i // shards for i in range(shards + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class _StepLayer(nn.Module):
    """One layer's decode step over the CPU-owned cache *without* this token's row, plus that row: scores over the
    cache rows and over the new row, one softmax over their Concat (two score vectors, not cache buffers: rk3576
    and rk3588 keep it on the NPU), and the new K/V returned for the CPU to write in place after the call."""

    def __init__(self, decoder: nn.Module, layer_index: int, layout: Layout = Layout()):
        super().__init__()
        config = decoder.config
        self.layer = decoder.model.layers[layer_index]
        self.heads = _RotaryHeads(config.num_attention_heads, config.hidden_size // config.num_attention_heads)
        self.heads_by_weights, self.row_sum = layout.heads_by_weights, layout.step_row_sum

    def _project(self, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """The token's [heads, 1, head_dim]: with `heads_by_weights` from [1, 1, hidden] by one batched MatMul with
        the per-head weights [heads, hidden, head_dim] (the RK3566 compiler ran the Reshape of [1, heads * head_dim]
        on its CPU), else from [1, hidden] by the projection and a plain Reshape (one token: no Transpose)."""
        heads, head_dim = self.heads.heads, self.heads.head_dim
        if not self.heads_by_weights:
            return linear(x).reshape(heads, 1, head_dim)
        weight = linear.weight.T.reshape(-1, heads, head_dim).transpose(0, 1)
        projected = torch.matmul(x, weight)
        return projected if linear.bias is None else projected + linear.bias.reshape(heads, 1, head_dim)

    @staticmethod
    def _own_first_attention(own, cached, full_v, value):
        """softmax([own | cached]) @ [value ; full_v] divided by the weights' row sum (1 here; the RK3566 form runs
        the Softmax as a bare exp, `surgery.graph.attention.softmax_as_row_max_exp`), no Concat of the buffers. The
        own score comes first: every row is then real keys before masked ones, as a causal prefill row is (the row max tree's
        rounding depends on that order). A constant [Smax, 8] ones-column MatMul sums the cached weights (no
        ReduceSum: its CPU Transpose)."""
        weights = torch.softmax(torch.cat([own, cached], dim=-1), dim=-1)
        mine, theirs = weights[..., :1], weights[..., 1:]
        ones = torch.zeros(full_v.shape[1], 8, dtype=theirs.dtype)
        ones[:, 0] = 1.0
        return (torch.matmul(theirs, full_v) + mine * value) / (torch.matmul(theirs, ones)[..., :1] + mine)

    def forward(self, h, full_k, full_v, cos, sin, mask):
        attn, scale = self.layer.self_attn, 1.0 / math.sqrt(self.heads.head_dim)
        x = rms_norm(self.layer.input_layernorm, h)
        q = self.heads.rope(self._project(attn.q_proj, x), cos, sin)
        key = self.heads.rope(self._project(attn.k_proj, x), cos, sin)
        value = self._project(attn.v_proj, x)
        # the buffer as the MatMul's left operand ([heads, Smax, 1], a plain Reshape to the mask's row): the layout
        # the toolkit picks itself for q @ K^T in a fixed-shape graph, but not with dynamic_input, where q @ K^T
        # cost the small step 7-13% more cycles on rk3576 (`--ladder dynamic`; fixed-shape engines unchanged)
        cached = torch.matmul(full_k, q.transpose(1, 2)).reshape(mask.shape) * scale + mask  # [heads, 1, Smax]
        if self.heads_by_weights:  # a ReduceSum over the last axis got a CPU Transpose on the RK3566
            own = torch.matmul(q, key.transpose(1, 2)) * scale  # [heads, 1, 1]
        else:
            own = (q * key).sum(-1, keepdim=True) * scale
        smax = full_k.shape[1]
        if self.row_sum:
            out = self._own_first_attention(own, cached, full_v, value)
        else:
            weights = torch.softmax(torch.cat([cached, own], dim=-1), dim=-1)
            out = torch.matmul(weights[..., :smax], full_v) + weights[..., smax:] * value
        h = h + attn.o_proj(out.reshape(h.shape))
        return h + self.layer.mlp(rms_norm(self.layer.post_attention_layernorm, h)), key, value


class StepGraph(nn.Module):
    """One decode step of `layers` (default: every layer, the one call per token of a K/V bucket): hidden
    [1,1,H], cos, sin [1, hd], mask [heads, 1, Smax] (this position still masked), full_k_i / full_v_i
    [heads, Smax, hd] per layer (this position not yet written) -> hidden_out (or, with `head`, logits [1, vocab]
    through the final norm and the tied LM head), key_delta_i, value_delta_i [heads, 1, hd] per layer. A subset
    of `layers` and `head` are the layouts bench/audio8.py measures against the default."""

    def __init__(self, decoder: nn.Module, layers=None, head: bool = False, layout: Layout = Layout()):
        super().__init__()
        indices = range(decoder.config.num_hidden_layers) if layers is None else layers
        self.layers = nn.ModuleList(_StepLayer(decoder, i, layout) for i in indices)
        self.rank3 = layout.heads_by_weights
        self.head = HeadShardGraph(decoder, 0, decoder.config.vocab_size) if head else None

    def forward(self, hidden, cos, sin, mask, *caches):
        # [1, hidden], or with heads by weights [1, 1, hidden] as fed (the RK3566 compiler put CPU Transposes around
        # the rank-2 form's norms and projections, as in the head shards)
        h, deltas = (hidden if self.rank3 else hidden.flatten(0, 1)), []
        for index, layer in enumerate(self.layers):
            h, key, value = layer(h, caches[2 * index], caches[2 * index + 1], cos, sin, mask)
            deltas += [key, value]
        h = h if self.rank3 else h.unsqueeze(0)
        first = self.head(h) if self.head is not None else h
        return (first, *deltas)


def step_input_names(layers: int) -> list[str]:
    """The step graph's inputs in order: the token, its RoPE row, the mask, then each layer's K and V buffers."""
    return ["hidden", "cos", "sin", "mask", *[f"{kind}_{i}" for i in range(layers) for kind in ("full_k", "full_v")]]


def step_buffer_names(input_names) -> list[str]:
    """Of a decode step's inputs, those the CPU holds from token to token and writes in place: the mask and the K/V
    buffers (`full_*`)."""
    return [name for name in input_names if name == "mask" or name.startswith("full_")]


def step_output_names(layers: int, head: bool = False) -> list[str]:
    return ["logits" if head else "hidden_out", *[f"{kind}_{i}" for i in range(layers)
                                                  for kind in ("key_delta", "value_delta")]]

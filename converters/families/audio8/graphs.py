"""The fixed-shape torch graphs the NPU runs, built around the reference model's own modules.

The decoder is cut so that no graph owns a cache: K/V live on the CPU in rank-3 buffers [heads, Smax,
head_dim] per layer, the K/V projection graph returns this token's rows, the CPU writes them in place, and
the block graph reads the whole buffer with a CPU-made additive mask. RoPE's rotate-half is a constant
signed permutation matmul, so no graph needs Concat."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

MASKED = -1.0e4  # additive mask value: exp underflows to 0 in fp16 and fp32, and it stays finite in fp16


def rotate_half_matrix(head_dim: int) -> np.ndarray:
    """R with x @ R == rotate_half(x) == [-x2, x1] (halves of the last axis)."""
    half = head_dim // 2
    matrix = np.zeros((head_dim, head_dim), dtype=np.float32)
    matrix[np.arange(half) + half, np.arange(half)] = -1.0
    matrix[np.arange(half), np.arange(half) + half] = 1.0
    return matrix


def pooling_matrix(source: int, target: int) -> np.ndarray:
    """P [target, source] with P @ x == adaptive average pooling of x's rows to `target` rows."""
    matrix = np.zeros((target, source), dtype=np.float64)
    for row in range(target):
        start = (row * source) // target
        stop = -((-(row + 1) * source) // target)
        matrix[row, start:stop] = 1.0 / (stop - start)
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


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Qwen2RMSNorm as x / sqrt(mean(x^2) + eps) * weight: the exported rsqrt (Div of 1 by Sqrt) runs on the
    CPU in rknn-toolkit2 2.3.2 (rk3576), a tensor-by-tensor Div stays on the NPU. Its placement does not hang
    on the weights: identity weights (onnxslim then folds the Mul away) compile to the same CPU ops as perturbed
    ones on rk3588 and rk3576, where the rsqrt form's Divs go to the CPU (tests/audio8/test_norm_placement.py)."""
    return norm.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


def _attention(q, k, v, mask, head_dim):
    scores = torch.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(head_dim)) + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class AdapterGraph(nn.Module):
    """audio_hidden [tokens, in] -> audio_embeddings [T, out], pooling as the constant matrix for T."""

    def __init__(self, adapter: nn.Module, source_tokens: int, target_tokens: int):
        super().__init__()
        self.adapter = adapter
        self.register_buffer("pool", torch.from_numpy(pooling_matrix(source_tokens, target_tokens).astype(np.float32)),
                             persistent=False)

    def forward(self, audio_hidden):
        return self.adapter.project(torch.matmul(self.pool, self.adapter.mix(audio_hidden)))


class PrefillGraph(nn.Module):
    """inputs_embeds [1, S, hidden], cos, sin [S, head_dim] -> last_logits [1, vocab], key_i / value_i
    [heads, S, head_dim] (RoPE applied). cos/sin are inputs, not constants: rknn-toolkit2 2.3.2 tries to fuse
    a constant [S, head_dim] Mul into the rotate-half MatMul and fails ('operands could not be broadcast')."""

    def __init__(self, decoder: nn.Module, length: int):
        super().__init__()
        config = decoder.config
        self.decoder = decoder
        self.heads = _RotaryHeads(config.num_attention_heads, config.hidden_size // config.num_attention_heads)
        causal = np.triu(np.full((length, length), MASKED, dtype=np.float32), k=1)
        self.register_buffer("mask", torch.from_numpy(causal)[None], persistent=False)

    def forward(self, inputs_embeds, cos, sin):
        inner = self.decoder.model
        h = inputs_embeds.flatten(0, 1)
        caches = []
        for layer in inner.layers:
            attn = layer.self_attn
            x = rms_norm(layer.input_layernorm, h)
            q = self.heads.rope(self.heads.split(attn.q_proj(x)), cos, sin)
            k = self.heads.rope(self.heads.split(attn.k_proj(x)), cos, sin)
            v = self.heads.split(attn.v_proj(x))
            out = _attention(q, k, v, self.mask, self.heads.head_dim)
            h = h + attn.o_proj(out.transpose(0, 1).reshape(h.shape))
            h = h + layer.mlp(rms_norm(layer.post_attention_layernorm, h))
            caches += [k, v]
        last = rms_norm(inner.norm, h[-1:])
        return (self.decoder.lm_head(last), *caches)


class KVProjectionGraph(nn.Module):
    """hidden [1,1,hidden], cos, sin [1, head_dim] -> key_delta, value_delta [heads, 1, head_dim] of one layer."""

    def __init__(self, decoder: nn.Module, layer_index: int):
        super().__init__()
        config = decoder.config
        self.layer = decoder.model.layers[layer_index]
        self.heads = _RotaryHeads(config.num_attention_heads, config.hidden_size // config.num_attention_heads)

    def forward(self, hidden, cos, sin):
        x = rms_norm(self.layer.input_layernorm, hidden.flatten(0, 1))
        attn = self.layer.self_attn
        key = self.heads.rope(self.heads.split(attn.k_proj(x)), cos, sin)
        return key, self.heads.split(attn.v_proj(x))


class BlockGraph(nn.Module):
    """hidden, full_k/full_v [heads, Smax, head_dim], cos, sin, mask [heads, 1, Smax] -> hidden_out: one layer's
    attention over the CPU-owned buffers (this token's K/V already written) and its MLP."""

    def __init__(self, decoder: nn.Module, layer_index: int):
        super().__init__()
        config = decoder.config
        self.layer = decoder.model.layers[layer_index]
        self.heads = _RotaryHeads(config.num_attention_heads, config.hidden_size // config.num_attention_heads)

    def forward(self, hidden, full_k, full_v, cos, sin, mask):
        h = hidden.flatten(0, 1)
        attn = self.layer.self_attn
        q = self.heads.rope(self.heads.split(attn.q_proj(rms_norm(self.layer.input_layernorm, h))), cos, sin)
        out = _attention(q, full_k, full_v, mask, self.heads.head_dim)
        h = h + attn.o_proj(out.transpose(0, 1).reshape(h.shape))
        h = h + self.layer.mlp(rms_norm(self.layer.post_attention_layernorm, h))
        return h.unsqueeze(0)


class HeadShardGraph(nn.Module):
    """hidden [1,1,hidden] -> logits [1, rows]: final RMSNorm and rows [start, stop) of the tied embedding."""

    def __init__(self, decoder: nn.Module, start: int, stop: int):
        super().__init__()
        self.norm = decoder.model.norm
        self.register_buffer("rows", decoder.lm_head.weight.detach()[start:stop].clone(), persistent=False)

    def forward(self, hidden):
        return torch.matmul(rms_norm(self.norm, hidden.flatten(0, 1)), self.rows.T)


def shard_ranges(vocab: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous row ranges covering the vocabulary, sizes differing by at most one."""
    bounds = [vocab * i // shards for i in range(shards + 1)]
    return list(zip(bounds[:-1], bounds[1:]))

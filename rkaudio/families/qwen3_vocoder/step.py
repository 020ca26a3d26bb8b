"""The Qwen3-TTS 12 Hz speech-tokenizer decoder as one stateful streaming step.

`StreamingDecoder` holds the same parameters, under the same state-dict names, as the package's
`Qwen3TTSTokenizerV2Decoder`, and decodes `B` code frames from a flat fp32 cache: every causal-conv
tail, every transposed-conv input tail and the sliding-window K/V history (plus one validity flag per
history slot, so an all-zero cache is the start of a stream). The cache layout depends on the config
only, never on `B`, so a B=16 step's cache feeds a B=64 step.

Why a step and not windows: every part of this decoder is causal (left-padded convs, transposed convs
trimmed on the right, causal sliding-window attention), so carrying the left state through the graph
reproduces one full-length decode exactly, with no seams and no re-decoded context.

Everything is fixed-shape and built from constants the exporter folds: RoPE tables use positions
relative to the window (RoPE scores depend only on position differences), masks are precomputed
additive masks, and Snake's exp(alpha)/1/exp(beta) fold to per-channel constants.

Shaped for the rk3588 compiler (each choice measured on the real-shape graph, see the classes here and in
cache.py, the cache layout and the convs that read it): the quantizer and pre-conv stay time-major, the
signal after the transformer travels as rows of a few code frames (no axis past the 13-bit field),
transposed convs are polyphase convs, and the SnakeBeta sine can be the NPU's native-rounding polynomial
(`with_sine_form`)."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from rkaudio.families.qwen3_vocoder.cache import (HALO_FORMS, CacheLayout, RowCausalConv, RowTransposedConv,
                                                    TimeMajorCausalConv, aligned_slots)
from rkaudio.board.qwen3_vocoder import StepContract
from rkaudio.board.soc import ROW_SAMPLES_LIMIT
from rkaudio.surgery.modules.snake import ROUND_SHIFT_FP32, half_turn_sin2, reduce_snake_sine

# The engine's `codes` input: code ids as floats (see Quantizer), named in the contract for the runtime.
CODES_DTYPE = "float32"
FP16_EXACT_INTEGERS = 2048  # every integer up to 2^11 is exact in fp16
# Additive mask value: exp(-1e4) is exactly 0 in fp32 and the value stays finite in fp16.
MASK_NEGATIVE = 1.0e4


def decoder_dims(config: dict) -> dict:
    """The figures of a decoder config the step needs (package defaults for absent keys)."""
    hidden = int(config.get("hidden_size", 1024))
    heads = int(config.get("num_attention_heads", 16))
    if "codebook_dim" not in config:
        raise KeyError("codebook_dim")
    return {
        "codebook_size": int(config.get("codebook_size", 2048)),
        "codebook_dim": int(config["codebook_dim"]),
        "num_quantizers": int(config.get("num_quantizers", 16)),
        "latent_dim": int(config.get("latent_dim", 1024)),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads", 16)),
        "head_dim": int(config.get("head_dim") or hidden // heads),
        "intermediate_size": int(config.get("intermediate_size", 3072)),
        "layers": int(config.get("num_hidden_layers", 8)),
        "sliding_window": int(config.get("sliding_window", 72)),
        "rope_theta": float(config.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(config.get("rms_norm_eps", 1e-5)),
        "attention_bias": bool(config.get("attention_bias", False)),
        "hidden_act": str(config.get("hidden_act", "silu")),
        "upsample_rates": [int(r) for r in config.get("upsample_rates", (8, 5, 4, 3))],
        "upsampling_ratios": [int(r) for r in config.get("upsampling_ratios", (2, 2))],
        "decoder_dim": int(config.get("decoder_dim", 1536)),
    }


# ---------------------------------------------------------------- stateful building blocks

# Degree of the round sine form's polynomial: degree 6 left the real-shape decoder (30 Snakes) at 44.5 dB from
# the exact sine in fp32; 8 adds one multiply-add per Snake and 31 dB at the sine.
ROUND_SINE_DEGREE = 8


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, with the same parameters as the package's SnakeBeta. With
    w = x * e^alpha / pi it is x + (pi / e^beta) * h(w), h(w) = sin(pi*w)^2/pi, evaluated in
    `sine_form` (rkaudio.surgery.modules.snake: the NPU has no Sin on rk3588; `round` is its native-rounding polynomial)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.sine_form = "exact"
        self.register_buffer("round_shift", torch.tensor(ROUND_SHIFT_FP32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        half_turns = (torch.exp(self.alpha) / math.pi).reshape(shape)
        magnitude = (math.pi / (torch.exp(self.beta) + 1e-9)).reshape(shape)
        return x + magnitude * half_turn_sin2(x * half_turns, self.sine_form, self.round_shift, ROUND_SINE_DEGREE)


class ConvNeXtBlock(nn.Module):
    def __init__(self, layout: CacheLayout, name: str, dim: int):
        super().__init__()
        self.dwconv = RowCausalConv(layout, name, dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x, state, new_state):
        h = self.dwconv(x, state, new_state).permute(0, 2, 3, 1)  # channels last for the norm and the MLP
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).permute(0, 3, 1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, layout: CacheLayout, name: str, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = RowCausalConv(layout, name, dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = RowCausalConv(layout, name + ".pointwise", dim, dim, 1)

    def forward(self, x, state, new_state):
        h = self.conv1(self.act1(x), state, new_state)
        return x + self.conv2(self.act2(h), state, new_state)


class DecoderBlock(nn.Module):
    def __init__(self, layout: CacheLayout, name: str, cin: int, cout: int, rate: int):
        super().__init__()
        blocks = [SnakeBeta(cin), RowTransposedConv(layout, name + ".up", cin, cout, 2 * rate, rate)]
        blocks += [ResidualUnit(layout, f"{name}.res{d}", cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList(blocks)

    def forward(self, x, state, new_state):
        x = self.block[0](x)
        x = self.block[1](x, state, new_state)
        for unit in self.block[2:]:
            x = unit(x, state, new_state)
        return x


class RMSNorm(nn.Module):
    """The package's RMSNorm written as weight * (x / sqrt(mean(x^2) + eps)). Its `rsqrt` exports as Div(1, Sqrt),
    whose placement hangs on the weight after it: with weights exactly 1 (a freshly initialised checkpoint) the
    fold drops that Mul and the Div lands on the CPU (rknn-toolkit2 2.3.2, every fp16 target; the real-shape
    B=16 step: 35 CPU ops instead of 18). The tensor-by-tensor Div stays on the NPU with or without the weight
    (measured per target, 2.3.2 and 2.5.0: tests/families/qwen3_vocoder/test_norm_placement.py); Pow(-0.5) does too but
    costs rk3566/rk3568 one more CPU Transpose. The square is x * x: Pow(x, 2) put a Transpose beside every norm on the
    rk3566 CPU (5 in the tiny B=64 step; rk3588 and rk3576 none either way)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x):
        return self.scale * x


class Attention(nn.Module):
    def __init__(self, dims: dict):
        super().__init__()
        hidden, heads, kv_heads, head_dim = dims["hidden_size"], dims["heads"], dims["kv_heads"], dims["head_dim"]
        bias = dims["attention_bias"]
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def forward(self, x, k_history, v_history, rope, mask):
        """x [1,B,hidden]; histories [1,kv_heads,kv_len,head_dim] of un-rotated keys / values."""
        frames = x.shape[1]
        q = self.q_proj(x).view(1, frames, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(1, frames, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, frames, self.kv_heads, self.head_dim).transpose(1, 2)
        k_all = torch.cat([k_history, k], dim=2)
        v_all = torch.cat([v_history, v], dim=2)
        cos, sin = rope
        kv_len = k_history.shape[2]
        q = _rotate(q, cos[kv_len:], sin[kv_len:])
        k_rot = _rotate(k_all, cos, sin)
        if self.heads != self.kv_heads:
            group = self.heads // self.kv_heads
            k_rot = k_rot.repeat_interleave(group, dim=1)
            v_rep = v_all.repeat_interleave(group, dim=1)
        else:
            v_rep = v_all
        pad = int(mask.shape[-1]) - int(k_rot.shape[2])  # python ints: the graph stays fixed-shape
        if pad:  # zero keys and values the mask hides, aligning the window (Transformer.key_multiple)
            zeros = k_rot.new_zeros(1, k_rot.shape[1], pad, self.head_dim)
            k_rot, v_rep = torch.cat([k_rot, zeros], dim=2), torch.cat([v_rep, zeros], dim=2)
        scores = torch.matmul(q, k_rot.transpose(2, 3)) * self.head_dim**-0.5 + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), v_rep)
        out = out.transpose(1, 2).reshape(1, frames, self.heads * self.head_dim)
        return self.o_proj(out), k_all[:, :, -kv_len:], v_all[:, :, -kv_len:]


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Mlp(nn.Module):
    def __init__(self, dims: dict):
        super().__init__()
        if dims["hidden_act"] != "silu":
            raise ValueError(f"hidden_act {dims['hidden_act']!r}: the step implements silu (the released config)")
        self.gate_proj = nn.Linear(dims["hidden_size"], dims["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(dims["hidden_size"], dims["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(dims["intermediate_size"], dims["hidden_size"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, dims: dict):
        super().__init__()
        self.self_attn = Attention(dims)
        self.mlp = Mlp(dims)
        self.input_layernorm = RMSNorm(dims["hidden_size"], dims["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(dims["hidden_size"], dims["rms_norm_eps"])
        self.self_attn_layer_scale = LayerScale(dims["hidden_size"])
        self.mlp_layer_scale = LayerScale(dims["hidden_size"])

    def forward(self, x, k_history, v_history, rope, mask):
        attended, k_new, v_new = self.self_attn(self.input_layernorm(x), k_history, v_history, rope, mask)
        x = x + self.self_attn_layer_scale(attended)
        x = x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))
        return x, k_new, v_new


class Transformer(nn.Module):
    """Mirrors `pre_transformer`: sliding-window attention whose K/V history lives in the cache."""

    def __init__(self, layout: CacheLayout, dims: dict):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(dims) for _ in range(dims["layers"])])
        self.norm = RMSNorm(dims["hidden_size"], dims["rms_norm_eps"])
        self.input_proj = nn.Linear(dims["latent_dim"], dims["hidden_size"])
        self.output_proj = nn.Linear(dims["hidden_size"], dims["latent_dim"])
        # The window holds `sliding_window` keys including the current one: the history is one less.
        self.kv_len = dims["sliding_window"] - 1
        self.head_dim = dims["head_dim"]
        self.rope_theta = dims["rope_theta"]
        # Keys per attention window (history + current frames), padded with masked zero keys to a multiple of this
        # (`StreamingDecoder.with_key_multiple`); 1: no padding.
        self.key_multiple = 1
        history = (1, dims["kv_heads"], self.kv_len, dims["head_dim"])
        # The flags entry fills its aligned slots (the oldest flags past kv_len unread), so the cache join has no zero
        # piece after it: 71 flags and 9 zeros put the whole join on the CPU (rk3588 and rk3576, real shape).
        self.valid_slots = aligned_slots(self.kv_len)
        self.valid = layout.add("attention.valid", (self.valid_slots,))
        self.history = [(layout.add(f"layer{i}.k", history), layout.add(f"layer{i}.v", history))
                        for i in range(dims["layers"])]

    def rope_tables(self, length: int):
        """cos/sin for positions 0..length-1 of the window (history first), computed as the package does."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** exponents)
        freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos(), angles.sin()

    def mask(self, frames: int, valid_history: torch.Tensor) -> torch.Tensor:
        """Additive mask [1,1,B,kv_len+B], its key axis padded to a multiple of `key_multiple`: query i (window
        position kv_len+i) sees keys i..kv_len+i that hold a real frame (history slots of a fresh stream are
        flagged 0; padding keys lie past every query's band)."""
        window = self.kv_len + int(frames)  # python ints: the graph stays fixed-shape
        padded = -(-window // self.key_multiple) * self.key_multiple
        keys = torch.arange(padded)[None, :]
        queries = torch.arange(frames)[:, None]
        band = ((keys >= queries) & (keys <= queries + self.kv_len)).float()
        valid = torch.cat([valid_history, torch.ones(frames)] + [torch.zeros(padded - window)] * (padded > window))
        return ((band * valid[None, :] - 1.0) * MASK_NEGATIVE)[None, None]

    def forward(self, x, state, new_state, rows: int):
        """x [1,B,latent] -> [1, rows, B/rows, latent]: the output already in the decoder's rows, time-major."""
        frames = x.shape[1]
        rope = self.rope_tables(self.kv_len + frames)
        valid_flags = state[self.valid]
        mask = self.mask(frames, valid_flags[-self.kv_len :])
        h = self.input_proj(x)
        for layer, (k_name, v_name) in zip(self.layers, self.history):
            h, new_state[k_name], new_state[v_name] = layer(h, state[k_name], state[v_name], rope, mask)
        new_state[self.valid] = torch.cat([valid_flags, torch.ones(frames)])[-self.valid_slots :]
        return self.output_proj(self.norm(h.reshape(1, rows, int(frames) // rows, int(h.shape[-1]))))


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _CodebookHolder(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, count: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_CodebookHolder(size, dim) for _ in range(count)])


class QuantizerGroup(nn.Module):
    """Mirrors one `ResidualVectorQuantizer` (input_proj is unused when decoding but part of the state dict)."""

    def __init__(self, count: int, size: int, dim: int, outer_dim: int):
        super().__init__()
        self.vq = _Layers(count, size, dim)
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)

    def table(self) -> torch.Tensor:
        return torch.cat([holder._codebook.table() for holder in self.vq.layers])


class Quantizer(nn.Module):
    """Codes -> embeddings: every code one-hot against its codebook's ids, one batched MatMul with the stacked
    tables, then per group the sum and the group's 1x1 projection. The codes come as floats (CODES_DTYPE): an
    index Gather, and the Add of per-codebook offsets and the Cast before any float op on int64 codes, run on the
    CPU (rk3588, 2.3.2: the Add and the Gather in every step). One-hot as relu(1 - |code - id|) is exact in fp16
    for ids under 2048 (integers stay exact) and exactly 0 or 1, so each embedding is its table row. The codes
    tensor is never sliced: the toolkit rewrote slices of it into a Split whose sizes it got wrong (rk3588, B=64:
    sizes summing to 226 for 16 rows, then garbage indices and inf)."""

    def __init__(self, dims: dict):
        super().__init__()
        size, outer = dims["codebook_size"], dims["codebook_dim"]
        if size > FP16_EXACT_INTEGERS:
            raise ValueError(f"codebook_size {size}: code ids past {FP16_EXACT_INTEGERS} are not exact in fp16")
        self.rvq_first = QuantizerGroup(1, size, outer // 2, outer)
        self.rvq_rest = QuantizerGroup(dims["num_quantizers"] - 1, size, outer // 2, outer)
        self.register_buffer("ids", torch.arange(size, dtype=torch.float32), persistent=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [1,K,B] (code ids, any numeric dtype) -> [1,B,codebook_dim] (time-major)."""
        quantizers, frames = (int(d) for d in codes.shape[1:])
        size = int(self.ids.shape[0])
        tables = torch.cat([self.rvq_first.table(), self.rvq_rest.table()]).reshape(quantizers, size, -1)
        ids = codes.to(torch.float32).reshape(quantizers, frames, 1)
        one_hot = torch.relu(1.0 - (ids - self.ids).abs())  # [K, B, size]
        embedded = torch.matmul(one_hot, tables)  # [K, B, dim]
        first = F.linear(embedded[0], self.rvq_first.output_proj.weight[:, :, 0])
        # the rest's sum over codebooks as a chain of Adds: a ReduceSum there ran on the CPU (the rk3588 dynamic ladder;
        # the rk3566 static steps, with 2 layout changes around it), and a MatMul with ones over [K-1, B*dim] holds a
        # 16,384 axis at the real shape's B=64 (the quantizer alone: rk3566 24 REGTASK lines, rk3588 9; the chain 0)
        summed = embedded[1]
        for codebook in range(2, quantizers):
            summed = summed + embedded[codebook]
        rest = F.linear(summed, self.rvq_rest.output_proj.weight[:, :, 0])
        return (first + rest)[None]


class StreamingDecoder(nn.Module):
    """(codes [1,K,B] code ids, cache [N] fp32) -> (pcm [1, B*samples_per_frame], cache [N]).

    After the transformer the signal travels as rows of `frames_per_row(B)` code frames, so that no time axis
    in the graph exceeds `row_samples_limit` samples (see ROW_SAMPLES_LIMIT)."""

    def __init__(self, config: dict, row_samples_limit: int = ROW_SAMPLES_LIMIT):
        super().__init__()
        dims = decoder_dims(config)
        self.dims = dims
        self.layout = CacheLayout()
        layout = self.layout
        latent = dims["latent_dim"]
        self.quantizer = Quantizer(dims)
        self.pre_conv = TimeMajorCausalConv(layout, "pre_conv", dims["codebook_dim"], latent, 3)
        self.pre_transformer = Transformer(layout, dims)
        self.upsample = nn.ModuleList(
            nn.ModuleList([RowTransposedConv(layout, f"upsample{i}.up", latent, latent, factor, factor),
                           ConvNeXtBlock(layout, f"upsample{i}.convnext", latent)])
            for i, factor in enumerate(dims["upsampling_ratios"]))
        width = dims["decoder_dim"]
        decoder = [RowCausalConv(layout, "decoder.in", latent, width, 7)]
        for i, rate in enumerate(dims["upsample_rates"]):
            decoder.append(DecoderBlock(layout, f"decoder.block{i}", width // 2**i, width // 2 ** (i + 1), rate))
        out_dim = width // 2 ** len(dims["upsample_rates"])
        decoder += [SnakeBeta(out_dim), RowCausalConv(layout, "decoder.out", out_dim, 1, 7)]
        self.decoder = nn.ModuleList(decoder)
        self.samples_per_frame = math.prod(dims["upsample_rates"] + dims["upsampling_ratios"])
        # The longest axis is a sample-rate row extended by the widest halo at that rate.
        sample_rate_convs = [*self.decoder[-3].modules(), self.decoder[-1]]
        final_context = max(c.context for c in sample_rate_convs if isinstance(c, RowCausalConv))
        self.row_samples_limit = row_samples_limit
        self.max_frames_per_row = max(1, (row_samples_limit - final_context) // self.samples_per_frame)

    def frames_per_row(self, frames: int) -> int:
        """The longest row (in code frames) that divides `frames` and keeps every axis within the limit."""
        return max(d for d in range(1, min(frames, self.max_frames_per_row) + 1) if frames % d == 0)

    def with_sine_form(self, form: str) -> "StreamingDecoder":
        """A copy whose SnakeBeta sines are evaluated in `form` (rkaudio.surgery.modules.snake.SINE_FORMS)."""
        return reduce_snake_sine(self, form)

    def with_halo_form(self, form: str) -> "StreamingDecoder":
        """A copy whose row convs meet their halos in `form` (rkaudio.families.qwen3_vocoder.cache.HALO_FORMS; the same
        outputs and cache)."""
        if form not in HALO_FORMS:
            raise ValueError(f"halo form {form!r}: one of {', '.join(HALO_FORMS)}")
        shaped = copy.deepcopy(self)
        for module in shaped.modules():
            if isinstance(module, (RowCausalConv, RowTransposedConv)):
                module.halo_form = form
        return shaped

    def with_key_multiple(self, multiple: int) -> "StreamingDecoder":
        """A copy whose attention windows are padded with masked zero keys to a multiple of `multiple` keys (the
        same outputs and cache: a masked key weighs exactly 0)."""
        padded = copy.deepcopy(self)
        padded.pre_transformer.key_multiple = multiple
        return padded

    @property
    def cache_numel(self) -> int:
        return self.layout.numel

    @property
    def kv_len(self) -> int:
        return self.pre_transformer.kv_len

    def zero_cache(self) -> torch.Tensor:
        return torch.zeros(self.cache_numel)

    def forward(self, codes: torch.Tensor, cache: torch.Tensor):
        state, new_state = self.layout.split(cache), {}
        frames = int(codes.shape[-1])
        hidden = self.pre_conv(self.quantizer(codes), state, new_state)
        rows = frames // self.frames_per_row(frames)
        # split into rows while time-major, before the output projection: [1, latent, B] reshaped into rows after it
        # was a CPU Reshape on rk3588 (the real-shape B=16 step's last one; the tiny step with 4 rows alike)
        hidden = self.pre_transformer(hidden, state, new_state, rows).permute(0, 3, 1, 2)
        for transposed, convnext in self.upsample:
            hidden = convnext(transposed(hidden, state, new_state), state, new_state)
        wav = self.decoder[0](hidden, state, new_state)
        for block in self.decoder[1:-2]:
            wav = block(wav, state, new_state)
        wav = self.decoder[-1](self.decoder[-2](wav), state, new_state)
        pcm = wav.clamp(-1.0, 1.0).reshape(1, -1)
        return pcm, self.layout.join(new_state)

    def contract_fields(self, frames: int, sine_form: str, halo_form: str) -> StepContract:
        """What the runtime and the conversion stage read back instead of restating, for a step of `frames` code
        frames whose SnakeBeta sines are evaluated in `sine_form` and whose row convs meet their halos in
        `halo_form`."""
        return StepContract(frames=frames, cache_numel=self.cache_numel, samples_per_frame=self.samples_per_frame,
                            num_quantizers=self.dims["num_quantizers"], head_dim=self.dims["head_dim"],
                            kv_len=self.kv_len, kv_heads=self.dims["kv_heads"], cache_layout=self.layout.to_json(),
                            codes_dtype=CODES_DTYPE, row_samples_limit=self.row_samples_limit,
                            sine_degree=ROUND_SINE_DEGREE, sine_form=sine_form, halo_form=halo_form)


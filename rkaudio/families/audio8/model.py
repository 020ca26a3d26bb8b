"""Audio8-ASR in torch: audio encoder, adapter, and a stock transformers Qwen2ForCausalLM decoder.

Attribute names follow the upstream remote code (`encoder`, `adapter`, `decoder`; Qwen3-ASR-style encoder
names inside), so the real snapshot's modules drop in where these random-init ones stand.
The encoder always sees 800 mel frames (8 s, zero-padded); the adapter pools its 104 tokens to exactly
the prompt's placeholder count N."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rkaudio.core.errors import SetupError

SAMPLE_RATE = 16_000
HOP = 160
MEL_BINS = 128
CHUNK_FRAMES = 100  # the encoder convolves each 100-frame chunk on its own


@dataclass
class EncoderConfig:
    num_mel_bins: int = MEL_BINS
    max_frames: int = 800
    chunk_frames: int = CHUNK_FRAMES
    downsample_hidden_size: int = 480
    d_model: int = 896
    encoder_layers: int = 18
    encoder_attention_heads: int = 14
    encoder_ffn_dim: int = 3584
    attention_window: int = 104
    output_dim: int = 1024

    @property
    def tokens_per_chunk(self) -> int:
        return _conv_len(_conv_len(_conv_len(self.chunk_frames)))

    @property
    def audio_tokens(self) -> int:
        return self.max_frames // self.chunk_frames * self.tokens_per_chunk


@dataclass
class AdapterConfig:
    input_dim: int = 1024
    hidden_dim: int = 4096
    num_blocks: int = 4
    output_dim: int = 512


@dataclass
class PromptConfig:
    """Token ids around the audio placeholders: S = len(prefix) + N + len(suffix) = N + 10."""

    prefix_ids: list[int] = field(default_factory=lambda: [151644, 872, 198, 151669])
    audio_token_id: int = 151676
    suffix_ids: list[int] = field(default_factory=lambda: [151670, 151645, 198, 151644, 77091, 198])
    eos_token_id: int = 151645


DECODER_REAL = dict(
    vocab_size=151936, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=32768, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151645, attention_dropout=0.0,
)


def _conv_len(length: int) -> int:
    """Output length of a 3-wide, stride-2, padding-1 convolution."""
    return (length - 1) // 2 + 1


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed sinusoidal positions [length, channels] (sin half, then cos half)."""
    log_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-log_increment * torch.arange(channels // 2, dtype=torch.float32))
    scaled = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class EncoderAttention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.num_heads, self.head_dim = heads, d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [windows, window, d]: attention inside each window (block-diagonal over the sequence)."""
        windows, length, d_model = x.shape

        def heads(t):
            return t.reshape(windows, length, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out_proj(out.transpose(1, 2).reshape(windows, length, d_model))


class EncoderLayer(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.self_attn = EncoderAttention(config.d_model, config.encoder_attention_heads)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    """input_features [mel, frames] -> audio_hidden [tokens, output_dim]."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        channels = config.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, channels, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        freq = _conv_len(_conv_len(_conv_len(config.num_mel_bins)))
        self.conv_out = nn.Linear(channels * freq, config.d_model, bias=False)
        self.register_buffer("positional_embedding", sinusoids(config.tokens_per_chunk, config.d_model),
                             persistent=False)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.ln_post = nn.LayerNorm(config.d_model)
        self.proj1 = nn.Linear(config.d_model, config.d_model)
        self.proj2 = nn.Linear(config.d_model, config.output_dim)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        mel, frames = input_features.shape
        chunks = frames // self.config.chunk_frames
        return self.forward_chunks(input_features.reshape(mel, chunks, self.config.chunk_frames).transpose(0, 1)
                                   .unsqueeze(1))

    def forward_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder after chunking: x [chunks, 1, mel, chunk_frames] -> audio_hidden [tokens, output_dim]."""
        config = self.config
        chunks = x.shape[0]
        x = self.downsample(x)
        x = x.permute(0, 3, 1, 2).reshape(chunks, config.tokens_per_chunk, -1)
        return self.encode_tokens(self.conv_out(x) + self.positional_embedding)

    def downsample(self, x: torch.Tensor) -> torch.Tensor:
        """[chunks, 1, mel, chunk_frames] -> [chunks, channels, freq, tokens_per_chunk]: the three strided convs."""
        x = F.gelu(self.conv2d1(x))
        x = F.gelu(self.conv2d2(x))
        return F.gelu(self.conv2d3(x))

    def encode_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The tokens [..., d_model] in order, chunk after chunk (positions embedded) -> audio_hidden [tokens,
        output_dim]: the windowed layers and the output projection."""
        config = self.config
        tokens = x.numel() // config.d_model
        x = x.reshape(tokens // config.attention_window, config.attention_window, config.d_model)
        for layer in self.layers:
            x = layer(x)
        x = self.ln_post(x.reshape(tokens, config.d_model))
        return self.proj2(F.gelu(self.proj1(x)))


class AdapterBlock(nn.Module):
    def __init__(self, config: AdapterConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.input_dim)
        self.fc1 = nn.Linear(config.input_dim, config.hidden_dim)
        self.fc2 = nn.Linear(config.hidden_dim, config.input_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Adapter(nn.Module):
    """audio_hidden [tokens, input_dim] -> audio_embeddings [N, output_dim], N = placeholder count."""

    def __init__(self, config: AdapterConfig):
        super().__init__()
        self.blocks = nn.ModuleList(AdapterBlock(config) for _ in range(config.num_blocks))
        self.norm = nn.LayerNorm(config.input_dim)
        self.out_norm = nn.LayerNorm(config.input_dim)
        self.out_proj = nn.Linear(config.input_dim, config.output_dim)

    def mix(self, audio_hidden: torch.Tensor) -> torch.Tensor:
        """Everything before the pooling."""
        x = audio_hidden
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the pooling."""
        return self.out_proj(self.out_norm(pooled))

    def forward(self, audio_hidden: torch.Tensor, tokens: int) -> torch.Tensor:
        pooled = F.adaptive_avg_pool1d(self.mix(audio_hidden).T.unsqueeze(0), tokens)[0].T
        return self.project(pooled)


class Audio8ASR(nn.Module):
    """The reference FP32 model the gates compare against: `encoder`, `adapter`, `decoder`."""

    def __init__(self, encoder: nn.Module, adapter: nn.Module, decoder: nn.Module, prompt: PromptConfig):
        super().__init__()
        self.encoder, self.adapter, self.decoder = encoder, adapter, decoder
        self.prompt = prompt

    def prompt_ids(self, placeholders: int) -> list[int]:
        p = self.prompt
        return [*p.prefix_ids, *[p.audio_token_id] * placeholders, *p.suffix_ids]

    @torch.no_grad()
    def prompt_embeddings(self, input_features: torch.Tensor, placeholders: int) -> torch.Tensor:
        """inputs_embeds [1, S, hidden] with the pooled audio rows at the placeholder positions."""
        ids = torch.tensor(self.prompt_ids(placeholders))
        embeds = self.decoder.get_input_embeddings()(ids).clone()
        audio = self.adapter(self.encoder(input_features), placeholders)
        embeds[ids == self.prompt.audio_token_id] = audio
        return embeds.unsqueeze(0)

    @torch.no_grad()
    def greedy(self, inputs_embeds: torch.Tensor, max_new_tokens: int, with_logits: bool = False):
        """The decoder's own `generate`: greedy, stops after EOS (EOS included). With `with_logits`, also the
        logits [tokens, vocab] each token was chosen from."""
        eos = self.prompt.eos_token_id
        out = self.decoder.generate(inputs_embeds=inputs_embeds, attention_mask=torch.ones(inputs_embeds.shape[:2],
                                    dtype=torch.long), max_new_tokens=max_new_tokens, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos, output_logits=with_logits,
                                    return_dict_in_generate=True)
        tokens = out.sequences[0].tolist()
        if not with_logits:
            return tokens
        return tokens, torch.cat(out.logits).float().numpy()

    @torch.no_grad()
    def forced_greedy(self, inputs_embeds: torch.Tensor, new_tokens: int, with_logits: bool = False,
                      embed=None):
        """Greedy for exactly `new_tokens` steps, EOS fed back like any token (the stress reference). With
        `with_logits`, also the logits [new_tokens, vocab] each token was chosen from. `embed(token)`: the
        [hidden] row fed back for a token (default: this model's table)."""
        out = self.decoder(inputs_embeds=inputs_embeds, use_cache=True)
        logits = [out.logits[0, -1]]
        tokens = [int(logits[-1].argmax())]
        cache = out.past_key_values
        while len(tokens) < new_tokens:
            fed = {"input_ids": torch.tensor([[tokens[-1]]])} if embed is None else {
                "inputs_embeds": torch.from_numpy(np.asarray(embed(tokens[-1]), dtype=np.float32)).reshape(1, 1, -1)}
            out = self.decoder(**fed, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[0, -1])
            tokens.append(int(logits[-1].argmax()))
        return (tokens, torch.stack(logits).numpy()) if with_logits else tokens

    @torch.no_grad()
    def teacher_forced_logits(self, inputs_embeds: torch.Tensor, tokens: list[int],
                              fed: np.ndarray | None = None) -> np.ndarray:
        """Logits [len(tokens), vocab] of each step of a decode that emitted `tokens` after the prompt: one
        causal forward over the prompt and tokens[:-1] (each step sees the history the decode had, so a
        decode's step logits compare with these even where a token of it is wrong). `fed`: the embeddings
        [len(tokens) - 1, hidden] the decode fed back (default: this model's table rows of tokens[:-1])."""
        ids = torch.tensor(tokens[:-1], dtype=torch.long)
        fed = self.decoder.get_input_embeddings()(ids) if fed is None else torch.from_numpy(np.asarray(fed))
        sequence = torch.cat([inputs_embeds, fed[None].to(inputs_embeds.dtype)], dim=1)
        logits = self.decoder(inputs_embeds=sequence, use_cache=False).logits[0]
        return logits[inputs_embeds.shape[1] - 1:].numpy()


@dataclass
class ModelConfig:
    """Shapes of one Audio8-ASR model (the published one, or a small one for tests)."""

    encoder: EncoderConfig
    adapter: AdapterConfig
    decoder: dict
    prompt: PromptConfig


def small_config(vocab: int = 160, hidden: int = 64, layers: int = 2, heads: int = 4) -> ModelConfig:
    """A small model of this architecture for tests and the host bench (same frontend and token shapes)."""
    encoder = EncoderConfig(downsample_hidden_size=8, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                            encoder_ffn_dim=64, output_dim=48)
    adapter = AdapterConfig(input_dim=48, hidden_dim=96, num_blocks=2, output_dim=hidden)
    decoder = dict(DECODER_REAL, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                   max_position_embeddings=1024, eos_token_id=vocab - 1, initializer_range=0.3)
    prompt = PromptConfig(prefix_ids=[1, 2, 3, 4], audio_token_id=5, suffix_ids=[6, vocab - 1, 3, 1, 7, 3],
                          eos_token_id=vocab - 1)
    return ModelConfig(encoder, adapter, decoder, prompt)


def real_shape_config() -> ModelConfig:
    """The published architecture's shapes (for random-weight engine builds: no weights here)."""
    return ModelConfig(EncoderConfig(), AdapterConfig(), dict(DECODER_REAL), PromptConfig())


def build_random(config: ModelConfig, seed: int = 0, embedding_std: float = 1.0, eos_row_scale: float = 1.3
                 ) -> Audio8ASR:
    """Random-init model. A wide embedding spread (tied to the LM head) keeps top-2 logit margins far above
    fp32 rounding, so two fp32 implementations agree by construction, not by luck; a longer EOS row makes
    greedy paths end with EOS within tens of tokens, as a trained model's do."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    decoder = Qwen2ForCausalLM(Qwen2Config(**config.decoder, attn_implementation="eager"))
    with torch.no_grad():
        table = decoder.get_input_embeddings().weight
        table.normal_(0.0, embedding_std)
        table[config.prompt.eos_token_id] *= eos_row_scale
    model = Audio8ASR(AudioEncoder(config.encoder), Adapter(config.adapter), decoder, config.prompt)
    return model.eval()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


def _json_file(path: Path):
    """The JSON in `path`, or a one-line SetupError naming the file (cut short, not text, not JSON)."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SetupError(f"{path} is not valid JSON (not UTF-8 text): a damaged or truncated copy; copy the "
                         "snapshot again") from None
    except json.JSONDecodeError as error:
        raise SetupError(f"{path} is not valid JSON ({error.msg} at line {error.lineno} column {error.colno}): "
                         "a damaged or truncated copy; copy the snapshot again") from None


def _check_weight_file(path: Path) -> None:
    """A one-line SetupError when a checkpoint file cannot be read whole: a .safetensors whose header or data
    is cut short (its header names every tensor's byte range, checked against the file size), a zip-format
    .bin/.pth without its central directory (it sits at the end: a truncated file has none), or a legacy
    pickle that does not load."""
    import zipfile

    reason = None
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as error:  # SafetensorError: header too small, incomplete metadata, ...
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    elif zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                size = path.stat().st_size
                bad = [info.filename for info in archive.infolist() if info.header_offset + info.compress_size > size]
            if bad:
                reason = f"member {bad[0]} runs past the end of the file"
        except (zipfile.BadZipFile, OSError) as error:
            reason = f"{type(error).__name__}: {error}"
    else:
        try:
            torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as error:  # a truncated zip is no zip at all, so it lands here too
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    if reason is not None:
        raise SetupError(f"{path} is not a readable checkpoint file ({reason}): a truncated download or another "
                         "kind of file; copy the snapshot again")


def check_snapshot_files(model_dir: Path) -> None:
    """Refuse a damaged snapshot before anything loads it, in one line naming the file: every top-level JSON
    (config.json, generation/tokenizer configs, weight indexes) must parse, config.json as an object; there
    must be weights, every shard an index names must exist, and every weight file must be readable whole."""
    model_dir = Path(model_dir)
    for path in sorted(model_dir.glob("*.json")):
        value = _json_file(path)
        if path.name == "config.json" and not isinstance(value, dict):
            raise SetupError(f"{path} is a JSON {type(value).__name__}, not an object: not a model config")
        if path.name.endswith(".index.json"):
            shards = sorted(set((value.get("weight_map") or {}).values())) if isinstance(value, dict) else []
            missing = [shard for shard in shards if not (model_dir / shard).is_file()]
            if missing:
                raise SetupError(f"{path} names weight shards that are not in {model_dir}: {', '.join(missing)}; "
                                 "copy the whole snapshot")
    weights = sorted(path for path in model_dir.iterdir() if path.suffix in WEIGHT_SUFFIXES and path.is_file())
    if not weights:
        raise SetupError(f"no weights ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}) in the snapshot {model_dir}")
    for path in weights:
        _check_weight_file(path)


def load_snapshot(model_dir: Path) -> Audio8ASR:
    """The real checkpoint from a local snapshot (its remote code included); never downloads. A damaged
    snapshot (JSON that does not parse, a truncated weight file) is refused first (`check_snapshot_files`)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise SetupError(f"no Audio8-ASR snapshot at {model_dir} (config.json missing); pass --model-dir with a "
                         "local copy of Edge0/Audio8-ASR-0.1B (config.json, weights and its modeling files)")
    check_snapshot_files(model_dir)
    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=True, local_files_only=True)
    # The snapshot's auto_map names its model class (ArkasrForConditionalGeneration); use it whatever Auto* key.
    model_refs = [ref for key, ref in (getattr(config, "auto_map", None) or {}).items() if key != "AutoConfig"]
    if not model_refs:
        raise SetupError(f"snapshot {model_dir}: config.json has no auto_map naming the remote model class")
    model_class = get_class_from_dynamic_module(model_refs[0], str(model_dir))
    upstream = model_class.from_pretrained(model_dir, trust_remote_code=True, local_files_only=True,
                                           torch_dtype=torch.float32).eval()
    parts = {name: getattr(upstream, name, None) for name in ("encoder", "adapter", "decoder")}
    missing = [name for name, module in parts.items() if module is None]
    if missing:
        children = [name for name, _ in upstream.named_children()]
        raise SetupError(f"snapshot {model_dir}: model has no {missing} (children: {children}); "
                         "expected the arkasr remote code with encoder/adapter/decoder")
    prompt = PromptConfig(eos_token_id=int(getattr(config, "eos_token_id", None) or PromptConfig.eos_token_id),
                          audio_token_id=int(getattr(config, "audio_token_id", PromptConfig.audio_token_id)))
    return Audio8ASR(parts["encoder"], parts["adapter"], parts["decoder"], prompt).eval()

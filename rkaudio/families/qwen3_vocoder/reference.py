"""The qwen-tts package's own decoder (`Qwen3TTSTokenizerV2Decoder`), imported by file.

The package `__init__` pulls gradio, librosa and sox (not installed), so its `tokenizer_12hz` folder is
mounted as a stand-alone package; its relative imports (the configuration module) then resolve."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from rkaudio.core.errors import SetupError

_ALIAS = "_rkaudio_qwen_tokenizer_12hz"


def _package_dir() -> Path:
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("the qwen-tts package is not installed in this venv (export venv: venvs/export-nodeps.txt)")
    return Path(spec.submodule_search_locations[0]) / "core" / "tokenizer_12hz"


def modeling_module():
    """`qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`, imported without the package."""
    if _ALIAS not in sys.modules:
        package = types.ModuleType(_ALIAS)
        package.__path__ = [str(_package_dir())]
        sys.modules[_ALIAS] = package
    return importlib.import_module(f"{_ALIAS}.modeling_qwen3_tts_tokenizer_v2")


def reference_decoder(decoder_config: dict, state_dict: dict | None = None):
    """The package decoder for `decoder_config` (eval mode), loaded from `state_dict` when given."""
    module = modeling_module()
    config_module = importlib.import_module(f"{_ALIAS}.configuration_qwen3_tts_tokenizer_v2")
    config = config_module.Qwen3TTSTokenizerV2DecoderConfig(**decoder_config)
    config._attn_implementation = "eager"
    decoder = module.Qwen3TTSTokenizerV2Decoder(config)
    if state_dict is not None:
        decoder.load_state_dict(state_dict, strict=True)
    return decoder.eval()


def randomize_(decoder, codes, seed: int = 0, gain: float = 0.5, spread: float = 0.15, output_rms: float = 0.3):
    """Random weights for tests and benches (no weights are downloadable here): codebook centroids and the
    transformer at `gain`/sqrt(fan-in), so attention and every layer move the output (the real-shape decoder
    at gain 1 is so ill-conditioned that the package's own fp32 decode is 97.7 dB from float64); everything
    else keeps the package's init plus noise of `spread` (relative, or absolute for constant-initialised
    LayerScale, ConvNeXt gamma and Snake's alpha/beta). How far the package's own fp32 decode lands from its
    float64 one (real shape, 32 frames): spread 0.3 101.7 dB, 0.15 108.9 dB, 0.05 112.1 dB; a random model this
    ill-conditioned amplifies rounding far more than a trained one (the spec measures fp16 engines of the real
    weights at 56.8 dB), so 0.15 keeps Snake well away from identity without an fp32 floor at the 100 dB bar.
    The last conv is scaled so `codes` decode to `output_rms` before the clamp: audio neither silent nor
    clipped."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in decoder.named_parameters():
            if name.endswith("cluster_usage"):
                # EMA counts, strictly positive; the matching embedding_sum is set below as counts x centroid,
                # as training leaves it (an independent random sum over a small count makes 1e5-sized centroids)
                parameter.copy_(torch.empty(parameter.shape).uniform_(0.5, 2.0, generator=generator))
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.dim() >= 2 and name.startswith(("quantizer.", "pre_transformer.")):
                parameter.copy_(noise * gain / parameter[0].numel() ** 0.5)
            else:
                # Constant-initialised ones (LayerScale 0.01, ConvNeXt gamma 1e-6, Snake 0): absolute noise.
                width = float(parameter.std()) if parameter.numel() > 1 else 0.0
                parameter.add_(noise * spread * (width if width > 1e-6 else 1.0))
        for module in decoder.modules():
            if hasattr(module, "cluster_usage") and hasattr(module, "embedding_sum"):
                module.embedding_sum.mul_(module.cluster_usage[:, None])
        seen = {}
        hook = decoder.decoder[-1].register_forward_hook(lambda module, args, out: seen.update(out=out))
        decoder(codes)
        hook.remove()
        scale = output_rms / float(seen["out"].pow(2).mean().sqrt())
        decoder.decoder[-1].conv.weight.mul_(scale)
        decoder.decoder[-1].conv.bias.mul_(scale)
    return decoder

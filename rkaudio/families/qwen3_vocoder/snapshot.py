"""Find and load the speech-tokenizer decoder of a Qwen3-TTS 12 Hz checkpoint.

A snapshot is the checkpoint directory (holding `speech_tokenizer/`), the `speech_tokenizer/` directory
itself, or a repo id looked up in the local huggingface_hub cache (never downloaded)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rkaudio.core.errors import SetupError
from rkaudio.pipeline.checkpoint import as_repo_id, resolve_checkpoint

REPO_ID = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
SUBDIR = "speech_tokenizer"
DECODER_PREFIX = "decoder."
FILES = (f"{SUBDIR}/config.json", f"{SUBDIR}/model.safetensors")  # what a checkpoint directory holds
SNAPSHOT_NAME = f"{REPO_ID} snapshot"  # what a missing one is called

# The released decoder's shapes (16 codebooks of 2048, 512-d codes, 8 sliding-window layers of 16x64
# heads over a 512-d stream, 1024-d latent, 1536 -> 96 channels over strides 8/5/4/3): tests and the
# bench build it with random weights for the real-size figures.
REAL_SHAPE_DECODER_CONFIG = {
    "codebook_size": 2048, "codebook_dim": 512, "num_quantizers": 16, "latent_dim": 1024,
    "hidden_size": 512, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
    "intermediate_size": 1024, "num_hidden_layers": 8, "sliding_window": 72, "rope_theta": 10000,
    "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
    "hidden_act": "silu", "attention_bias": False, "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2], "decoder_dim": 1536,
}


@dataclass
class DecoderSnapshot:
    directory: Path  # the speech_tokenizer directory
    decoder_config: dict
    state_dict: dict  # decoder.* keys with the prefix removed


def resolve(source: str | Path) -> Path:
    """The `speech_tokenizer/` directory of a checkpoint: `source` is the checkpoint directory, that directory
    itself, or a repo id looked up in the huggingface_hub cache (a one-line SetupError naming both when absent)."""
    source = Path(source)
    checkpoint = source.parent if source.name == SUBDIR else source
    return resolve_checkpoint(checkpoint, as_repo_id(source), FILES, SNAPSHOT_NAME) / SUBDIR


def read_decoder_config(directory: Path) -> dict:
    """`decoder_config` of a speech-tokenizer config.json, refusing configs of other models."""
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SetupError(f"{config_path} is not valid JSON ({error}): a truncated download or another file; "
                         f"copy the {REPO_ID} {SUBDIR}/config.json again") from None
    except OSError as error:
        raise SetupError(f"{config_path} cannot be read ({error.strerror or error})") from None
    if not isinstance(config, dict):
        raise SetupError(f"{config_path} holds a JSON {type(config).__name__}, not the object of a {REPO_ID} "
                         f"{SUBDIR} config")
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE or not isinstance(config.get("decoder_config"), dict):
        raise SetupError(f"{config_path} is a config of model_type {model_type!r}; expected the {REPO_ID} speech "
                         f"tokenizer (model_type {MODEL_TYPE!r} with a decoder_config), found in {SUBDIR}/")
    decoder = dict(config["decoder_config"])
    if "codebook_dim" not in decoder:
        raise SetupError(f"{config_path}: decoder_config has no codebook_dim (the decoder's code width, 512 in "
                         f"{REPO_ID}); the config is incomplete")
    return decoder


def load(source: str | Path) -> DecoderSnapshot:
    """Config and decoder weights of a snapshot."""
    from safetensors.torch import load_file

    directory = resolve(source)
    decoder_config = read_decoder_config(directory)
    weights_path = directory / "model.safetensors"
    try:
        weights = load_file(str(weights_path))
    except Exception as error:  # safetensors' SafetensorError (truncated, not safetensors at all), OSError
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SetupError(f"{weights_path} is not a readable safetensors file ({reason}): a truncated download or "
                         f"another file; copy the {REPO_ID} {SUBDIR}/model.safetensors again") from None
    state = {key[len(DECODER_PREFIX):]: value for key, value in weights.items() if key.startswith(DECODER_PREFIX)}
    if not state:
        raise SetupError(f"{directory / 'model.safetensors'} has no '{DECODER_PREFIX}*' tensors: "
                         f"expected the {REPO_ID} speech tokenizer weights")
    return DecoderSnapshot(directory, decoder_config, state)


def write(directory: Path, decoder_config: dict, decoder_state: dict) -> Path:
    """Write a snapshot in the released layout (used by tests and the bench with random weights)."""
    from safetensors.torch import save_file

    target = Path(directory) / SUBDIR
    target.mkdir(parents=True, exist_ok=True)
    config = {"model_type": MODEL_TYPE, "decoder_config": decoder_config, "output_sample_rate": 24000,
              "decode_upsample_rate": 1920}
    (target / "config.json").write_text(json.dumps(config, indent=1))
    save_file({DECODER_PREFIX + k: v.contiguous() for k, v in decoder_state.items()}, str(target / "model.safetensors"))
    return Path(directory)

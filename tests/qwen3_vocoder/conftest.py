"""Random-weight Qwen3-TTS speech-tokenizer decoders (tiny and real-shape), built here, never downloaded."""
from __future__ import annotations

import pytest

# Every structural feature of the released decoder at toy widths: 4 codebooks (1 semantic + 3 acoustic),
# GQA-free sliding window of 8 keys over 2 layers, two x2 upsamplers, strides 2/3.
TINY_CONFIG = {
    "codebook_size": 32, "codebook_dim": 16, "num_quantizers": 4, "latent_dim": 32, "hidden_size": 16,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32,
    "num_hidden_layers": 2, "sliding_window": 8, "upsample_rates": [2, 3], "upsampling_ratios": [2, 2],
    "decoder_dim": 32,
}


def random_reference(config: dict, seed: int):
    import torch

    from converters.families.qwen3_vocoder.reference import randomize_, reference_decoder

    generator = torch.Generator().manual_seed(seed)
    calibration = torch.randint(0, config["codebook_size"], (1, config["num_quantizers"], 24), generator=generator)
    torch.manual_seed(seed)
    return randomize_(reference_decoder(config), calibration, seed=seed)


def step_of(reference, config: dict):
    from converters.families.qwen3_vocoder.step import StreamingDecoder

    step = StreamingDecoder(config)
    step.load_state_dict(reference.state_dict(), strict=True)
    return step.eval()


def random_codes(config: dict, frames: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config["codebook_size"], (1, config["num_quantizers"], frames), generator=generator)


@pytest.fixture(scope="session")
def tiny_reference():
    return random_reference(TINY_CONFIG, seed=0)


@pytest.fixture(scope="session")
def tiny_step(tiny_reference):
    return step_of(tiny_reference, TINY_CONFIG)


@pytest.fixture(scope="session")
def tiny_snapshot(tmp_path_factory, tiny_reference):
    from converters.families.qwen3_vocoder import snapshot

    return snapshot.write(tmp_path_factory.mktemp("tiny_snapshot"), TINY_CONFIG, tiny_reference.state_dict())

"""Random-weight decoders (tiny and real-shape) for tests and benches: no weights are downloadable here.

The package decoder is built and perturbed (`reference.randomize_`), and the step loads its state dict."""
from __future__ import annotations

# Every structural feature of the released decoder at toy widths: 4 codebooks (1 semantic + 3 acoustic), a
# sliding window of 32 keys (longer than the 25-frame window context and a B=16 step) over 2 layers, two x2 upsamplers, strides 2/3.
TINY_CONFIG = {
    "codebook_size": 32, "codebook_dim": 16, "num_quantizers": 4, "latent_dim": 32, "hidden_size": 16,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32,
    "num_hidden_layers": 2, "sliding_window": 32, "upsample_rates": [2, 3], "upsampling_ratios": [2, 2],
    "decoder_dim": 32,
}


def random_codes(config: dict, frames: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config["codebook_size"], (1, config["num_quantizers"], frames), generator=generator)


def random_reference(config: dict, seed: int, gain: float = 0.5):
    """The package decoder for `config` with random weights whose audio is neither silent nor clipped
    (`gain`: of the codebooks and the transformer, see `reference.randomize_`)."""
    import torch

    from rkaudio.families.qwen3_vocoder.reference import randomize_, reference_decoder

    torch.manual_seed(seed)
    return randomize_(reference_decoder(config), random_codes(config, 24, seed), seed=seed, gain=gain)


def step_of(reference, config: dict):
    """The streaming step loaded from `reference`'s state dict."""
    from rkaudio.families.qwen3_vocoder.step import StreamingDecoder

    step = StreamingDecoder(config)
    step.load_state_dict(reference.state_dict(), strict=True)
    return step.eval()


def write_random_snapshot(directory, config: dict, seed: int = 3):
    """A `speech_tokenizer/` snapshot (config.json + model.safetensors) of a random-weight decoder."""
    from pathlib import Path

    from rkaudio.families.qwen3_vocoder import snapshot

    return snapshot.write(Path(directory), config, random_reference(config, seed).state_dict())


if __name__ == "__main__":
    import argparse

    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG

    parser = argparse.ArgumentParser(description="Write a random-weight Qwen3-TTS speech-tokenizer snapshot "
                                     "(for `convert qwen3-vocoder --model-dir`; no real weights are downloadable here).")
    parser.add_argument("directory")
    parser.add_argument("--tiny", action="store_true", help="the tiny test config instead of the real shape")
    parser.add_argument("--seed", type=int, default=3)
    arguments = parser.parse_args()
    config = TINY_CONFIG if arguments.tiny else REAL_SHAPE_DECODER_CONFIG
    print(write_random_snapshot(arguments.directory, config, arguments.seed))

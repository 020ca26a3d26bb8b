"""Speech models that are no family of rkaudio, built from transformers at random init and exported to ONNX the way
a user exports their own: the material of `convert doctor` and `convert build --fix` (tests/engine/test_doctor.py,
bench/doctor.py). Each architecture comes at its named config (`full`, the bench's rows) and at a reduced config
(`reduced`: the same blocks, strides and time lengths with small channel counts, so `make test` stays fast)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

SIZES = ("reduced", "full")


@dataclass(frozen=True)
class SpeechModel:
    """One architecture: how to make its module at a size, and the fixed input the export pins."""
    name: str
    what: str
    input_name: str
    input_shape: tuple[int, ...]
    make: Callable[[str], "object"]  # size -> torch module taking the one input
    time_axis: int = -1  # the input axis a user's export leaves dynamic


def _audible(vocoder, input_shape: tuple[int, ...], output_std: float = 0.3):
    """Random init as a trained vocoder's scale: every conv keeps its input's scale (std 1/sqrt(fan_in)), and the last
    conv is scaled so the waveform before its tanh has std `output_std` on a standard-normal input. The default inits
    give a silent HiFi-GAN (std 1e-8 at 32 channels: nothing for the fp16 gates to measure) or a saturated one."""
    import torch

    convs = [m for m in vocoder.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))]
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for conv in convs:
            fan_in = conv.weight.shape[1 if isinstance(conv, torch.nn.Conv1d) else 0] * conv.weight.shape[2]
            if isinstance(conv, torch.nn.ConvTranspose1d):
                fan_in //= conv.stride[0]
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) / fan_in**0.5)
        last = convs[-1]
        seen = {}

        def measure(module, args, output):
            seen["std"] = float(output.std())

        hook = last.register_forward_hook(measure)
        vocoder(torch.randn(input_shape, generator=generator))
        hook.remove()
        last.weight.mul_(output_std / seen["std"])
        if last.bias is not None:
            last.bias.mul_(output_std / seen["std"])
    return vocoder


def _hifigan(size: str):
    import torch
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    config = SpeechT5HifiGanConfig() if size == "full" else SpeechT5HifiGanConfig(upsample_initial_channel=32)
    model = SpeechT5HifiGan(config)

    class Vocoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hifigan = model

        def forward(self, mel):  # [1, frames, 80] -> [1, 1, samples]
            return self.hifigan(mel).unsqueeze(1)

    return _audible(Vocoder(), (1, 100, 80))


def _mms_decoder(size: str):
    from transformers import VitsConfig, VitsModel

    config = VitsConfig() if size == "full" else VitsConfig(upsample_initial_channel=32, hidden_size=32, flow_size=32)
    # [1, C, frames] -> [1, 1, samples]
    return _audible(VitsModel(config).decoder, input_shape("mms_tts_decoder", size))


def _dac_decoder(size: str):
    import torch
    from transformers import DacConfig, DacModel

    config = DacConfig() if size == "full" else DacConfig(decoder_hidden_size=64, hidden_size=32)
    decoder = DacModel(config).decoder
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a trained Snake's alpha is not 1 (its init): spread it as training does
        for name, parameter in decoder.named_parameters():
            if name.endswith("alpha"):
                parameter.copy_(0.5 + 1.5 * torch.rand(parameter.shape, generator=generator))
    return _audible(decoder, input_shape("dac_decoder", size))  # [1, hidden, frames] -> [1, 1, samples]


def _wav2vec2_encoder(size: str):
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config() if size == "full" else Wav2Vec2Config(
        conv_dim=(32,) * 7, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        num_conv_pos_embedding_groups=4)
    model = Wav2Vec2Model(config)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wav2vec2 = model

        def forward(self, audio):  # [1, samples] -> [1, frames, hidden]
            return self.wav2vec2(audio).last_hidden_state

    return Encoder()


def _whisper_encoder(size: str):
    import torch
    from transformers import WhisperConfig, WhisperModel

    shape = dict(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048) if size == "full" \
        else dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128)
    encoder = WhisperModel(WhisperConfig(**shape, decoder_layers=1, decoder_attention_heads=4)).encoder

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, mel):  # [1, 80, 3000] -> [1, 1500, d_model]
            return self.encoder(mel).last_hidden_state

    return Encoder()


MODELS = {model.name: model for model in (
    SpeechModel("speecht5_hifigan", "SpeechT5 HiFi-GAN, 100 mel frames", "mel", (1, 100, 80), _hifigan, time_axis=1),
    SpeechModel("mms_tts_decoder", "MMS-TTS VITS decoder, 100 latent frames", "latent", (1, 192, 100), _mms_decoder),
    SpeechModel("dac_decoder", "DAC decoder, 50 latent frames", "latent", (1, 1024, 50), _dac_decoder),
    SpeechModel("wav2vec2_encoder", "Wav2Vec2-base encoder, 4 s at 16 kHz", "audio", (1, 64000), _wav2vec2_encoder),
    SpeechModel("whisper_encoder", "Whisper-base encoder, 3,000 mel frames", "mel", (1, 80, 3000), _whisper_encoder),
)}


def input_shape(name: str, size: str) -> tuple[int, ...]:
    """The model's fixed input shape at `size`: the reduced latents have the reduced channel count."""
    shape = MODELS[name].input_shape
    reduced_channels = {"mms_tts_decoder": 32, "dac_decoder": 32}
    if size == "reduced" and name in reduced_channels:
        return (shape[0], reduced_channels[name], *shape[2:])
    return shape


def export(name: str, path: Path, size: str = "reduced", seed: int = 0, dynamic_time: bool = False) -> Path:
    """`name` at `size`, random init from `seed`, exported to `path` at its fixed input shape (opset 17), as
    torch.onnx.export gives it, unslimmed. `dynamic_time` leaves the last input axis symbolic (`time`), as a user's
    export usually does."""
    import torch

    if size not in SIZES:
        raise ValueError(f"size {size!r}: one of {SIZES}")
    spec = MODELS[name]
    torch.manual_seed(seed)
    module = spec.make(size).eval()
    example = torch.from_numpy(np.random.default_rng(seed).standard_normal(input_shape(name, size)).astype(np.float32))
    dynamic_axes = {spec.input_name: {spec.time_axis % example.dim(): "time"}} if dynamic_time else None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, (example,), str(path), input_names=[spec.input_name], output_names=["output"],
                          opset_version=17, dynamo=False, dynamic_axes=dynamic_axes)
    return path

"""Random-init Inflect v2 models (Micro and Nano shapes) and an exporter that writes `decode.onnx`,
`duration.onnx` and `config.json` with the official I/O.

The official checkpoints are not downloadable here, so tests and the bench build this architecture
with random weights: a text encoder with an in-graph length regulator (duration.onnx), and the
decoder half (noise head, reverse mean-only coupling flow with WaveNet, HiFi-GAN with ResBlock1,
weight norm folded). The export is the legacy tracer with the length axis dynamic, so tensors are
sized from the latent length through Shape -> ConstantOfShape -> Slice, as in the official graph."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

LRELU_SLOPE = 0.1


@dataclass(frozen=True)
class InflectConfig:
    """Shapes of one Inflect v2 size (public facts of the official configs)."""

    name: str
    inter_channels: int  # C, the latent width
    hidden_channels: int  # flow WaveNet width and text encoder width
    upsample_initial_channel: int
    upsample_rates: tuple[int, ...] = (8, 8, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[int, ...] = (1, 3, 5)
    n_flows: int = 4
    wavenet_layers: int = 4
    wavenet_kernel: int = 5
    n_symbols: int = 178
    sampling_rate: int = 24000

    @property
    def hop_length(self) -> int:
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop

    def config_json(self) -> dict:
        """The config.json written beside the ONNX files (VITS-style layout)."""
        model = asdict(self)
        model.pop("sampling_rate")
        return {"model_name": f"Inflect-{self.name}-v2", "data": {"sampling_rate": self.sampling_rate,
                "hop_length": self.hop_length}, "model": model}


MICRO = InflectConfig("Micro", inter_channels=192, hidden_channels=96, upsample_initial_channel=320)
NANO = InflectConfig("Nano", inter_channels=128, hidden_channels=72, upsample_initial_channel=192)
SIZES = {"micro": MICRO, "nano": NANO}


def _padding(kernel: int, dilation: int = 1) -> int:
    return (kernel * dilation - dilation) // 2


class WaveNet(nn.Module):
    """Non-causal gated WaveNet (tanh * sigmoid), as in VITS's flow; no speaker conditioning."""

    def __init__(self, channels: int, kernel: int, layers: int):
        super().__init__()
        self.channels = channels
        self.in_layers = nn.ModuleList(nn.Conv1d(channels, 2 * channels, kernel, padding=_padding(kernel))
                                       for _ in range(layers))
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels if i < layers - 1 else channels, 1) for i in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(x)
        for i, (in_layer, res_skip_layer) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            x_in = in_layer(x)
            # The official graph adds a zero conditioning tensor sized from the activations: this is
            # where its Shape -> ConstantOfShape glue comes from.
            x_in = x_in + torch.zeros_like(x_in)
            acts = torch.tanh(x_in[:, : self.channels]) * torch.sigmoid(x_in[:, self.channels :])
            res_skip = res_skip_layer(acts)
            if i < len(self.in_layers) - 1:
                x = (x + res_skip[:, : self.channels]) * mask
                output = output + res_skip[:, self.channels :]
            else:
                output = output + res_skip
        return output * mask


class MeanOnlyCoupling(nn.Module):
    """Residual coupling layer with mean-only transform, run in reverse (latent -> decoder input)."""

    def __init__(self, cfg: InflectConfig):
        super().__init__()
        self.half = cfg.inter_channels // 2
        self.pre = nn.Conv1d(self.half, cfg.hidden_channels, 1)
        self.enc = WaveNet(cfg.hidden_channels, cfg.wavenet_kernel, cfg.wavenet_layers)
        self.post = nn.Conv1d(cfg.hidden_channels, self.half, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half, self.half], 1)
        h = self.pre(x0) * mask
        h = self.enc(h, mask)
        mean = self.post(h) * mask
        logs = torch.zeros_like(mean)
        x1 = (x1 - mean) * torch.exp(-logs) * mask
        return torch.cat([x0, x1], 1)


class ResBlock1(nn.Module):
    """HiFi-GAN ResBlock1: dilated conv then plain conv per dilation, leaky ReLU, residual."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, dilation=d, padding=_padding(kernel, d))
                                    for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, padding=_padding(kernel))
                                    for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class Generator(nn.Module):
    """HiFi-GAN generator (weight norm already folded into plain convs)."""

    def __init__(self, cfg: InflectConfig):
        super().__init__()
        ch = cfg.upsample_initial_channel
        self.conv_pre = nn.Conv1d(cfg.inter_channels, ch, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            out_ch = ch // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(ch // 2**i, out_ch, kernel, rate, padding=(kernel - rate) // 2))
            self.resblocks.extend(ResBlock1(out_ch, k, cfg.resblock_dilations) for k in cfg.resblock_kernel_sizes)
        self.n_kernels = len(cfg.resblock_kernel_sizes)
        self.conv_post = nn.Conv1d(out_ch, 1, 7, padding=3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(x)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.n_kernels : (i + 1) * self.n_kernels]
            x = sum(block(x) for block in blocks) / self.n_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))


class Decode(nn.Module):
    """decode.onnx: noise head, reverse flow (flip before each coupling), mask, HiFi-GAN."""

    def __init__(self, cfg: InflectConfig):
        super().__init__()
        self.flows = nn.ModuleList(MeanOnlyCoupling(cfg) for _ in range(cfg.n_flows))
        self.dec = Generator(cfg)

    def forward(self, m_p_exp, logs_p_exp, y_mask, zp_noise, noise_scale):
        z = m_p_exp + torch.exp(logs_p_exp) * zp_noise * noise_scale
        for flow in reversed(self.flows):
            z = flow(torch.flip(z, [1]), y_mask)
        return self.dec(z * y_mask)


class Duration(nn.Module):
    """duration.onnx: token embedding, conv text encoder, prior stats and durations, length regulation."""

    def __init__(self, cfg: InflectConfig):
        super().__init__()
        hidden = cfg.hidden_channels
        self.emb = nn.Embedding(cfg.n_symbols, hidden)
        self.convs = nn.ModuleList(nn.Conv1d(hidden, hidden, 5, padding=2) for _ in range(3))
        self.proj = nn.Conv1d(hidden, 2 * cfg.inter_channels, 1)
        self.dur = nn.Conv1d(hidden, 1, 3, padding=1)
        self.channels = cfg.inter_channels

    def forward(self, tokens, lengths, length_scale):
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        x_mask = (positions < lengths.unsqueeze(1)).unsqueeze(1).float()
        x = self.emb(tokens).transpose(1, 2) * x_mask
        for conv in self.convs:
            x = (x + torch.relu(conv(x))) * x_mask
        stats = self.proj(x) * x_mask
        m_p, logs_p = stats[:, : self.channels], stats[:, self.channels :]
        # Durations of 2-6 frames per token for a random model (log-duration 1.25 +- 0.5).
        logw = torch.tanh(self.dur(x)) * 0.5 + 1.25
        durations = torch.clamp(torch.ceil(torch.exp(logw) * length_scale), min=1.0) * x_mask
        ends = torch.cumsum(durations, -1)  # [1,1,L]
        frames = torch.arange(0, torch.max(ends).long()).unsqueeze(0).unsqueeze(-1)  # [1,T,1]
        starts = ends - durations
        align = ((frames >= starts) & (frames < ends)).float()  # [1,T,L]
        m_p_exp = torch.matmul(align, m_p.transpose(1, 2)).transpose(1, 2)
        logs_p_exp = torch.matmul(align, logs_p.transpose(1, 2)).transpose(1, 2)
        y_mask = align.sum(-1).unsqueeze(1).clamp(max=1.0)
        return m_p_exp, logs_p_exp, y_mask


def build_models(cfg: InflectConfig, seed: int = 0) -> tuple[Duration, Decode]:
    """Random-init models of one size; deterministic for a seed. Prior scales are kept speech-like."""
    torch.manual_seed(seed)
    duration, decode = Duration(cfg).eval(), Decode(cfg).eval()
    with torch.no_grad():
        # logs_p around -1.5 (prior std ~0.2), m_p of unit-ish scale, as a trained prior looks.
        duration.proj.bias[cfg.inter_channels :].fill_(-1.5)
        duration.proj.weight[cfg.inter_channels :].mul_(0.1)
        # Default init leaves the waveform at ~0.01 RMS; lift it to a speech-like ~0.1.
        decode.dec.conv_post.weight.mul_(8.0)
    return duration, decode


@contextmanager
def one_torch_thread():
    """Run torch on one thread: these graphs are small, and on a shared 2-core machine more threads only
    contend (measured: a 20-frame Micro forward takes 5-13 s with the default threads under load, 0.1 s with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def export_official(out_dir: Path, cfg: InflectConfig, seed: int = 0, opset: int = 17) -> dict[str, Path]:
    """Write onnx/decode.onnx, onnx/duration.onnx and config.json with the official I/O; returns the paths."""
    import warnings

    out_dir = Path(out_dir)
    (out_dir / "onnx").mkdir(parents=True, exist_ok=True)
    duration, decode = build_models(cfg, seed)
    paths = {"decode": out_dir / "onnx" / "decode.onnx", "duration": out_dir / "onnx" / "duration.onnx",
             "config": out_dir / "config.json"}
    frames, tokens = 64, 24
    latent = torch.randn(1, cfg.inter_channels, frames)
    with warnings.catch_warnings(), torch.no_grad(), one_torch_thread():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            decode, (latent, latent - 1.5, torch.ones(1, 1, frames), torch.randn_like(latent), torch.tensor(0.667)),
            str(paths["decode"]), dynamo=False, opset_version=opset,
            input_names=["m_p_exp", "logs_p_exp", "y_mask", "zp_noise", "noise_scale"], output_names=["waveform"],
            dynamic_axes={"m_p_exp": {2: "mel_len"}, "logs_p_exp": {2: "mel_len"}, "y_mask": {2: "mel_len"},
                          "zp_noise": {2: "mel_len"}, "waveform": {2: "samples"}})
        torch.onnx.export(
            duration, (torch.randint(1, cfg.n_symbols, (1, tokens)), torch.tensor([tokens]), torch.tensor(1.0)),
            str(paths["duration"]), dynamo=False, opset_version=opset,
            input_names=["tokens", "lengths", "length_scale"], output_names=["m_p_exp", "logs_p_exp", "y_mask"],
            dynamic_axes={"tokens": {1: "L"}, "m_p_exp": {2: "mel_len"}, "logs_p_exp": {2: "mel_len"},
                          "y_mask": {2: "mel_len"}})
    paths["config"].write_text(json.dumps(cfg.config_json(), indent=2))
    return paths

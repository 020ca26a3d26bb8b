"""An export-friendly Kokoro iSTFTNet generator: the seam from the decoder output to the conv_post output.

Same parameters and parameter names as `kokoro.istftnet.Generator` (so checkpoints load by name after
`state_dict_key`), but the forward takes the harmonic conditioning `har` (source synthesis and STFT stay on
the CPU), the style vector and the frame masks at the two rates the graph normalises at, and it returns
`spec_phase` (conv_post output; exp/sin and the iSTFT stay on the CPU). Differences that matter to the NPU:
- AdaIN, Snake and the convolution after it are one `AdaSnakeConv` unit (alpha fold, sine forms);
- ConvTranspose without padding, cropped by a Slice (`rkaudio.surgery.modules.polyphase` then makes it a Conv1d: any
  ConvTranspose lowers to a CPU exConvTransposePad zero insertion);
- the reflection pad (1, 0) is a Slice + Concat;
- masks zero the padding after each upsampling sum and on each stage's resblock average, so a padded
  window computes the same frames as an unpadded decode.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from rkaudio.surgery.modules.instance_norm import InstanceNormIgnoringMask
from rkaudio.families.kokoro.ada_snake import AdaSnakeConv


@dataclass(frozen=True)
class GeneratorConfig:
    """`config.json`'s istftnet block plus style_dim (defaults: Kokoro-82M v1.0)."""

    style_dim: int = 128
    upsample_initial_channel: int = 512
    upsample_rates: tuple[int, ...] = (10, 6)
    upsample_kernel_sizes: tuple[int, ...] = (20, 12)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    gen_istft_n_fft: int = 20
    gen_istft_hop_size: int = 5
    sample_rate: int = 24000
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, config: dict) -> "GeneratorConfig":
        net = config["istftnet"]
        return cls(style_dim=int(config["style_dim"]),
                   upsample_initial_channel=int(net["upsample_initial_channel"]),
                   upsample_rates=tuple(net["upsample_rates"]),
                   upsample_kernel_sizes=tuple(net["upsample_kernel_sizes"]),
                   resblock_kernel_sizes=tuple(net["resblock_kernel_sizes"]),
                   resblock_dilation_sizes=tuple(tuple(d) for d in net["resblock_dilation_sizes"]),
                   gen_istft_n_fft=int(net["gen_istft_n_fft"]), gen_istft_hop_size=int(net["gen_istft_hop_size"]))

    @property
    def har_channels(self) -> int:
        return self.gen_istft_n_fft + 2

    def rates(self, frames: int) -> tuple[int, int]:
        """Time lengths of the two normalised rates for `frames` latent frames: (10W, 60W+1) for Kokoro."""
        coarse = frames * self.upsample_rates[0]
        return coarse, coarse * math.prod(self.upsample_rates[1:]) + 1


def _conv(cin, cout, kernel, dilation=1, stride=1, padding=None, weight_norm=False):
    padding = (kernel * dilation - dilation) // 2 if padding is None else padding
    conv = nn.Conv1d(cin, cout, kernel, stride, padding=padding, dilation=dilation)
    return nn.utils.weight_norm(conv) if weight_norm else conv


def _unit(channels, kernel, dilation, style_dim, weight_norm):
    norm = InstanceNormIgnoringMask(channels, affine=True)
    fc = nn.Linear(style_dim, 2 * channels)
    alpha = nn.Parameter(torch.ones(1, channels, 1))
    return AdaSnakeConv(norm, fc, alpha, _conv(channels, channels, kernel, dilation, weight_norm=weight_norm))


class ResBlock(nn.Module):
    """Kokoro's AdaINResBlock1: three (AdaSnakeConv dilated, AdaSnakeConv) pairs with a skip each."""

    def __init__(self, channels, kernel, dilations, style_dim, weight_norm):
        super().__init__()
        self.units = nn.ModuleList()
        for dilation in dilations:
            self.units.append(_unit(channels, kernel, dilation, style_dim, weight_norm))
            self.units.append(_unit(channels, kernel, 1, style_dim, weight_norm))

    def forward(self, x, s, mask):
        for first, second in zip(self.units[0::2], self.units[1::2]):
            x = second(first(x, s, mask), s, mask) + x
        return x


class KokoroGenerator(nn.Module):
    def __init__(self, config: GeneratorConfig = GeneratorConfig(), weight_norm: bool = False):
        super().__init__()
        self.config = config
        c = config
        self.ups = nn.ModuleList()
        self.noise_convs = nn.ModuleList()
        self.noise_res = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        self.crops = []
        channels = c.upsample_initial_channel
        for i, (rate, kernel) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes)):
            up = nn.ConvTranspose1d(channels // 2**i, channels // 2 ** (i + 1), kernel, rate)
            self.ups.append(nn.utils.weight_norm(up) if weight_norm else up)
            self.crops.append((kernel - rate) // 2)
            ch = channels // 2 ** (i + 1)
            for kernel_j, dilations in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes):
                self.resblocks.append(ResBlock(ch, kernel_j, dilations, c.style_dim, weight_norm))
            if i + 1 < len(c.upsample_rates):
                stride = math.prod(c.upsample_rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(c.har_channels, ch, stride * 2, stride, padding=(stride + 1) // 2))
                self.noise_res.append(ResBlock(ch, 7, (1, 3, 5), c.style_dim, weight_norm))
            else:
                self.noise_convs.append(nn.Conv1d(c.har_channels, ch, 1))
                self.noise_res.append(ResBlock(ch, 11, (1, 3, 5), c.style_dim, weight_norm))
        self.conv_post = _conv(ch, c.har_channels, 7, padding=3, weight_norm=weight_norm)
        self.mean_folded = False  # set by `fold_resblock_mean`

    def forward(self, x, har, s, mask_coarse, mask_fine):
        masks = (mask_coarse, mask_fine)
        kernels = len(self.config.resblock_kernel_sizes)
        last = len(self.ups) - 1
        for i, (up, crop) in enumerate(zip(self.ups, self.crops)):
            mask = masks[min(i, len(masks) - 1)]
            x = F.leaky_relu(x, 0.1)
            source = self.noise_res[i](self.noise_convs[i](har), s, mask)
            x = up(x)
            x = x[..., crop: x.shape[-1] - crop]
            if i == last:  # ReflectionPad1d((1, 0)) as Slice + Concat
                x = torch.cat([x[..., 1:2], x], dim=-1)
            x = (x + source) * mask
            total = self.resblocks[i * kernels](x, s, mask)
            for j in range(1, kernels):
                total = total + self.resblocks[i * kernels + j](x, s, mask)
            x = total * (mask if self.mean_folded else mask * (1.0 / kernels))
        return self.conv_post(F.leaky_relu(x))


def fold_resblock_mean(module: KokoroGenerator) -> KokoroGenerator:
    """Fold each stage's 1/len(resblocks) mean into the weights of the convolution that next reads it (the next
    upsampling, or conv_post): leaky_relu is positively homogeneous, so W.leaky_relu(s/k) = (W/k).leaky_relu(s),
    exactly. Left in, the scalar Mul on the mask input leaves a CPU Reshape of the mask on rk3566."""
    import copy

    module = copy.deepcopy(module)
    if module.mean_folded:
        return module
    share = 1.0 / len(module.config.resblock_kernel_sizes)
    with torch.no_grad():
        for reader in [*module.ups[1:], module.conv_post]:
            reader.weight.mul_(share)
    module.mean_folded = True
    return module


_UNIT_KEY = re.compile(r"(resblocks|noise_res)\.(\d+)\.(adain|alpha|convs)([12])\.(\d+)(.*)")


def state_dict_key(reference_key: str) -> str:
    """Map a `kokoro.istftnet.Generator` state-dict key to this module's key."""
    match = _UNIT_KEY.fullmatch(reference_key)
    if not match:
        return reference_key
    block, index, kind, which, pair, rest = match.groups()
    unit = 2 * int(pair) + int(which) - 1
    member = {"adain": "", "alpha": ".alpha", "convs": ".conv"}[kind]
    return f"{block}.{index}.units.{unit}{member}{rest}"


def load_reference_state(module: KokoroGenerator, reference_state: dict) -> KokoroGenerator:
    """Load a kokoro Generator state dict (keys without prefix); source-module keys (m_source) are skipped."""
    own = {}
    for key, value in reference_state.items():
        if key.startswith(("m_source.", "stft.")):
            continue
        own[state_dict_key(key)] = value
    missing, unexpected = module.load_state_dict(own, strict=False)
    # pre_scale is the alpha fold's buffer; norm affine params are absent where the norm had none (ones/zeros).
    missing = [k for k in missing if not k.endswith(("pre_scale", ".norm.weight", ".norm.bias"))]
    if missing or unexpected:
        raise KeyError(f"generator weights do not match the architecture: missing {missing[:5]}, "
                       f"unexpected {unexpected[:5]}")
    return module

"""The Kokoro generator's fine stage in row form: the 60W+1-sample axis carried as rows [1, C, R, L]
(rkaudio.surgery.modules.rows), so a window past W=136 keeps every time axis inside the NPU's 13-bit field.

What changes against the plain graph (same weights, the same prepared modules):
- `har` and `mask_fine` come in as rows [1, 22, R, L] / [1, 1, R, L] and `spec_phase` goes out as rows
  [1, 22, R, L] (the runtime pads and reshapes on the CPU: rkaudio.board.kokoro.to_rows / from_rows); samples
  past 60W+1 in the last row are zero with mask 0, exactly the plain convs' zero padding;
- every fine-rate conv reads its row with a two-sided halo from the neighbouring rows (row_conv);
- the strided noise conv (fine -> coarse) runs on the rows too, and its coarse rows are flattened and cut to 10W;
- the last upsampling's polyphase conv runs on the coarse axis as in the plain graph; its phases are cut into
  coarse segments of L/6 + 1 positions (one shared with the next row), each interleaved as the plain graph
  does, and the reflection sample (fine 0 = fine 2) is set in the first row;
- the masked instance norm pools over both row axes (GlobalAveragePool of [1, C, R, L]).
The coarse stage is unchanged (10W stays inside the field up to W=819)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rkaudio.board.soc import ROW_SAMPLES_LIMIT
from rkaudio.surgery.modules.rows import row_conv, row_layout


def fine_halo(generator) -> int:
    """The widest halo a fine-rate conv of the prepared generator reads (its padding, or the strided noise
    conv's reach past the row), in fine samples."""
    last = len(generator.ups) - 1
    convs = [generator.conv_post, generator.noise_convs[0]]
    for block in [generator.noise_res[last], *generator.resblocks[last * len(generator.config.resblock_kernel_sizes):]]:
        convs += [unit.conv for unit in block.units]
    reach = []
    for conv in convs:
        kernel, stride, dilation, pad = conv.kernel_size[0], conv.stride[0], conv.dilation[0], conv.padding[0]
        reach += [pad, dilation * (kernel - 1) - pad - (stride - 1)]
    return max(reach)


class RowGenerator(nn.Module):
    """The prepared plain generator (`graph.prepare`) at one window of `frames` latent frames, its fine stage
    on rows of at most `limit` samples with their halos: (x, har rows, style, mask_coarse, mask_fine rows) ->
    spec_phase rows."""

    def __init__(self, generator, frames: int, limit: int = ROW_SAMPLES_LIMIT):
        super().__init__()
        config = generator.config
        if len(config.upsample_rates) != 2:
            raise ValueError("the row form covers a two-stage generator (Kokoro's 10 x 6)")
        if not all(hasattr(up, "conv") for up in generator.ups):
            raise ValueError("the row form needs the polyphase upsampling (graph.prepare)")
        self.generator = generator
        self.frames = int(frames)
        self.coarse, self.fine = config.rates(self.frames)
        self.rate = config.upsample_rates[-1]
        if self.generator.noise_convs[0].stride[0] != self.rate:
            raise ValueError("the strided noise conv must step one coarse frame per row sample group")
        self.halo = fine_halo(generator)
        # the widest row axis is a row with its halo; the interleave's rows are L + rate samples
        self.rows, self.row_length = row_layout(self.fine, max(self.halo, self.rate), limit, self.rate)
        self.limit = int(limit)

    @property
    def config(self):
        return self.generator.config

    def contract_fields(self) -> dict:
        return {"fine_rows": self.rows, "fine_row_length": self.row_length, "row_samples_limit": self.limit}

    def _upsample_rows(self, x):
        """The last upsampling (polyphase conv on the coarse axis), cropped and with the reflection sample, as
        fine rows [1, cout, R, L]: row r, sample q = interleaved[r*L + q + 2]. Each row interleaves its own L/6 + 1
        coarse positions (one shared with the next row) exactly as the plain PolyphaseUpsample does (3-D,
        phases on a new last axis, one Reshape), then takes a row axis. Interleaving all rows at once
        ([1, cout*R, L/6+1, 6] -> [1, cout, R, L+6]) puts that Reshape on the CPU (rk3588, W=256); this form
        measures the same cycles and less traffic than a 4-D per-row interleave (a 2-row micro graph)."""
        up = self.generator.ups[-1]
        rows, length, rate, cout = self.rows, self.row_length, self.rate, up.out_channels
        coarse_row = length // rate
        phases = up.conv(x)  # [1, rate*cout, coarse+1]
        phases = F.pad(phases, (0, rows * coarse_row + 1 - int(phases.shape[-1])))
        crop = self.generator.crops[-1]  # interleaved[crop + t] is the transposed conv's cropped output t
        start = crop - 1  # reflection pad (1, 0): fine n = cropped n-1 for n >= 1
        out = []
        for row in range(rows):
            segment = phases[..., row * coarse_row: (row + 1) * coarse_row + 1]
            interleaved = torch.cat([phase.unsqueeze(-1) for phase in torch.split(segment, cout, dim=1)],
                                    dim=-1).reshape(1, cout, (coarse_row + 1) * rate)
            if row == 0:  # fine 0 = cropped 1 = fine 2; each cut straight from `interleaved` (onnxslim's Slice
                # merge fails on a branching chain of Slices)
                fine = torch.cat([interleaved[..., start + 2: start + 3], interleaved[..., start + 1: start + length]],
                                 dim=-1)
            else:
                fine = interleaved[..., start: start + length]
            out.append(fine.unsqueeze(2))
        return torch.cat(out, dim=2) if rows > 1 else out[0]

    def forward(self, x, har, s, mask_coarse, mask_fine):
        g = self.generator
        kernels = len(g.config.resblock_kernel_sizes)
        share = 1.0 if g.mean_folded else 1.0 / kernels
        # stage 0 (coarse): the strided noise conv reads the fine rows
        x = F.leaky_relu(x, 0.1)
        source = row_conv(g.noise_convs[0], har)
        source = source.reshape(1, int(source.shape[1]), -1)[..., : self.coarse]
        source = g.noise_res[0](source, s, mask_coarse)
        x = g.ups[0](x)
        crop = g.crops[0]
        x = x[..., crop: x.shape[-1] - crop]
        x = (x + source) * mask_coarse
        total = g.resblocks[0](x, s, mask_coarse)
        for j in range(1, kernels):
            total = total + g.resblocks[j](x, s, mask_coarse)
        x = total * (mask_coarse if g.mean_folded else mask_coarse * share)
        # stage 1 (fine): rows
        x = F.leaky_relu(x, 0.1)
        source = g.noise_res[1](row_conv(g.noise_convs[1], har), s, mask_fine)
        x = (self._upsample_rows(x) + source) * mask_fine
        total = g.resblocks[kernels](x, s, mask_fine)
        for j in range(1, kernels):
            total = total + g.resblocks[kernels + j](x, s, mask_fine)
        x = total * (mask_fine if g.mean_folded else mask_fine * share)
        return row_conv(g.conv_post, F.leaky_relu(x))


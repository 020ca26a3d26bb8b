"""The stepwise gate against planted subtle faults (issue #14): one dilated-conv tail read one frame off, and the
K/V history one row short. Each must FAIL while the real step passes.

The gate (step_export.stepwise_verdict) is relative: the fp32 stepwise decode against the package decoder's float64
full decode, held to the package's own fp32 floor (its fp32 full decode against the same float64 one) less
rkaudio.gates.fp32_floor.FLOOR_MARGIN_DB = 10 dB. The old gate was an absolute 40 dB, which every fault below passed.
Measured (dB, fp32 stepwise vs float64 full decode; threshold = floor - 10):

| model, B                     | real step | tail one frame off | K/V one row short | threshold |
|------------------------------|-----------|--------------------|-------------------|-----------|
| tiny (this test), B=16       | 124.6     | 68.7 (first dilated conv; 54.6-55.5 deeper) | 104.1 | 114.3 |
| tiny (this test), B=64       | 124.3     | 75.9 (61.9-62.7 deeper)                     | 101.8 | 113.7 |
| real shape (seed 3), B=16    | 112.8     | 16.3               | 59.5              | 98.8      |
| real shape (seed 3), B=64    | 111.7     | 23.4               | 55.1              | 98.8      |

The K/V fault only shows once a step's queries reach a full history: a B=16 step sees the 72-frame window from
its sixth step on, so the gate decodes `stepwise_steps(B, kv_len)` steps (6 at B=16, 3 at B=64 real shape; with
two steps of 16 the K/V fault was invisible at real shape and 122.4 dB, a pass, on the tiny model)."""
from __future__ import annotations

import pytest
import torch

from rkaudio.families.qwen3_vocoder import step_export as E
from rkaudio.families.qwen3_vocoder.cache import RowCausalConv
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, step_of
from rkaudio.families.qwen3_vocoder.step import StreamingDecoder

OLD_THRESHOLD_DB = 40.0


def tail_read_one_frame_off(step: StreamingDecoder) -> str:
    """Plant: the first dilated conv reads its cached tail one frame late (every tail sample is the one before
    it), as an off-by-one in the tail's slice would. The first step (zeroed cache) is unaffected."""
    name, conv = next((n, m) for n, m in step.named_modules()
                      if isinstance(m, RowCausalConv) and m.conv.dilation[0] > 1)
    original = conv.forward

    def forward(x, state, new_state):
        tail = state[conv.tail]  # [1, 1, context, C], time-major
        late = torch.cat([tail[:, :, :1], tail[:, :, :-1]], dim=2)
        return original(x, {**state, conv.tail: late}, new_state)

    conv.forward = forward
    return name


def history_one_row_short(reference, config: dict) -> StreamingDecoder:
    """Plant: the K/V history holds sliding_window - 2 rows instead of sliding_window - 1 (the same weights):
    every query that should see the whole window sees one key fewer."""
    short = StreamingDecoder({**config, "sliding_window": config["sliding_window"] - 1})
    short.load_state_dict(reference.state_dict(), strict=True)
    return short.eval()


def gate(step, reference, frames: int):
    steps = E.stepwise_steps(frames, TINY_CONFIG["sliding_window"] - 1)
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, TINY_CONFIG["codebook_size"], (1, TINY_CONFIG["num_quantizers"], steps * frames),
                          generator=generator)
    verdict, _, _ = E.stepwise_verdict(step, reference, codes, frames)
    return verdict


@pytest.mark.parametrize("frames", [16, 64])
def test_planted_faults_fail_the_stepwise_gate_and_the_real_step_passes(tiny_reference, frames):
    real = gate(step_of(tiny_reference, TINY_CONFIG), tiny_reference, frames)
    off = step_of(tiny_reference, TINY_CONFIG)
    where = tail_read_one_frame_off(off)
    faults = {f"tail of {where} read one frame off": gate(off, tiny_reference, frames),
              "K/V history one row short": gate(history_one_row_short(tiny_reference, TINY_CONFIG), tiny_reference,
                                                frames)}
    print(f"\nB={frames}: fault -> measured -> threshold -> verdict")
    for name, verdict in {"real step": real, **faults}.items():
        print(f"  {name} -> {verdict.value:.1f} dB -> {verdict.threshold:.1f} dB -> "
              f"{'PASS' if verdict.passed else 'FAIL'} (old {OLD_THRESHOLD_DB:g} dB gate: "
              f"{'PASS' if verdict.value >= OLD_THRESHOLD_DB else 'FAIL'})")
    assert real.passed, real.line()
    for name, verdict in faults.items():
        assert not verdict.passed, f"{name}: {verdict.line()}"
        assert verdict.value > OLD_THRESHOLD_DB  # what the absolute gate let through


def test_the_gate_decodes_until_the_history_is_full():
    """Real shape kv_len 71: a B=16 gate decodes 6 steps (80 frames of history before the last), B=64 three."""
    assert E.stepwise_steps(16, 71) == 6 and E.stepwise_steps(64, 71) == 3
    assert E.stepwise_steps(16, 31) == 3 and E.stepwise_steps(64, 31) == 2

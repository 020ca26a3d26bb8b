"""The toolkit simulator (fp16) path: token-identical to torch FP32, or its first divergence explained by an
fp32 top-2 logit margin below fp16 resolution."""
from __future__ import annotations

import numpy as np

from converters.families.audio8 import checks
from runtime.kv_buckets import Audio8Runtime, Timings
from runtime.mel import log_mel


def test_simulator_tokens_match_or_divergence_is_an_fp16_tie(small_plan, require_converter):
    from runtime.backends import SimulatorBackend

    require_converter("2.3.2")
    placeholders = 50  # 4 s: one prompt keeps the simulator's per-graph builds within the test budget
    features = log_mel(checks.probe_audio(placeholders), 128)
    with Audio8Runtime(small_plan) as runtime:
        reference = runtime.decode(runtime.prompt_embeddings(features, placeholders, Timings()), 64, keep_logits=True)
    with Audio8Runtime(small_plan, backend_for=lambda path: SimulatorBackend(path, "rk3588")) as runtime:
        simulated = runtime.decode(runtime.prompt_embeddings(features, placeholders, Timings()), 64)
    verdict = checks.margin_explained_verdict("simulator_tokens[T50]", reference.tokens, reference.step_logits,
                                              simulated.tokens)
    print(verdict.line(), "| fp32:", reference.tokens, "| simulator:", simulated.tokens,
          "| top-2 margins:", [round(float(np.diff(np.sort(l)[-2:])[0]), 3) for l in reference.step_logits])
    assert verdict.passed, verdict.line()

"""The toolkit simulator (fp16) path: token-identical to torch FP32, or its first divergence explained by an
fp32 top-2 logit margin below fp16 resolution, for probe clips of any length through the one adapter and the
one prefill."""
from __future__ import annotations

import numpy as np

from rkaudio.families.audio8 import checks
from rkaudio.board.audio8 import Audio8Runtime, Timings
from rkaudio.board.mel import log_mel


class _Kept:
    """A simulator backend kept open across clips (the runtime releases the frontend after each prefill; each
    graph is compiled once for the whole test)."""

    def __init__(self, backend):
        self.backend = backend
        self.input_dtypes = backend.input_dtypes

    def run(self, feeds):
        return self.backend.run(feeds)


def test_simulator_tokens_match_or_divergence_is_an_fp16_tie(small_plan, require_converter):
    from rkaudio.host.backends import OnnxBackend, SimulatorBackend

    require_converter("2.3.2")
    compiled = {}

    def simulator(path):
        if path not in compiled:
            compiled[path] = SimulatorBackend(path, "rk3588")
        return _Kept(compiled[path])

    failed = []
    try:
        for seconds in checks.PROBE_SECONDS:
            audio = checks.probe_clip(seconds)
            features = log_mel(audio, 128)
            with Audio8Runtime(small_plan, backend_for=OnnxBackend) as runtime:
                placeholders = runtime.check_audio(audio.size)
                reference = runtime.decode(runtime.prompt_embeddings(features, placeholders, Timings()), 64,
                                           keep_logits=True)
            with Audio8Runtime(small_plan, backend_for=simulator) as runtime:
                simulated = runtime.decode(runtime.prompt_embeddings(features, placeholders, Timings()), 64)
            verdict = checks.margin_explained_verdict(f"simulator_tokens[{seconds:g}s]", reference.tokens,
                                                      reference.step_logits, simulated.tokens)
            print(verdict.line(), "| fp32:", reference.tokens, "| simulator:", simulated.tokens,
                  "| top-2 margins:", [round(float(np.diff(np.sort(l)[-2:])[0]), 3) for l in reference.step_logits])
            failed += [] if verdict.passed else [verdict.line()]
    finally:
        for backend in compiled.values():
            backend.close()
    assert not failed, failed
    assert {path.name for path in compiled} >= {"adapter.onnx", "prefill.onnx"}  # one of each served every clip

"""Audio8's exactness gates against the subtle faults they exist for (issue #14), and the whole-reference check:
a checkpoint that outputs zero logits decodes the same trivial tokens through any graph, and must fail.

Planted: the RoPE position one off after a K/V bucket migration (every token from the migration on gets the
cos/sin of position + 1, its K row and its query alike). The stress run crosses both migrations of the small
plan (128 -> 256 -> 512). Measured on the small model: the real graphs' worst decode step 8.7e-06, the fault
0.43 at the first step after the migration (while that step still picks torch's token), worst step 1.49;
threshold `checks.MAX_STEP_REL_L2` (1e-4). On the real-shape random model (measured once, 11 min, not run here:
buckets 128/256, T25) the real graphs give 4.9e-07 and the fault 1.06e-03 with all 222 stress tokens identical,
so the token gate alone passes it and a threshold of 1e-3 would only just catch it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rkaudio.families.audio8 import checks, graphs_job
from rkaudio.board.audio8 import Audio8Runtime
from rkaudio.host.backends import OnnxBackend

SILENT = "the reference output is silent: the checkpoint or the inputs make the model output zeros"


class RopeOneOffAfterMigration(Audio8Runtime):
    """The planted fault: from the first migration on, every decode step's RoPE position is one too far."""

    def decode(self, *args, **kwargs):
        self.migrated = False
        return super().decode(*args, **kwargs)

    def _migrate(self, *args):
        self.migrated = True
        return super()._migrate(*args)

    def _rope(self, position):
        return super()._rope(position + 1 if self.migrated else position)


@pytest.fixture(scope="module")
def stress_runs(small_model, small_plan):
    runs = {}
    for name, runtime_class in (("real", Audio8Runtime), ("planted", RopeOneOffAfterMigration)):
        with runtime_class(small_plan, backend_for=OnnxBackend) as runtime:
            run = checks.stress_run(small_model, runtime)
        verdicts = checks.run_verdicts(run, [128, 256, 512])
        runs[name] = run, {v.name.split("[")[0]: v for v in verdicts}
    return runs


def test_step_logit_gate_fails_the_rope_position_one_off_after_a_migration(stress_runs):
    real, real_verdicts = stress_runs["real"]
    planted, planted_verdicts = stress_runs["planted"]
    assert real.decoded.buckets == planted.decoded.buckets == [128, 256, 512]
    real_step, planted_step = real_verdicts["stress_step_logits_rel_l2"], planted_verdicts["stress_step_logits_rel_l2"]
    print(f"real: {real_step.line()}\nplanted: {planted_step.line()}\nplanted tokens: "
          f"{planted_verdicts['stress_tokens'].line()}")
    assert all(v.passed for v in real_verdicts.values()), [v.line() for v in real_verdicts.values()]
    assert real_step.value < checks.MAX_STEP_REL_L2 / 5  # measured 8.7e-06
    assert not planted_step.passed and planted_step.value > 1000 * checks.MAX_STEP_REL_L2  # measured 1.49
    # the steps before the migration are the real ones: the fault starts exactly at the migration
    migration = real.decoded.timings.migrations[0]["position"]
    reference, test, positions = planted.step_figures()
    per_step = np.linalg.norm(test - reference, axis=1) / np.linalg.norm(reference, axis=1)
    before = [figure for figure, position in zip(per_step, positions) if position < migration]
    assert before and max(before) < checks.MAX_STEP_REL_L2 / 5, max(before)


def test_step_logit_gate_fails_where_no_token_has_flipped_yet(stress_runs):
    """On the steps whose tokens still agree with torch, the token gate sees nothing; the step gate fails."""
    planted, _ = stress_runs["planted"]
    divergence = checks.first_divergence(planted.reference, planted.decoded.tokens)
    assert divergence is not None and divergence > 1
    reference, test, positions = planted.step_figures()
    agreeing = slice(0, divergence - 1)  # decode step i chose token i + 1
    tokens = checks.token_verdict("agreeing tokens", planted.reference[:divergence], planted.decoded.tokens[:divergence])
    steps = checks.step_logits_verdict("agreeing steps", reference[agreeing], test[agreeing], positions[agreeing],
                                       [128, 256, 512])
    print(tokens.line(), "|", steps.line())
    assert tokens.passed and not steps.passed and steps.value > 1000 * checks.MAX_STEP_REL_L2  # measured 0.43


def test_every_comparison_gate_judges_its_whole_reference():
    logits = np.random.default_rng(0).standard_normal((6, 40)) * 5
    reference, test = logits, logits * (1 + 1e-7)
    assert checks.step_logits_verdict("s", reference, test, list(range(35, 41)), [128]).passed
    assert checks.rel_l2_verdict("r", reference, test, 1e-4).passed
    quiet = logits.copy()
    quiet[2] *= 1e-9  # one near-silent step of a real run is not a silent checkpoint
    assert checks.degenerate(quiet) is None and checks.step_logits_verdict("s", quiet, quiet, [0] * 6, [128]).passed
    for bad, words in ((np.zeros_like(logits), SILENT), (np.full_like(logits, 3.0), "constant (3)"),
                       (np.where(logits > 2, np.nan, logits), "non-finite"),
                       (np.vstack([logits[:3], np.full((1, 40), 0.5), logits[4:]]), "constant over the vocabulary at step 3")):
        verdicts = [checks.step_logits_verdict("s", bad, bad, [0] * len(bad), [128]),
                    checks.rel_l2_verdict("r", bad, bad, 1e-4),
                    checks.token_verdict("t", [1, 2], [1, 2], bad),
                    checks.margin_explained_verdict("m", [1, 2], list(bad), [1, 2])]
        for verdict in verdicts:
            assert not verdict.passed and math.isnan(verdict.value) and words in verdict.detail, verdict.line()


def test_a_checkpoint_with_zero_logits_fails_its_export_with_the_silent_message(tmp_path):
    """The small model with its final RMSNorm weight all zero (a checkpoint saved without it) outputs logits of
    exactly 0: greedy picks token 0 forever through torch and through the graphs alike, identical tokens that
    used to pass. Every gate on the logits fails with the silent-reference reason; the adapter keeps its figure."""
    import torch

    from rkaudio.families.audio8 import model as M
    from rkaudio.families.audio8.export import export
    from rkaudio.core.errors import GateFailure
    from rkaudio.board.numeric import DEGENERATE_ADVICE

    silent = M.build_random(M.small_config(), seed=0)
    with torch.no_grad():
        silent.decoder.model.norm.weight.zero_()
    with pytest.raises(GateFailure) as failure:
        export(graphs_job(tmp_path, [128, 256], head_shards=2), silent, stress=False, say=lambda _: None,
               clips=[1.9])
    failed = {v.name: v for v in failure.value.verdicts}
    print(str(failure.value))
    assert set(failed) == {"greedy_tokens[1.9s]", "prefill_logits_rel_l2[1.9s]", "step_logits_rel_l2[1.9s]"}
    assert all(math.isnan(v.value) and v.detail.startswith(SILENT) for v in failed.values())
    assert failure.value.advice == DEGENERATE_ADVICE and SILENT in str(failure.value)

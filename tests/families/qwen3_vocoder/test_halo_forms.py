"""The row convs' halo forms (issue #43, rkaudio/families/qwen3_vocoder/cache.py HALO_FORMS): the rows joined with
their halo in either axis order against an independent float64 reference, every form's stepwise decode through the
family's stepwise gate, and a form whose tail crosses in the wrong order failing that gate."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rkaudio.families.qwen3_vocoder import cache
from rkaudio.families.qwen3_vocoder import step_export as E
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, step_of

CHANNELS = 5


def reference_extend_rows(rows: np.ndarray, tail: np.ndarray, context: int):
    """rows [R, L, C], tail [context, C] -> (each row preceded by the `context` samples before it in the signal,
    [R, context + L, C]; the signal's last `context` samples): read off the signal laid out whole, in float64."""
    count, length, _ = rows.shape
    signal = np.concatenate([tail, rows.reshape(count * length, -1)])
    extended = np.stack([signal[row * length : row * length + context + length] for row in range(count)])
    return extended, signal[-context:]


@pytest.mark.parametrize("rows, length, context", [(4, 8, 6), (1, 16, 6), (3, 4, 9), (2, 5, 12), (5, 3, 3)])
def test_extend_rows_in_either_order_is_the_signal_read_whole(rows, length, context):
    generator = np.random.default_rng(rows * 100 + context)
    x = generator.standard_normal((rows, length, CHANNELS))
    tail = generator.standard_normal((context, CHANNELS))
    want, want_tail = reference_extend_rows(x, tail, context)
    last = torch.from_numpy(x)[None]  # [1, R, L, C]
    extended, new_tail = cache.extend_rows(last, torch.from_numpy(tail)[None, None], context)
    np.testing.assert_array_equal(extended[0].numpy(), want)
    np.testing.assert_array_equal(new_tail[0, 0].numpy(), want_tail)
    first = last.permute(0, 3, 1, 2)  # [1, C, R, L]
    extended, new_tail = cache.extend_rows(first, torch.from_numpy(tail.T)[None, :, None], context, channels_first=True)
    np.testing.assert_array_equal(extended[0].permute(1, 2, 0).numpy(), want)
    np.testing.assert_array_equal(new_tail[0, :, 0].numpy().T, want_tail)


def stepwise(step, reference, frames: int):
    steps = E.stepwise_steps(frames, TINY_CONFIG["sliding_window"] - 1)
    codes = torch.randint(0, TINY_CONFIG["codebook_size"], (1, TINY_CONFIG["num_quantizers"], steps * frames),
                          generator=torch.Generator().manual_seed(1))
    return E.stepwise_verdict(step, reference, codes, frames)[0]


@pytest.mark.parametrize("form", cache.HALO_FORMS)
def test_every_halo_form_passes_the_stepwise_gate(tiny_reference, form):
    step = step_of(tiny_reference, TINY_CONFIG).with_halo_form(form)
    verdict = stepwise(step, tiny_reference, 16)
    print(f"{form}: {verdict.line()}")
    assert verdict.passed, verdict.line()


def test_a_tail_crossing_in_the_wrong_order_fails_the_stepwise_gate(tiny_reference, monkeypatch):
    """Plant: the tail forms' time-major [context, C] read as if it were stored [C, context] (a Reshape where the
    Transpose belongs), on the way in and out of the cache."""
    step = step_of(tiny_reference, TINY_CONFIG).with_halo_form("tail_transpose")
    faithful = stepwise(step, tiny_reference, 16)
    monkeypatch.setattr(cache, "_time_major_rows",
                        lambda tail, form: tail.reshape(int(tail.shape[1]), int(tail.shape[0])).t())
    planted = stepwise(step, tiny_reference, 16)
    print(f"faithful: {faithful.line()}\nplanted: {planted.line()}")
    assert faithful.passed and not planted.passed, planted.line()


def test_the_forms_share_one_cache_layout_and_an_unknown_form_is_refused(tiny_reference):
    step = step_of(tiny_reference, TINY_CONFIG)
    layouts = {form: step.with_halo_form(form).layout.to_json() for form in cache.HALO_FORMS}
    assert all(layout == layouts["channels_last"] for layout in layouts.values())
    with pytest.raises(ValueError, match="halo form 'rows_first'"):
        step.with_halo_form("rows_first")


def test_each_target_ships_the_form_its_real_shape_rows_pick():
    """step_export.HALO_FORM_BY_TARGET is read off bench/results/qwen3_halo_forms.json (the real shape): at each
    target's largest measured B, the bench's rule (`picks`: within the board-time model's error of the fastest, the
    fewest CPU ops) names the form the family exports for that target."""
    import importlib.util
    import json

    from rkaudio.core.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("bench_qwen3_halo_forms", REPO_ROOT / "bench" / "qwen3_halo_forms.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = json.loads((REPO_ROOT / "bench" / "results" / "qwen3_halo_forms.json").read_text())["rows"]
    largest = {}
    for row in rows:
        largest[row["target"]] = max(largest.get(row["target"], 0), row["B"])
    picked = {target: form for target, frames, form in bench.picks(rows) if frames == largest[target]}
    assert picked == {target: E.halo_form_for(target) for target in picked}
    assert set(picked) == set(bench.TARGETS)

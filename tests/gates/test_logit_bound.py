"""The logit-bound gate of the exp-ratio attention form on hand-made logits: both verdicts pass inside
[bound - EXP_WINDOW, bound], `attention_logit_max` fails above the bound, `attention_row_max_floor` fails on a row
whose largest logit is under the window, a fully masked row is not a row, and no Softmax is refused. Without a
bound (the row-max shift) one verdict, `attention_logit_max_abs`, fails past the clip in front of the max tree."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.gates.logit_bound import EXP_WINDOW, ROW_MAX_LOGIT_CLIP, logit_bound_verdicts

BOUND = 8.0
MASKED = -1.0e4


def logits(row_maxima) -> np.ndarray:
    """[1, heads, rows, 4] logits whose row maxima are `row_maxima` [heads, rows], the other keys 0.5 to 2 under."""
    row_maxima = np.asarray(row_maxima, np.float64)
    return (row_maxima[None, ..., None] - np.array([0.0, 0.5, 1.0, 2.0])).astype(np.float32)


def by_name(verdicts) -> dict:
    return {verdict.name: verdict for verdict in verdicts}


def test_logits_inside_the_window_pass():
    inside = {"encoder/softmax": logits([[BOUND, 1.0], [0.0, BOUND - EXP_WINDOW + 0.01]]),
              "decoder/softmax": logits([[2.0, 3.0]])}
    verdicts = by_name(logit_bound_verdicts(inside, BOUND))
    assert set(verdicts) == {"attention_logit_max", "attention_row_max_floor"}
    assert all(v.passed and not v.advice for v in verdicts.values())
    assert verdicts["attention_logit_max"].value == BOUND
    assert verdicts["attention_logit_max"].threshold == BOUND
    assert verdicts["attention_row_max_floor"].value == pytest.approx(BOUND - EXP_WINDOW + 0.01)
    assert verdicts["attention_row_max_floor"].threshold == pytest.approx(BOUND - EXP_WINDOW)
    assert "encoder/softmax" in verdicts["attention_logit_max"].detail
    assert "6 rows" in verdicts["attention_row_max_floor"].detail


def test_a_logit_above_the_bound_fails():
    above = {"softmax": logits([[1.0, BOUND + 0.25]])}
    verdicts = by_name(logit_bound_verdicts(above, BOUND, suffix="[main]"))
    top = verdicts["attention_logit_max[main]"]
    assert not top.passed and top.value == BOUND + 0.25 and "raise the family's logit bound" in top.advice
    assert verdicts["attention_row_max_floor[main]"].passed


def test_a_row_max_under_the_window_fails():
    low = {"softmax": logits([[BOUND, BOUND - EXP_WINDOW - 0.01]])}
    verdicts = by_name(logit_bound_verdicts(low, BOUND))
    floor = verdicts["attention_row_max_floor"]
    assert not floor.passed and floor.value == pytest.approx(BOUND - EXP_WINDOW - 0.01) and floor.advice
    assert verdicts["attention_logit_max"].passed


def test_a_fully_masked_row_is_ignored():
    masked = logits([[BOUND, 1.0, 2.0]])
    masked[0, 0, 1] = MASKED + np.array([0.0, 0.5, 1.0, 2.0], np.float32)  # every key masked_fill -1e4
    masked[0, 0, 2, 1:] = MASKED  # a partly masked row keeps its open key
    verdicts = by_name(logit_bound_verdicts({"softmax": masked}, BOUND))
    assert all(v.passed for v in verdicts.values())
    assert verdicts["attention_row_max_floor"].value == 2.0  # the partly masked row's open key
    assert "2 rows" in verdicts["attention_row_max_floor"].detail
    # only masked rows: nothing under the window
    alone = by_name(logit_bound_verdicts({"softmax": np.full((1, 1, 2, 4), MASKED, np.float32)}, BOUND))
    assert alone["attention_row_max_floor"].passed and "0 rows" in alone["attention_row_max_floor"].detail


def test_the_row_max_shift_bounds_only_the_clip():
    wide = logits([[40.0, -20.0]])
    wide[0, 0, 1, 1:] = np.finfo(np.float32).min  # a mask far past the clip is not a logit
    (verdict,) = logit_bound_verdicts({"softmax": wide}, None, suffix="[main]")
    assert verdict.name == "attention_logit_max_abs[main]" and verdict.passed
    assert verdict.value == 40.0 and verdict.threshold == ROW_MAX_LOGIT_CLIP and "row-max" in verdict.detail
    wide[0, 0, 0, 2] = ROW_MAX_LOGIT_CLIP + 1.0
    (verdict,) = logit_bound_verdicts({"softmax": wide}, None)
    assert not verdict.passed and verdict.value == ROW_MAX_LOGIT_CLIP + 1.0 and "clips logits" in verdict.advice


def test_no_softmax_is_refused():
    with pytest.raises(ValueError, match="no Softmax"):
        logit_bound_verdicts({}, BOUND)

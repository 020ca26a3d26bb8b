"""The export gate of the RK3566 attention form (`rkaudio.surgery.graph.attention.softmax_as_exp_ratio`). With a
constant bound its exp is exact up to fp16 only while every attention logit is at most the bound, and while each
row's largest logit is within EXP_WINDOW under it (below, its weights leave fp16's normal range). With the row-max
shift only the clip in front of the max tree limits it: every unmasked logit within +-ROW_MAX_LOGIT_CLIP. Judged on
the self-check inputs, on the graph before the pass (its Softmax inputs are the logits: `rkaudio.pipeline.attention`
runs it), and recorded in the manifest with the export verdicts."""
from __future__ import annotations

import math

import numpy as np

from rkaudio.board.verdict import Verdict, at_least, at_most

# exp(x) for x <= 0 is Sigmoid(x) / Sigmoid(-x); below -EXP_WINDOW the numerator leaves fp16's normal range
# (2^-14), so a row whose largest logit is more than EXP_WINDOW under the bound loses its precision.
EXP_WINDOW = 14 * math.log(2.0)

# A row whose largest logit is below this is a fully masked row (masked_fill -1e4, -inf, finfo.min): its weights
# are all 0 in the exp-ratio form, and its output (0) is masked downstream.
MASKED_LOGIT = -1.0e3
# The row-max form (`rkaudio.surgery.graph.attention.row_max`) clips logits to this first: inside fp16 (65504) with
# room for its tree's differences, and far beyond any unmasked attention logit (this gate checks that).
ROW_MAX_LOGIT_CLIP = 30000.0
ADVICE = ("the exp-ratio attention form needs every attention logit within [bound - {window:.2f}, bound] on the "
          "self-check inputs: raise the family's logit bound for this target (a row whose largest logit sits far "
          "under it loses fp16 precision), or keep the native Softmax form on this target")


def logit_bound_verdicts(logits: dict[str, np.ndarray], bound: float | None, suffix: str = "") -> list[Verdict]:
    """Gates over the logits of every attention Softmax (by its name; the last axis is the keys). With a `bound`:
    `attention_logit_max` (the largest logit, at most `bound`) and `attention_row_max_floor` (the lowest
    largest-logit of a row with any unmasked key, at least bound - EXP_WINDOW). With None (the row-max shift):
    `attention_logit_max_abs` (the largest |logit| of the unmasked ones, at most ROW_MAX_LOGIT_CLIP)."""
    if not logits:
        raise ValueError("logit bound gate: the graph has no Softmax (no attention to bound)")
    if bound is None:
        return [_row_max_verdict(logits, suffix)]
    largest = max(float(np.max(values)) for values in logits.values())
    row_maxima = np.concatenate([np.max(values, axis=-1).ravel() for values in logits.values()])
    open_rows = row_maxima[row_maxima > MASKED_LOGIT]
    lowest = float(np.min(open_rows)) if open_rows.size else float(bound)
    where = max(logits, key=lambda name: float(np.max(logits[name])))
    advice = ADVICE.format(window=EXP_WINDOW)
    top = at_most(f"attention_logit_max{suffix}", largest, bound, "logit",
                  f"largest at {where}, over {len(logits)} attention Softmax")
    floor = at_least(f"attention_row_max_floor{suffix}", lowest, bound - EXP_WINDOW, "logit",
                     f"{open_rows.size} rows with an unmasked key")
    return [Verdict(**{**v.__dict__, "advice": advice}) if not v.passed else v for v in (top, floor)]


def _row_max_verdict(logits: dict[str, np.ndarray], suffix: str) -> Verdict:
    """`attention_logit_max_abs`: the largest |logit| above MASKED_LOGIT, at most the row-max form's clip."""
    open_abs = {name: np.abs(values[values > MASKED_LOGIT]) for name, values in logits.items()}
    largest = {name: float(values.max()) if values.size else 0.0 for name, values in open_abs.items()}
    where = max(largest, key=largest.get)
    verdict = at_most(f"attention_logit_max_abs{suffix}", largest[where], ROW_MAX_LOGIT_CLIP, "logit",
                      f"largest at {where}, over {len(logits)} attention Softmax (row-max shift)")
    advice = ("the row-max attention form clips logits to +-{:.0f} before its max tree: a logit past it is no "
              "attention logit a trained model gives; check the self-check inputs, or keep the native form on this "
              "target").format(ROW_MAX_LOGIT_CLIP)
    return verdict if verdict.passed else Verdict(**{**verdict.__dict__, "advice": advice})

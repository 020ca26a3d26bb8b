"""AttentionForms, a family's attention form per target, on a small self-attention graph: a native target gets the
exporter's graph back and no verdict; rk3566 (exp_ratio) gets `exp_ratio_attention`'s graph and the two logit-bound
verdicts judged on the graph's own logits; an unknown form and a graph without Softmax are refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from rkaudio.gates.logit_bound import EXP_WINDOW, MASKED_LOGIT
from rkaudio.pipeline.attention import AttentionForms, attention_logits
from rkaudio.surgery.graph.attention import exp_ratio_attention
from tests.surgery.test_attention import (HEADS, ROWS, assert_exp_ratio_close, attention_graph, bounded_feeds,
                                          feeds_for, reference, reference_logits, run)

FORMS = AttentionForms(forms={"rk3566": "exp_ratio"}, logit_bound=6.0)


def by_name(verdicts) -> dict:
    return {verdict.name: verdict for verdict in verdicts}


def test_native_targets_keep_the_exporters_graph():
    rng = np.random.default_rng(0)
    model, _ = attention_graph(rng)
    feeds = feeds_for(rng)
    for forms, target in ((FORMS, "rk3588"), (FORMS, "rk3576"), (AttentionForms(), "rk3566")):
        same, verdicts = forms.apply(model, target, feeds)
        assert same is model and verdicts == []


def test_rk3566_takes_the_exp_ratio_form_and_its_logit_verdicts():
    rng = np.random.default_rng(1)
    model, p = attention_graph(rng)
    feeds = feeds_for(rng)
    before = model.SerializeToString()
    rewritten, verdicts = FORMS.apply(model, "rk3566", feeds, suffix="[main]")
    assert model.SerializeToString() == before  # the exporter's graph is left as it was
    assert rewritten.SerializeToString() == exp_ratio_attention(model, FORMS.logit_bound).SerializeToString()
    assert "Softmax" not in {node.op_type for node in rewritten.graph.node}
    assert_exp_ratio_close(run(rewritten, feeds), reference(p, feeds, True))

    logits = reference_logits(p, feeds)
    open_maxima = logits.max(axis=-1)[logits.max(axis=-1) > MASKED_LOGIT]
    verdicts = by_name(verdicts)
    assert set(verdicts) == {"attention_logit_max[main]", "attention_row_max_floor[main]"}
    top, floor = verdicts["attention_logit_max[main]"], verdicts["attention_row_max_floor[main]"]
    assert top.value == pytest.approx(logits.max(), abs=1e-5) and top.threshold == FORMS.logit_bound
    assert floor.value == pytest.approx(open_maxima.min(), abs=1e-5)
    assert floor.threshold == pytest.approx(FORMS.logit_bound - EXP_WINDOW)
    assert top.passed and floor.passed
    assert set(attention_logits(model, feeds)) == {"attention_softmax"}


def test_logits_above_the_bound_fail_their_verdict():
    model, p = attention_graph(np.random.default_rng(2), mask_heads=HEADS)
    row_maxima = np.full((HEADS, ROWS), FORMS.logit_bound - 1.0)
    row_maxima[1, 2] = FORMS.logit_bound + 1.5
    feeds = bounded_feeds(np.random.default_rng(3), p, row_maxima)
    _, verdicts = FORMS.apply(model, "rk3566", feeds)
    top = by_name(verdicts)["attention_logit_max"]
    assert not top.passed and top.value == pytest.approx(FORMS.logit_bound + 1.5, abs=1e-5) and top.advice


def test_the_row_max_shift_is_the_default_and_records_the_largest_logit():
    model, p = attention_graph(np.random.default_rng(7), mask_heads=HEADS)
    row_maxima = np.full((HEADS, ROWS), FORMS.logit_bound + 20.0)  # far above any bound
    feeds = bounded_feeds(np.random.default_rng(8), p, row_maxima)
    rewritten, verdicts = AttentionForms(forms={"rk3566": "exp_ratio"}).apply(model, "rk3566", feeds)
    assert rewritten.SerializeToString() == exp_ratio_attention(model).SerializeToString()
    assert_exp_ratio_close(run(rewritten, feeds)[:, :-1], reference(p, feeds, False)[:, :-1])
    (verdict,) = verdicts
    assert verdict.name == "attention_logit_max_abs" and verdict.passed
    assert verdict.value == pytest.approx(FORMS.logit_bound + 20.0, abs=1e-4)


def test_unknown_forms_and_graphs_without_softmax_are_refused():
    with pytest.raises(ValueError, match="flash"):
        AttentionForms(forms={"rk3566": "flash"})
    plain = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "plain",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="no Softmax"):
        FORMS.apply(plain, "rk3566", {"x": np.ones((1, 4), np.float32)})

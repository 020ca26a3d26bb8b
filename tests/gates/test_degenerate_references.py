"""A comparison gate refuses a reference that cannot judge anything (silent, constant, non-finite), in words,
judging the whole reference: a quiet stretch inside real audio is not a silent checkpoint."""
import math

import numpy as np
import pytest

from rkaudio.gates.snr import snr_verdict
from rkaudio.board.numeric import degenerate_reference, snr_db

RNG = np.random.default_rng(0)
SPEECH = 0.3 * RNG.standard_normal(24000)


@pytest.mark.parametrize("reference, words", [
    (np.zeros(24000), "silent"),
    (np.full(24000, 0.25), "constant"),
    (1e-9 * RNG.standard_normal(24000), "silent (RMS"),
    (np.where(np.arange(24000) == 7, np.nan, SPEECH), "non-finite"),
], ids=["all-zero", "constant", "1e-9-noise", "nan"])
def test_degenerate_references_fail_with_the_reason(reference, words):
    verdict = snr_verdict("stepwise_vs_full", reference, reference.copy(), 40.0)
    assert not verdict.passed and math.isnan(verdict.value)
    assert words in verdict.detail
    # What the gate used to say: silence against silence is an exact match.
    if not np.isnan(reference).any() and not np.any(reference):
        assert snr_db(reference, reference.copy()) == math.inf


def test_a_real_reference_with_one_silent_window_is_judged_as_a_whole():
    reference = SPEECH.copy()
    reference[:2400] = 0.0  # a quiet start of the sentence
    assert degenerate_reference(reference) is None
    verdict = snr_verdict("window_vs_full", reference, reference + 1e-5 * RNG.standard_normal(reference.size), 40.0)
    assert verdict.passed and verdict.value > 80


def test_rms_rule_uses_the_family_full_scale_and_can_be_skipped():
    logits = 1e-4 * RNG.standard_normal(1000)
    assert "silent" in degenerate_reference(logits, full_scale=1000.0)
    assert degenerate_reference(logits, full_scale=None) is None


def _build(*args):
    import subprocess
    import sys

    from rkaudio.core.paths import REPO_ROOT

    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "build", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("damage", ["truncated", "text", "nan-weight"])
def test_convert_build_refuses_a_damaged_onnx_in_one_line(tmp_path, damage, refused_in_one_line):
    import onnx
    from onnx import helper, numpy_helper

    weight = np.ones((4, 4), np.float32)
    if damage == "nan-weight":
        weight[1, 2] = np.nan
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "model.onnx"
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "text":
        data = b"this is a README, not a model\n"
    path.write_bytes(data)
    result = _build(str(path), "--target", "rk3588", "--out", str(tmp_path / "out"))
    line = refused_in_one_line(result, path)
    if damage == "nan-weight":
        assert "constant 'w'" in line and "NaN/Inf" in line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())

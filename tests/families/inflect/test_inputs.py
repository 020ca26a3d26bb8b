"""Wrong official files fail with a message that says what was expected."""
from __future__ import annotations

import onnx
import pytest
from typer.testing import CliRunner

from rkaudio.families.inflect import decoder as D
from rkaudio.core.errors import SetupError


def test_decode_onnx_without_the_expected_inputs_is_refused(official, tmp_path):
    _, paths = official
    model = onnx.load(str(paths["decode"]))
    for graph_input in model.graph.input:
        if graph_input.name == "zp_noise":
            graph_input.name = "noise"
    for node in model.graph.node:
        node.input[:] = ["noise" if i == "zp_noise" else i for i in node.input]
    bad = tmp_path / "decode.onnx"
    onnx.save(model, str(bad))
    with pytest.raises(SetupError, match=r"not an Inflect v2 decode.onnx.*missing: \['zp_noise'\]"):
        D.load_decode(bad)


def test_duration_of_another_size_is_refused(micro_official, nano_official):
    with pytest.raises(SetupError, match=r"C=128 channels but the decoder takes C=192"):
        D.describe(micro_official[1]["decode"], nano_official[1]["duration"])
    with pytest.raises(SetupError, match=r"C=192 channels but the decoder takes C=128"):
        D.describe(nano_official[1]["decode"], micro_official[1]["duration"])


def test_cli_turns_a_wrong_file_into_a_clean_message(official, tmp_path):
    """`convert inflect` with a duration.onnx given as decode.onnx: exit 2 and one clear line, no traceback."""
    from rkaudio.cli import _register_all, app

    _, paths = official
    _register_all()
    result = CliRunner().invoke(app, ["inflect", "--decode-onnx", str(paths["duration"]), "--skip-rknn",
                                      "--out", str(tmp_path)], catch_exceptions=True)
    assert isinstance(result.exception, SetupError)
    assert "is not an Inflect v2 decode.onnx" in str(result.exception)


def test_selfcheck_refuses_a_decode_onnx_of_another_size(micro_official, nano_slice):
    from rkaudio.families.inflect.decoder import selfcheck_verdicts

    with pytest.raises(SetupError, match=r"takes latents of 192 channels but the slice .* was cut for 128"):
        selfcheck_verdicts(nano_slice, micro_official[1]["decode"], None, say=lambda *_: None)

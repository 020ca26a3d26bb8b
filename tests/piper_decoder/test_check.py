"""`convert check piper`: text -> piper-tts phonemes -> windowed decoder and full voice, two WAVs, figures."""
from __future__ import annotations

from typer.testing import CliRunner

from converters.cli import _register_all, app
from runtime.host.audio import read_wav


def test_check_piper_renders_both_paths(joe_exports, tmp_path):
    _register_all()
    out = tmp_path / "check.wav"
    result = CliRunner().invoke(app, ["check", "piper", "--text", "Hello there. This sentence is long enough to "
                                      "need several windows of the decoder.", "--engine",
                                      str(joe_exports[False].onnx), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "interior" in result.output and "max sample-to-sample step" in result.output
    windowed, rate = read_wav(out)
    full, full_rate = read_wav(out.with_suffix(".full.wav"))
    assert rate == full_rate == 22050 and windowed.shape == full.shape and windowed.size > rate
    assert out.with_suffix(".png").is_file()


def _convert(args):
    """Run `convert` as the console script does (SetupError/GateFailure become exit codes 2/3)."""
    import sys

    from converters import cli

    argv, sys.argv = sys.argv, ["convert", *args]
    try:
        cli.main()
    except SystemExit as exit_:
        return exit_.code
    finally:
        sys.argv = argv
    return 0


def test_convert_piper_refuses_a_graph_that_is_not_a_piper_voice(tmp_path, capsys):
    import json

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((2, 2, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    voice = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph), str(voice))
    voice.with_name("conv.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 22050}, "phoneme_id_map": {}}))
    assert _convert(["piper", "--voice-onnx", str(voice), "--skip-rknn", "--out", str(tmp_path)]) == 2
    assert "not a Piper VITS voice" in capsys.readouterr().err


def test_convert_piper_encoder_hands_over_to_the_encoder_export(monkeypatch, tmp_path):
    from converters.families.piper import encoder

    calls = []
    monkeypatch.setattr(encoder, "export", lambda *args: calls.append(args) or [])
    assert _convert(["piper", "--encoder", "--frames", "128,192", "--skip-rknn", "--out", str(tmp_path)]) == 0
    (call,) = calls
    voice, frames, out_dir, max_drift_pct, target, toolkit = call
    assert (voice, frames, out_dir, max_drift_pct, target) == (None, [128, 192], tmp_path, None, "rk3588")

"""`convert check piper`: text -> piper-tts phonemes -> windowed decoder and full voice, two WAVs, figures."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from rkaudio.cli import _register_all, app
from rkaudio.host.audio import read_wav


def _check(*args: str):
    _register_all()
    return CliRunner().invoke(app, ["check", "piper", *args])


@pytest.mark.slow
def test_check_piper_renders_the_walk_through_fp32_and_the_engine_beside_the_full_voice(joe_exports, tmp_path):
    out = tmp_path / "check.wav"
    result = _check("--text", "Hello there. This sentence is long enough to need several windows of the decoder.",
                    "--engine", str(joe_exports[False].onnx), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "interior" in result.output and "max sample-to-sample step" in result.output
    # the default backend is the fp16 estimate (every tensor rounded to fp16), never the fp32 walk against itself
    assert "(onnxruntime, every tensor rounded to fp16: the fp16 estimate)" in result.output
    assert 20.0 < float(re.search(r"engine render vs fp32 render: (\S+) dB overall", result.output).group(1)) < 90.0
    engine, rate = read_wav(out)
    fp32, _ = read_wav(out.with_suffix(".fp32.wav"))
    full, full_rate = read_wav(out.with_suffix(".full.wav"))
    assert rate == full_rate == 22050 and engine.shape == fp32.shape == full.shape and engine.size > rate
    assert out.with_suffix(".png").is_file()
    assert "heard (engine)" in result.output and "engine render vs fp32 render's transcript: WER 0.0%" in result.output


@pytest.mark.slow
def test_check_piper_hears_the_engine_compiled_in_the_simulator(joe_exports, tmp_path, require_converter):
    """--backend simulator: the same walk through the engine compiled for the target, fp16 noise and all."""
    require_converter()
    out = tmp_path / "sim.wav"
    result = _check("--text", "The quick brown fox jumps over the lazy dog, twice.", "--backend", "simulator",
                    "--target", "RK3576", "--engine", str(joe_exports[False].onnx), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "in the rknn-toolkit2 2.3.2 simulator" in result.output and "(simulator, rk3576, toolkit 2.3.2)" in result.output
    overall = float(re.search(r"engine render vs fp32 render: ([-\d.]+) dB overall", result.output).group(1))
    per_window = [float(v) for v in re.findall(r"engine vs fp32 +([-\d.]+) dB", result.output)]
    assert 30.0 < overall < 80.0 and len(per_window) >= 2 and min(per_window) > 25.0  # fp16 noise, not silence
    assert read_wav(out)[0].shape == read_wav(out.with_suffix(".fp32.wav"))[0].shape
    assert re.search(r"heard \(engine\): 'the quick brown fox", result.output)


def test_check_piper_defaults_to_the_window_the_recipe_ships_for_the_target(monkeypatch, tmp_path):
    """No --engine, no --window: the export is at the recipe's window for --target (rk3566: 127)."""
    from rkaudio.families.piper import decoder

    asked = []

    def refuse(job):
        asked.append((job.options.window, job.options.context, job.target))
        raise SystemExit(0)

    monkeypatch.setattr(decoder, "export", refuse)
    _check("--text", "Hi.", "--target", "rk3566", "--out", str(tmp_path / "x.wav"))
    _check("--text", "Hi.", "--target", "rk3588", "--window", "109", "--out", str(tmp_path / "x.wav"))
    assert asked == [(127, 32, "rk3566"), (109, 32, "rk3588")]


def _convert(args):
    """Run `convert` as the console script does (SetupError/GateFailure become exit codes 2/3)."""
    import sys

    from rkaudio import cli

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
    from rkaudio.families.piper import encoder

    calls = []
    monkeypatch.setattr(encoder, "export", lambda job: calls.append(job) or [])
    assert _convert(["piper", "--encoder", "--frames", "128,192", "--skip-rknn", "--out", str(tmp_path)]) == 0
    (job,) = calls
    assert (job.component.name, job.source.voice_onnx, job.options.frames, job.out, job.gates.max_drift_pct,
            job.target) == ("duration_encoder", None, [128, 192], tmp_path, None, "rk3588")

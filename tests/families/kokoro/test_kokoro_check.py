"""`convert check kokoro`: the generator inputs tapped out of a (stand-in) kokoro-onnx model, walked through the
engine's fp32 ONNX and through the engine (onnxruntime on a graph without a twin: exact; the toolkit simulator
on the round-form engine: fp16), beside the model's own decode; three WAVs, a PNG and the engine's SNR."""
from __future__ import annotations

import math
import re
import shutil

import pytest
from typer.testing import CliRunner

from rkaudio.cli import _register_all, app
from rkaudio.families.kokoro import sources

from tests.kokoro_small import FRAMES, SMALL, taps_model, voice_dir

SPOKEN_FRAMES = 80  # latent frames of the stand-in utterance: 3 windows (first, interior, last) at W=64


@pytest.fixture(scope="module")
def model_onnx(state, tmp_path_factory):
    return taps_model(tmp_path_factory.mktemp("kokoro_taps") / "kokoro-taps.onnx", state, SPOKEN_FRAMES)


def check(engine, model, voices, out, *extra):
    _register_all()
    return CliRunner().invoke(app, ["check", "kokoro", str(engine), "--model-onnx", str(model), "--voice-dir",
                                    str(voices), "--out", str(out), *extra])


def test_onnx_backend_renders_a_graph_without_twin_as_the_fp16_estimate(exported, model_onnx, tmp_path, check_report):
    """The engine ONNX alone (no fp32 twin beside it): the engine render is the graph with every tensor rounded to
    fp16, judged against the graph itself in fp32. The round-form sine needs fp16 rounding, so without its twin the
    fp32 render is far off (a finite, low SNR says so) while the engine render follows the model's own decode."""
    engine = tmp_path / "alone" / exported[0].onnx.name
    engine.parent.mkdir()
    shutil.copy(exported[0].onnx, engine)
    out = tmp_path / "kokoro.wav"
    result = check(engine, model_onnx, voice_dir(tmp_path / "voice"), out)
    assert result.exit_code == 0, result.output
    assert check_report(result.output, out) < math.inf and "the fp16 estimate" in result.output
    assert float(re.search(r"engine walk (\S+) dB", result.output).group(1)) > 20.0, result.output
    assert result.output.count(" interior ") == 1 and "spec_phase vs the model's own generator" in result.output


def test_simulator_backend_renders_the_compiled_engine(exported, model_onnx, tmp_path, check_report,
                                                       require_converter):
    """The round-form engine compiled in the simulator, judged against its exact fp32 twin."""
    require_converter("2.3.2")
    out = tmp_path / "kokoro.wav"
    result = check(exported[0].onnx, model_onnx, voice_dir(tmp_path / "voice"), out, "--backend", "simulator")
    assert result.exit_code == 0, result.output
    snr = check_report(result.output, out)
    print(f"kokoro small, simulator rk3588 vs fp32: {snr:.1f} dB")
    assert 30.0 <= snr < math.inf, result.output


def test_without_an_engine_it_exports_one_at_the_frames_asked(state, model_onnx, tmp_path, monkeypatch,
                                                               check_report):
    """No ENGINE_ONNX and no --package: the generator of --model-onnx (here the small one) is exported into
    `<out>_engine/` at --frames, in the recipe's round form; its sine relies on fp16 rounding, so --backend onnx
    renders it with every tensor rounded to fp16 (its fp16 floor), judged against its exact fp32 twin."""
    monkeypatch.setattr(sources, "load_generator", lambda *args: (SMALL, state, "random", None))
    out = tmp_path / "kokoro.wav"
    _register_all()
    result = CliRunner().invoke(app, ["check", "kokoro", "--model-onnx", str(model_onnx), "--voice-dir",
                                      str(voice_dir(tmp_path / "voice")), "--frames", str(FRAMES), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"exporting the generator at {FRAMES} frames for rk3588" in result.output
    engine = tmp_path / "kokoro_engine" / f"kokoro_generator_w{FRAMES}.onnx"
    assert engine.is_file() and engine.with_suffix(".fp32.onnx").is_file()
    engine_vs_fp32 = check_report(result.output, out)
    print(f"fp16-rounded round-form engine vs its fp32 twin: {engine_vs_fp32:.1f} dB")
    assert 25.0 < engine_vs_fp32 < math.inf

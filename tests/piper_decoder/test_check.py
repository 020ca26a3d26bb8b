"""`convert check piper`: text -> piper-tts phonemes -> windowed decoder and full voice, two WAVs, figures."""
from __future__ import annotations

from typer.testing import CliRunner

from converters.cli import _register_all, app
from runtime.audio import read_wav


def test_check_piper_renders_both_paths(joe_exports, tmp_path):
    _register_all()
    out = tmp_path / "check.wav"
    result = CliRunner().invoke(app, ["check", "piper", "--text", "Hello there. This sentence is long enough to "
                                      "need several windows of the decoder.", "--engine",
                                      str(joe_exports[False].onnx_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "interior" in result.output and "max sample-to-sample step" in result.output
    windowed, rate = read_wav(out)
    full, full_rate = read_wav(out.with_suffix(".full.wav"))
    assert rate == full_rate == 22050 and windowed.shape == full.shape and windowed.size > rate
    assert out.with_suffix(".png").is_file()

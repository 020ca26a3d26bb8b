"""`convert piper --voice-onnx` on a damaged voice: one line naming the file, exit 2, no traceback (issue #14)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rkaudio.core.paths import REPO_ROOT


def convert_piper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "piper", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)




@pytest.mark.parametrize("encoder", [False, True], ids=["decoder", "encoder"])
def test_truncated_voice_onnx(tmp_path, encoder, refused_in_one_line):
    from rkaudio.families.piper.voice import resolve_voice

    joe = resolve_voice(None)
    data = joe.onnx_path.read_bytes()
    voice = tmp_path / "truncated.onnx"
    voice.write_bytes(data[: len(data) // 2])  # an interrupted download
    voice.with_name("truncated.onnx.json").write_text(json.dumps(joe.config))
    result = convert_piper("--voice-onnx", str(voice), "--skip-rknn", "--out", str(tmp_path / "out"),
                           *(["--encoder", "--frames", "32"] if encoder else []))
    line = refused_in_one_line(result, voice)
    assert "not a readable Piper voice ONNX" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content,words", [
    (b'{"audio": {"sample_rate": 22050}, "phoneme_id_map": ', "is not valid JSON"),  # cut short
    (b"\x89PNG\r\n\x1a\n\x00\x00", "is not valid JSON"),  # not text at all
    (b"[1, 2, 3]", "JSON list, not an object"),
])
def test_voice_config_that_is_not_json(tmp_path, content, words, refused_in_one_line):
    voice = tmp_path / "voice.onnx"
    voice.write_bytes(b"never read: the config is checked first")
    config = voice.with_name("voice.onnx.json")
    config.write_bytes(content)
    line = refused_in_one_line(convert_piper("--voice-onnx", str(voice), "--skip-rknn", "--out",
                                              str(tmp_path / "out")), config)
    assert words in line

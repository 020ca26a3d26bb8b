"""A golden made from a sentence is heard where the kit runs: its WAV beside the report and, where pocketsphinx
imports, a transcript and word error rate in the report; on a board without pocketsphinx the report says "not
measured" and nothing else changes."""
from __future__ import annotations

import json
import wave

import numpy as np
from typer.testing import CliRunner

from rkaudio import cli
from rkaudio.release.kit import verify, write_sums

SENTENCE = "Hello, this is a short test."


def _speaking(package):
    """The example package whose end-to-end golden declares its first chunk's output a sentence (the example
    outputs no speech: what is judged here is the mechanism, not the voice)."""
    index_path = package / "selftest" / "index.json"
    index = json.loads(index_path.read_text())
    (entry,) = index["end_to_end"]
    output = next(name for name in entry["simulator"] if name.endswith("@0"))
    entry["params"]["speech"] = {"text": SENTENCE, "sample_rate": 16000, "output": output}
    index_path.write_text(json.dumps(index))
    write_sums(package)
    assert verify(package) == []
    return entry["name"]


def test_a_board_without_pocketsphinx_writes_the_wav_and_says_not_measured(package, run_kit):
    name = _speaking(package)
    result = run_kit(package, "--runs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    [loop] = json.loads(result.report.read_text())["end_to_end"]
    heard = loop["hearing"]
    assert heard["transcript"] is None and heard["wer"] is None and heard["text"] == SENTENCE
    assert heard["detail"].startswith("not measured: pocketsphinx is not installed")
    wav = result.report.with_name(f"{package.name}.{name}.wav")
    assert heard["wav"] == str(wav)
    with wave.open(str(wav)) as audio:
        assert audio.getframerate() == 16000 and audio.getnframes() > 0
    assert "not measured" in result.stdout and loop["passed"]


def test_a_host_with_pocketsphinx_reports_a_transcript_and_its_error_rate(package, tmp_path):
    _speaking(package)
    if not cli.app.registered_commands:
        cli._register_all()
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(cli.app, ["selftest", str(package), "--backend", "onnx", "--report", str(report_path)])
    assert result.exit_code == 0, result.output
    [loop] = json.loads(report_path.read_text())["end_to_end"]
    heard = loop["hearing"]
    assert isinstance(heard["transcript"], str) and heard["words"] == 6
    assert heard["wer"] == heard["errors"] / 6 and np.isfinite(heard["wer"])
    assert "heard" in result.output and tmp_path.joinpath(f"{package.name}.{loop['name']}.wav").is_file()

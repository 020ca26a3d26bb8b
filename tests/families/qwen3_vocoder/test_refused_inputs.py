"""Inputs the export must refuse (issue #14): a snapshot whose decoder outputs silence fails its export with the
silent-reference message (never "[PASS] ... inf dB"); a truncated model.safetensors or a config.json that is not
JSON stops in one line naming the file, exit 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rkaudio.families.qwen3_vocoder import snapshot
from rkaudio.families.qwen3_vocoder import step_export as E
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, random_codes, step_of
from rkaudio.core.errors import GateFailure, SetupError
from rkaudio.core.paths import REPO_ROOT

SILENT = "the reference output is silent: the checkpoint or the inputs make the model output zeros"


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "qwen3-vocoder", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


def silent_state(reference) -> dict:
    """The tiny random decoder with its EMA codebook sums zeroed, and its biases zeroed as the package
    initialises them (a freshly initialised checkpoint saved without its codebooks): every code embeds to 0 and
    nothing downstream adds anything, so the decoder outputs exactly 0.0. (Zeroed codebooks alone still leave the
    random biases' near-constant output, which the gates then judge as any other.)"""
    state = {key: value.clone() for key, value in reference.state_dict().items()}
    for key, value in state.items():
        if key.endswith(("embedding_sum", ".bias")):
            value.zero_()
    return state


@pytest.fixture(scope="module")
def silent_snapshot(tmp_path_factory, tiny_reference):
    return snapshot.write(tmp_path_factory.mktemp("silent_snapshot"), TINY_CONFIG, silent_state(tiny_reference))


def test_the_silent_snapshot_is_silent(tiny_reference):
    from rkaudio.families.qwen3_vocoder.reference import reference_decoder

    silent = reference_decoder(TINY_CONFIG, silent_state(tiny_reference))
    with torch.no_grad():
        assert not silent(random_codes(TINY_CONFIG, 32, seed=1)).any()


def test_silent_snapshot_fails_its_export(silent_snapshot, tmp_path):
    """The issue's command on a silent snapshot: exit 3 (a gate), the silent-reference reason, no PASS at inf dB,
    nothing written."""
    out = tmp_path / "out"
    run = convert("--model-dir", str(silent_snapshot), "--codes-length", "16", "--skip-rknn", "--out", str(out))
    assert run.returncode == 3, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and SILENT in run.stderr, run.stderr
    assert "[FAIL] stepwise_vs_full[B=16]: nan dB" in run.stderr
    assert "[PASS]" not in run.stdout + run.stderr and "inf dB" not in run.stdout + run.stderr
    assert not list(out.glob("*.onnx"))  # an empty (or absent) out directory


def test_silent_window_role_fails_before_anything_is_written(step_job, tiny_reference, tmp_path):
    """The window role has no stepwise gate: its onnx-vs-torch comparisons judge the whole (silent) output."""
    silent = step_of(tiny_reference, TINY_CONFIG)
    silent.load_state_dict(silent_state(tiny_reference))
    path = tmp_path / "window.onnx"
    with pytest.raises(GateFailure) as failure, torch.no_grad():
        E.export_step(step_job, silent, E.WINDOW_CONTEXT + 12, "window", path, say=lambda *_: None)
    names = [v.name for v in failure.value.verdicts]
    assert "onnx_vs_torch[pcm, exact sine]" in names and all(v.detail.startswith(SILENT) for v in failure.value.verdicts)
    assert "what to do: the comparison has nothing to judge" in str(failure.value)
    assert not path.exists() and not list(tmp_path.glob("*.onnx"))


def test_cache_is_judged_by_its_activations(tiny_step):
    """The validity flags (1 for every filled slot, whatever the model computes) are left out of the cache's
    judgement: a cache of zero activations is degenerate although its flags are not zero."""
    from rkaudio.board.numeric import degenerate_reference

    cache = torch.zeros(tiny_step.cache_numel)
    [flags] = [e for e in tiny_step.layout.to_json() if e["name"] == E.VALIDITY_ENTRY]
    cache[flags["offset"] : flags["offset"] + flags["shape"][0]] = 1.0
    assert degenerate_reference(cache.numpy(), E.CACHE_FULL_SCALE) is None
    assert degenerate_reference(E.cache_activations(cache.numpy(), tiny_step.layout), E.CACHE_FULL_SCALE)
    assert E.cache_activations(cache.numpy(), tiny_step.layout).size == tiny_step.cache_numel - flags["shape"][0]


def _copy_snapshot(source, directory):
    target = directory / snapshot.SUBDIR
    target.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (target / name).write_bytes((source / snapshot.SUBDIR / name).read_bytes())
    return target




@pytest.mark.parametrize("damaged", ["model.safetensors", "config.json"])
def test_cli_refuses_a_damaged_snapshot_in_one_line(tiny_snapshot, tmp_path, damaged, refused_in_one_line):
    directory = _copy_snapshot(tiny_snapshot, tmp_path / "snap")
    path = directory / damaged
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # an interrupted download
    line = refused_in_one_line(convert("--model-dir", str(tmp_path / "snap"), "--codes-length", "16",
                                        "--skip-rknn", "--out", str(tmp_path / "out")), path)
    assert ("is not a readable safetensors file" if damaged == "model.safetensors" else "is not valid JSON") in line
    assert not list((tmp_path / "out").glob("*.onnx"))


@pytest.mark.parametrize("damaged, content, words", [
    ("model.safetensors", b"<html>404 Not Found</html>", "is not a readable safetensors file"),
    ("model.safetensors", b"", "is not a readable safetensors file"),
    ("config.json", b"\x89PNG\r\n\x1a\n\x00\x00", "is not valid JSON"),
    ("config.json", b"[1, 2, 3]", "holds a JSON list, not the object"),
])
def test_damaged_snapshot_files_are_refused_naming_the_file(tiny_snapshot, tmp_path, damaged, content, words):
    directory = _copy_snapshot(tiny_snapshot, tmp_path / "snap")
    (directory / damaged).write_bytes(content)
    with pytest.raises(SetupError) as error:
        snapshot.load(tmp_path / "snap")
    message = str(error.value)
    assert words in message and str(directory / damaged) in message and "\n" not in message, message


def test_config_json_stays_readable_when_intact(tiny_snapshot):
    assert snapshot.read_decoder_config(tiny_snapshot / snapshot.SUBDIR) == json.loads(
        (tiny_snapshot / snapshot.SUBDIR / "config.json").read_text())["decoder_config"]

"""Snapshot loading errors, the two-stage CLI (export venv, then --onnx) with a tiny rk3588 engine, the recipe skip."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from converters.families.qwen3_vocoder import snapshot
from core.paths import REPO_ROOT
from core.errors import SetupError


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converters.cli", "qwen3-vocoder", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True)


def test_missing_snapshot_names_what_is_expected(tmp_path):
    with pytest.raises(SetupError, match=r"no snapshot at .*speech_tokenizer/config.json"):
        snapshot.resolve(tmp_path / "absent")


def test_wrong_directory_names_what_is_expected(tmp_path):
    (tmp_path / "some_model").mkdir()
    (tmp_path / "some_model" / "config.json").write_text("{}")
    with pytest.raises(SetupError, match=r"holds no speech_tokenizer/config.json \+ speech_tokenizer/model.safetensors"):
        snapshot.resolve(tmp_path / "some_model")


def test_config_of_another_model_is_refused(tmp_path, tiny_snapshot):
    other = tmp_path / "other" / "speech_tokenizer"
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"model_type": "mimi", "hidden_size": 512}))
    (other / "model.safetensors").write_bytes((tiny_snapshot / "speech_tokenizer" / "model.safetensors").read_bytes())
    with pytest.raises(SetupError, match=r"model_type 'mimi'; expected .*'qwen3_tts_tokenizer_12hz'"):
        snapshot.load(tmp_path / "other")


def test_repo_id_not_in_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SetupError, match="not in the local huggingface_hub cache"):
        snapshot.resolve("Qwen/Qwen3-TTS-12Hz-0.6B-Base")


def test_snapshot_round_trip(tiny_snapshot, tiny_reference):
    loaded = snapshot.load(tiny_snapshot)
    assert loaded.state_dict.keys() == tiny_reference.state_dict().keys()
    assert snapshot.load(tiny_snapshot / "speech_tokenizer").directory == loaded.directory


def test_cli_refuses_a_missing_snapshot(tmp_path):
    run = convert("--model-dir", str(tmp_path / "nowhere"), "--skip-rknn")
    assert run.returncode == 2 and "error: no snapshot at" in run.stderr


def test_two_stages_build_a_tiny_engine(tiny_snapshot, tmp_path, require_converter):
    """Export with --skip-rknn, then compile with --onnx: B, cache size, head dim, kv_len come from the graph."""
    require_converter()
    onnx_path = tmp_path / "step_64.onnx"
    exported = convert("--model-dir", str(tiny_snapshot), "--codes-length", "64", "--skip-rknn",
                       "--output", str(onnx_path))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "[PASS] stepwise_vs_full[B=64]" in exported.stdout
    built = convert("--onnx", str(onnx_path), "--target", "rk3588", "--out", str(tmp_path / "engines"))
    assert built.returncode == 0, built.stderr[-3000:]
    assert "role main, B=64, cache_numel" in built.stdout and "(from the ONNX contract)" in built.stdout
    manifest = json.loads((tmp_path / "engines" / "step_64.manifest.json").read_text())
    gates = {g["name"]: g for g in manifest["gates"]}
    assert gates["regtask_lines"]["value"] == 0
    assert gates["simulator_snr[pcm]"]["passed"] and gates["simulator_snr[pcm]"]["threshold"] == 40.0
    assert gates["simulator_snr[cache_out]"]["passed"]
    assert manifest["exec_plan"] == {"qwen3_tts.exec_plan": {"speech_decoder": {
        "impl": "rknn", "artifacts": {"main": "step_64.rknn"}}}}
    print(f"tiny B=64 engine CPU ops: {[op['type'] for op in manifest['ops']['cpu_ops']]}")
    # The end-to-end golden the export declared (a lone B=64 step: two groups, the cache carried on) is recorded.
    index = json.loads((tmp_path / "engines" / "selftest" / "index.json").read_text())
    [golden] = index["end_to_end"]
    assert golden["loop"] == "runtime.board.qwen3_vocoder:golden_loop" and golden["engines"] == ["step_64.rknn"]
    assert [call["engine"] for call in golden["calls"]] == ["step_64.rknn"] * 2
    print(f"tiny B=64 end-to-end golden: simulator {golden['simulator']['pcm']['snr_db']:.1f} dB (pcm), "
          f"kit {sum(p.stat().st_size for p in (tmp_path / 'engines' / 'selftest').iterdir()):,} bytes")


def test_recipe_is_skipped_without_a_snapshot(tmp_path, monkeypatch):
    from converters.families import qwen3_vocoder
    from core.errors import MissingSource
    from converters.release.recipes import load_recipe

    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = load_recipe(REPO_ROOT / "recipes" / "qwen3_tts_0_6b_base_speech_decoder.toml")
    with pytest.raises(MissingSource, match=r"no Qwen/Qwen3-TTS-12Hz-0.6B-Base snapshot"):
        qwen3_vocoder.build_recipe(recipe, "rk3588", "2.3.2", tmp_path / "work")

"""Snapshot loading errors, the two-stage CLI (export venv, then --onnx) with a tiny rk3588 engine, the recipe skip."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rkaudio.families.qwen3_vocoder import snapshot
from rkaudio.core.paths import REPO_ROOT
from rkaudio.core.errors import SetupError


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "qwen3-vocoder", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True)


def test_missing_snapshot_names_what_is_expected(tmp_path):
    with pytest.raises(SetupError, match=r"no Qwen/Qwen3-TTS-12Hz-0.6B-Base snapshot \(speech_tokenizer/config.json, "
                                         r"speech_tokenizer/model.safetensors\) in .*absent \(no such folder\)"):
        snapshot.resolve(tmp_path / "absent")


def test_wrong_directory_names_what_is_expected(tmp_path):
    (tmp_path / "some_model").mkdir()
    (tmp_path / "some_model" / "config.json").write_text("{}")
    with pytest.raises(SetupError, match=r"in .*some_model \(without speech_tokenizer/config.json, "
                                         r"speech_tokenizer/model.safetensors\)"):
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
    with pytest.raises(SetupError, match="or the huggingface_hub cache of Qwen/Qwen3-TTS-12Hz-0.6B-Base; .*"
                                         "`huggingface-cli download Qwen/Qwen3-TTS-12Hz-0.6B-Base`"):
        snapshot.resolve("Qwen/Qwen3-TTS-12Hz-0.6B-Base")


def test_snapshot_round_trip(tiny_snapshot, tiny_reference):
    loaded = snapshot.load(tiny_snapshot)
    assert loaded.state_dict.keys() == tiny_reference.state_dict().keys()
    assert snapshot.load(tiny_snapshot / "speech_tokenizer").directory == loaded.directory


def test_cli_refuses_a_missing_snapshot(tmp_path):
    run = convert("--model-dir", str(tmp_path / "nowhere"), "--skip-rknn")
    assert run.returncode == 2 and "error: no Qwen/Qwen3-TTS-12Hz-0.6B-Base snapshot" in run.stderr


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
    assert golden["loop"] == "rkaudio.board.qwen3_vocoder:golden_loop" and golden["engines"] == ["step_64.rknn"]
    assert [call["engine"] for call in golden["calls"]] == ["step_64.rknn"] * 2
    print(f"tiny B=64 end-to-end golden: simulator {golden['simulator']['pcm']['snr_db']:.1f} dB (pcm), "
          f"kit {sum(p.stat().st_size for p in (tmp_path / 'engines' / 'selftest').iterdir()):,} bytes")


def test_recipe_is_skipped_without_a_snapshot(tmp_path, monkeypatch):
    from rkaudio.cli.families import declaration
    from rkaudio.families.qwen3_vocoder import FAMILY
    from rkaudio.release.recipes import build_components, load_recipe, recipe_sources
    from rkaudio.core.errors import MissingSource

    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = load_recipe(REPO_ROOT / "recipes" / "qwen3_tts_0_6b_base_speech_decoder.toml", declaration)
    for build in (lambda: recipe_sources(FAMILY, recipe, "rk3588", "2.3.2"),
                  lambda: build_components(recipe, "rk3588", "2.3.2", tmp_path / "work", FAMILY)):
        with pytest.raises(MissingSource, match=r"no Qwen/Qwen3-TTS-12Hz-0.6B-Base snapshot"):
            build()


def test_recipe_engines_are_checked_when_the_recipe_loads(tmp_path):
    """`options.engines` is a list of {role, codes_length} tables: a misspelt key, an unknown role or a sine form
    that does not exist is refused at load, naming the key (the command's --role, --sine-form alike)."""
    from rkaudio.cli.families import declaration
    from rkaudio.families.qwen3_vocoder import HALO_FORMS, SINE_FORMS
    from rkaudio.families.qwen3_vocoder.cache import HALO_FORMS as CACHE_HALO_FORMS
    from rkaudio.release.recipes import load_recipe
    from rkaudio.surgery.modules.snake import SINE_FORMS as SNAKE_FORMS

    assert sorted(SINE_FORMS) == sorted(SNAKE_FORMS)
    assert HALO_FORMS == ("auto", *CACHE_HALO_FORMS)
    text = (REPO_ROOT / "recipes" / "qwen3_tts_0_6b_base_speech_decoder.toml").read_text()
    for old, new, refusal in [
        ('role = "main", codes_length = 64', 'role = "main", codes_lenght = 64',
         "options.engines.1.codes_lenght: unknown; did you mean codes_length?"),
        ('role = "main"', 'role = "mian"', "options.engines.1.role: input should be 'main', 'first' or 'window'"),
        ('[options]\n', '[options]\nsine_form = "sin"\n', "options.sine_form: input should be"),
        ('[options]\n', '[options]\nhalo_form = "rows"\n', "options.halo_form: input should be"),
    ]:
        assert old in text
        path = tmp_path / "qwen3.toml"
        path.write_text(text.replace(old, new))
        with pytest.raises(SetupError, match=re.escape(refusal)):
            load_recipe(path, declaration)
    run = convert("--role", "mian", "--model-dir", str(tmp_path), "--skip-rknn")
    assert run.returncode == 2 and "--role: input should be 'main', 'first' or 'window', got 'mian'" in run.stderr


def test_cli_needs_one_of_model_dir_or_onnx(tmp_path):
    neither = convert("--skip-rknn", "--out", str(tmp_path))
    assert neither.returncode == 2 and "give --model-dir SNAPSHOT (export) or --onnx STEP.onnx" in neither.stderr
    both = convert("--model-dir", str(tmp_path), "--onnx", str(tmp_path / "step.onnx"), "--skip-rknn")
    assert both.returncode == 2 and "--onnx compiles an earlier export" in both.stderr

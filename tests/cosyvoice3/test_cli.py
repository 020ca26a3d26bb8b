"""`convert cosyvoice3`: argument errors, the recipe skip, and one tiny rk3588 ladder built by the CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core.errors import MissingSource
from core.paths import REPO_ROOT


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "converters.cli", "cosyvoice3", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True)


def test_missing_snapshot_is_one_line_exit_2(tmp_path):
    run = convert("--model-dir", str(tmp_path / "nowhere"), "--skip-rknn", "--out", str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines() == [f"error: no snapshot at {tmp_path / 'nowhere'}: expected a "
                                               "FunAudioLLM/Fun-CosyVoice3-0.5B-2512 directory holding "
                                               "cosyvoice3.yaml and flow.pt"]


def test_source_must_be_exactly_one(tmp_path):
    run = convert("--skip-rknn", "--out", str(tmp_path))
    assert run.returncode == 2 and "exactly one of --model-dir SNAPSHOT or --random-weights" in run.stderr
    run = convert("--random-weights", "medium", "--skip-rknn", "--out", str(tmp_path))
    assert run.returncode == 2 and "one of real, small" in run.stderr


def test_recipe_skips_without_a_snapshot(tmp_path, monkeypatch):
    from converters.families import cosyvoice3
    from converters.recipes import load_recipe

    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = load_recipe(REPO_ROOT / "recipes" / "cosyvoice3_flow_0_5b.toml")
    assert recipe["options"]["lengths"] == [110, 200, 250, 400, 500]
    with pytest.raises(MissingSource) as caught:
        cosyvoice3.build_recipe(recipe, "rk3588", "2.3.2", tmp_path / "work")
    assert "\n" not in str(caught.value) and "no FunAudioLLM/Fun-CosyVoice3-0.5B-2512 snapshot" in str(caught.value)


def test_tiny_ladder_builds_for_rk3588(tmp_path, require_converter):
    """The one engine build of this suite: S=24 and S=32 rungs of the tiny model, the golden on S=24."""
    require_converter()
    out = tmp_path / "engines"
    run = convert("--random-weights", "small", "--lengths", "32,24", "--target", "rk3588", "--out", str(out),
                  "--fail-on-cpu-ops")
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert "[PASS] ode_snr" in run.stdout and "end-to-end golden: 18 frames" in run.stdout
    for length in (24, 32):
        manifest = json.loads((out / f"cosyvoice3_flow_s{length}.manifest.json").read_text())
        gates = {g["name"]: g for g in manifest["gates"]}
        assert gates["regtask_lines"]["value"] == 0 and manifest["ops"]["cpu_ops"] == []
        assert gates["simulator_snr[dphi_dt]"]["passed"] and gates["simulator_snr[dphi_dt]"]["value"] >= 40
        assert manifest["contract"]["length"] == length
    index = json.loads((out / "selftest" / "index.json").read_text())
    [golden] = index["end_to_end"]
    assert golden["loop"] == "runtime.flow_ladder:golden_loop" and len(golden["calls"]) == 20
    assert golden["simulator"]["mel"]["snr_db"] >= 40
    print(f"tiny S=24 golden: simulator {golden['simulator']['mel']['snr_db']:.1f} dB on the mel")

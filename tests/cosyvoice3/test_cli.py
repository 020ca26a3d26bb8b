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
    from converters.release.recipes import load_recipe

    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = load_recipe(REPO_ROOT / "recipes" / "cosyvoice3_flow_0_5b.toml")
    assert recipe["options"]["lengths"] == [110, 200, 250, 400, 500]
    with pytest.raises(MissingSource) as caught:
        cosyvoice3.build_recipe(recipe, "rk3588", "2.3.2", tmp_path / "work")
    assert "\n" not in str(caught.value) and "no FunAudioLLM/Fun-CosyVoice3-0.5B-2512 snapshot" in str(caught.value)


def test_tiny_ladder_builds_for_rk3588(tmp_path, require_converter):
    """The one engine build of this suite: the S=24 rung split by depth in 2 (chained through `hidden`) and
    the S=32 rung whole, of the tiny model; the golden on S=24 (both parts); aperture.json packaged."""
    require_converter()
    out = tmp_path / "engines"
    run = convert("--random-weights", "small", "--lengths", "32,24", "--parts", "24:2", "--target", "rk3588",
                  "--out", str(out), "--fail-on-cpu-ops")
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert "[PASS] ode_snr" in run.stdout and "end-to-end golden: 18 frames" in run.stdout
    stems = ["cosyvoice3_flow_s24_p1of2", "cosyvoice3_flow_s24_p2of2", "cosyvoice3_flow_s32"]
    for stem in stems:
        manifest = json.loads((out / f"{stem}.manifest.json").read_text())
        gates = {g["name"]: g for g in manifest["gates"]}
        sim = [g for name, g in gates.items() if name.startswith("simulator_snr")]
        assert gates["regtask_lines"]["value"] == 0 and manifest["ops"]["cpu_ops"] == []
        assert sim and all(g["passed"] and g["value"] >= 40 for g in sim)
        assert manifest["contract"]["length"] == (32 if stem.endswith("s32") else 24)
    index = json.loads((out / "selftest" / "index.json").read_text())
    [golden] = index["end_to_end"]
    assert golden["loop"] == "runtime.board.cosyvoice3:golden_loop" and len(golden["calls"]) == 40
    assert golden["simulator"]["mel"]["snr_db"] >= 40
    print(f"tiny S=24 golden (2 parts): simulator {golden['simulator']['mel']['snr_db']:.1f} dB on the mel")

    # aperture.json beside the engines; packaged by the contract's package_files, listed in SHA256SUMS
    aperture = json.loads((out / "aperture.json").read_text())
    assert [(row["length"], row["parts"]) for row in aperture["rungs"]] == [(24, 2), (32, 1)]
    assert not any(row["refused"] for row in aperture["rungs"])
    from converters.release import kit
    from converters.build.engine import EngineResult
    from converters.release.package import assemble

    results = [EngineResult(out / f"{stem}.rknn", out / f"{stem}.manifest.json", out / f"{stem}.build.log",
                            json.loads((out / f"{stem}.manifest.json").read_text()), []) for stem in reversed(stems)]
    package = tmp_path / "package"
    package.mkdir()
    assemble(results, package, out)
    assert "aperture.json" in (package / "SHA256SUMS").read_text() and kit.verify(package) == []
    assert json.loads((package / "exec_plan.json").read_text())["cosyvoice3.exec_plan"]["flow"] == {
        "impl": "rknn", "artifacts": {"main": ",".join(f"{stem}.rknn" for stem in stems)}}
    run = subprocess.run([sys.executable, "-m", "converters.cli", "aperture", str(package)], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "   24 " in run.stdout and "   32 " in run.stdout and "rung set(s) fit 3900 MiB" in run.stdout

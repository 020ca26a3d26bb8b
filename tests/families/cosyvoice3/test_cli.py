"""`convert cosyvoice3`: argument errors, the recipe skip, and one tiny rk3588 ladder built by the CLI."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rkaudio.core.errors import MissingSource
from rkaudio.core.paths import REPO_ROOT


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "cosyvoice3", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True)


def test_missing_snapshot_is_one_line_exit_2(tmp_path):
    run = convert("--model-dir", str(tmp_path / "nowhere"), "--skip-rknn", "--out", str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines() == [
        f"error: no FunAudioLLM/Fun-CosyVoice3-0.5B-2512 snapshot (cosyvoice3.yaml, flow.pt) in "
        f"{tmp_path / 'nowhere'} (no such folder); put it in a folder under $RKAUDIO_MODELS (a recipe's dir) or pass "
        "its folder with --model-dir"]


def test_source_must_be_exactly_one(tmp_path):
    run = convert("--skip-rknn", "--out", str(tmp_path))
    assert run.returncode == 2 and "exactly one of --model-dir SNAPSHOT or --random-weights" in run.stderr
    run = convert("--random-weights", "medium", "--skip-rknn", "--out", str(tmp_path))
    assert run.returncode == 2 and "--random-weights: input should be 'real' or 'small', got 'medium'" in run.stderr
    run = convert("--random-weights", "small", "--onnx", str(tmp_path / "s24.onnx"), "--skip-rknn")
    assert run.returncode == 2 and "--onnx compiles an earlier export" in run.stderr


@pytest.mark.parametrize("args, refusal", [
    (("--parts", "24:x"), "--parts '24:x': a count (e.g. 2) or S:N pairs (e.g. 400:2,500:2)"),
    (("--parts", "0"), "--parts '0': a count (e.g. 2) or S:N pairs"),
    (("--lengths", "32,2"), "--lengths: value error, each rung of 4 frames or more"),
    (("--lengths", "32,x"), "--lengths '32,x': expected comma-separated integers"),
    (("--batch", "3"), "--batch: input should be less than or equal to 2, got 3"),
    (("--ln-form", "fast"), "--ln-form: input should be 'plain' or 'safe', got 'fast'"),
])
def test_option_values_are_refused_in_one_line(tmp_path, args, refusal):
    run = convert("--random-weights", "small", *args, "--skip-rknn", "--out", str(tmp_path))
    assert run.returncode == 2 and refusal in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_declared_forms_and_parts():
    """The spelled-out LayerNorm forms are the engine graph's; --parts and a recipe's `parts` meet in one form."""
    from rkaudio.families.cosyvoice3 import LN_FORMS, Options, _parts_of_cli, parse_parts
    from rkaudio.families.cosyvoice3.engine_graph import LN_FORMS as GRAPH_FORMS

    assert LN_FORMS == GRAPH_FORMS
    assert _parts_of_cli("2") == 2 and _parts_of_cli("400:2, 500:3") == {"400": 2, "500": 3}
    assert parse_parts({"400": 2}) == {400: 2} and parse_parts(2) == 2
    options = Options.model_validate({"lengths": [500, 110, 110], "parts": {"500": 2}}, strict=True)
    assert options.lengths == [110, 500] and options.parts == {"500": 2}


def test_recipe_skips_without_a_snapshot(tmp_path, monkeypatch):
    from rkaudio.cli.families import declaration
    from rkaudio.families.cosyvoice3 import FAMILY
    from rkaudio.release.recipes import build_components, load_recipe, recipe_sources, recipes_for

    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = load_recipe(REPO_ROOT / "recipes" / "cosyvoice3_flow_0_5b.toml", declaration)
    # the spec's rungs; rk3566's rounded up to a multiple of 8 (its attention form stays on the NPU only there)
    assert [recipes_for(recipe, target)[0]["options"]["lengths"] for target in ("rk3588", "rk3576", "rk3566")] == \
        [[110, 200, 250, 400, 500]] * 2 + [[112, 200, 256, 400, 504]]
    for build in (lambda: recipe_sources(FAMILY, recipe, "rk3588", "2.3.2"),
                  lambda: build_components(recipe, "rk3588", "2.3.2", tmp_path / "work", FAMILY)):
        with pytest.raises(MissingSource) as caught:
            build()
        assert "\n" not in str(caught.value) and "no FunAudioLLM/Fun-CosyVoice3-0.5B-2512 snapshot" in str(caught.value)


@pytest.mark.parametrize("parts, refusal", [
    ('parts = { "900" = 4 }', None),
    ("parts = 2", None),
    ('parts = { "900" = 0 }', "options.parts: value error, a count of at least 1, or a table"),
    ('parts = { "big" = 2 }', "options.parts: value error, a count of at least 1, or a table"),
    ('parts = "2"', "options.parts"),
    ('ln_form = "fast"', "options.ln_form: input should be 'plain' or 'safe'"),
])
def test_recipe_parts_is_a_count_or_a_table(tmp_path, parts, refusal):
    from rkaudio.cli.families import declaration
    from rkaudio.release.recipes import load_recipe
    from rkaudio.core.errors import SetupError

    text = (REPO_ROOT / "recipes" / "cosyvoice3_flow_0_5b.toml").read_text()
    path = tmp_path / "cosyvoice3.toml"
    path.write_text(text.replace('ln_form = "plain"', 'ln_form = "plain"\n' + parts if "parts" in parts else parts))
    if refusal is None:
        assert load_recipe(path, declaration)["options"]["parts"] in (2, {"900": 4})
    else:
        with pytest.raises(SetupError, match=re.escape(refusal)):
            load_recipe(path, declaration)


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
    assert golden["loop"] == "rkaudio.board.cosyvoice3:golden_loop" and len(golden["calls"]) == 40
    assert golden["simulator"]["mel"]["snr_db"] >= 40
    print(f"tiny S=24 golden (2 parts): simulator {golden['simulator']['mel']['snr_db']:.1f} dB on the mel")

    # aperture.json beside the engines; packaged by the contract's package_files, listed in SHA256SUMS
    aperture = json.loads((out / "aperture.json").read_text())
    assert [(row["length"], row["parts"]) for row in aperture["rungs"]] == [(24, 2), (32, 1)]
    assert not any(row["refused"] for row in aperture["rungs"])
    from rkaudio.release import kit
    from rkaudio.engine.build import EngineResult
    from rkaudio.release.package import assemble

    results = [EngineResult(out / f"{stem}.rknn", out / f"{stem}.manifest.json", out / f"{stem}.build.log",
                            json.loads((out / f"{stem}.manifest.json").read_text()), []) for stem in reversed(stems)]
    package = tmp_path / "package"
    package.mkdir()
    assemble(results, package, out)
    assert "aperture.json" in (package / "SHA256SUMS").read_text() and kit.verify(package) == []
    assert json.loads((package / "exec_plan.json").read_text())["cosyvoice3.exec_plan"]["flow"] == {
        "impl": "rknn", "artifacts": {"main": ",".join(f"{stem}.rknn" for stem in stems)}}
    run = subprocess.run([sys.executable, "-m", "rkaudio.cli", "aperture", str(package)], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "   24 " in run.stdout and "   32 " in run.stdout and "rung set(s) fit 3900 MiB" in run.stdout


def test_tiny_ladder_builds_for_rk3566_with_no_cpu_op(tmp_path, require_converter):
    """rk3566: every rung and part in the exp-ratio attention form (export.ATTENTION), the split rung chained
    through a channel-first `hidden`, built with max_cpu_ops 0: no REGTASK line, no CPU op, the simulator over the
    gate and within the fp16 floor's margin, the logit-bound verdicts in each manifest."""
    require_converter()
    out = tmp_path / "engines"
    run = convert("--random-weights", "small", "--lengths", "32,24", "--parts", "24:2", "--target", "rk3566",
                  "--out", str(out), "--max-cpu-ops", "0")
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    for stem, rung in (("cosyvoice3_flow_s24_p1of2", "S=24 part 1"), ("cosyvoice3_flow_s24_p2of2", "S=24 part 2"),
                       ("cosyvoice3_flow_s32", "S=32")):
        manifest = json.loads((out / f"{stem}.manifest.json").read_text())
        gates = {g["name"]: g for g in manifest["gates"]}
        assert manifest["regtask"]["lines"] == 0 and gates["regtask_lines"]["value"] == 0
        assert manifest["ops"]["cpu_ops"] == [] and gates["cpu_compute_ops"]["threshold"] == 0
        sim = [g for name, g in gates.items() if name.startswith(("simulator_snr", "fp16_floor_gap"))]
        assert len(sim) == 2 and all(g["passed"] for g in sim)
        for name in (f"attention_logit_max[{rung}]", f"attention_row_max_floor[{rung}]"):
            assert gates[name]["passed"], gates[name]
        # per second of generated mel: each engine takes 20 calls (10 ODE steps x 2 CFG calls) per S/50 s
        real_time, length = gates["real_time_factor"], manifest["contract"]["length"]
        assert real_time["passed"] and real_time["threshold"] == 1.0 and "unfitted" in real_time["detail"]
        assert real_time["value"] == pytest.approx(manifest["predicted_board_ms"]["ms"] / 1000 / (length / 50 / 20),
                                                   rel=1e-3)
    hidden = json.loads((out / "cosyvoice3_flow_s24_p1of2.manifest.json").read_text())["contract"]["io"]["outputs"]
    assert hidden == [{"name": "hidden", "shape": [1, 64, 24]}]


def test_a_rung_with_cpu_ops_slower_than_its_real_time_factor_is_refused(tmp_path, require_converter):
    """--max-real-time-factor: a tiny rk3566 rung at S=18 (not a multiple of 8: its attention keeps CPU ops there;
    0.36 s of mel per ODE of 20 calls) gated far below what it predicts is refused, naming its figure, the real time
    it was judged by and its CPU ops; no engine is left."""
    require_converter()
    out = tmp_path / "engines"
    run = convert("--random-weights", "small", "--lengths", "18", "--target", "rk3566", "--out", str(out),
                  "--max-real-time-factor", "0.001")
    assert run.returncode == 3, (run.stdout[-3000:], run.stderr[-3000:])
    assert "[FAIL] real_time_factor:" in run.stderr
    assert "per call of 0.018 s of generated mel (18 frames at 50 Hz over 20 calls: 10 ODE steps, B=1)" in run.stderr
    assert "board-time constants are unfitted" in run.stderr and " CPU ops" in run.stderr
    assert not list(out.glob("*.rknn"))

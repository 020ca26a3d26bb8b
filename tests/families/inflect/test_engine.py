"""The recipes: skipped with a clear line without the official files; with them (here the random-init
Micro and Nano exports), rk3588 engines with 0 REGTASK lines, 0 CPU ops and simulator SNR >= 35 dB."""
from __future__ import annotations

import pytest

from rkaudio.cli.families import declaration
from rkaudio.families.inflect import FAMILY
from rkaudio.release.recipes import build_components, load_recipe, recipe_sources, recipes_for
from rkaudio.core.errors import MissingSource, SetupError
from rkaudio.core.paths import REPO_ROOT

RECIPES = {"micro": "inflect_micro_v2_decoder", "nano": "inflect_nano_v2_decoder"}


def test_recipe_without_the_official_files_is_skipped_with_a_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path))
    recipe = load_recipe(REPO_ROOT / "recipes" / f"{RECIPES['micro']}.toml", declaration)
    for build in (lambda: recipe_sources(FAMILY, recipe, "rk3588", "2.3.2"),
                  lambda: build_components(recipe, "rk3588", "2.3.2", tmp_path / "work", FAMILY)):
        with pytest.raises(MissingSource, match=r"onnx/decode.onnx, onnx/duration.onnx, config.json.*"
                                                r"Inflect-Micro-v2-ONNX \(no such folder\) or the "
                                                r"huggingface_hub cache"):
            build()


def test_recipe_gates_are_the_family_own_and_the_shared_ones(tmp_path):
    """min_tail_db / min_interior_db are [gates] keys beside the shared ones; a misspelt one is refused at load."""
    recipe = load_recipe(REPO_ROOT / "recipes" / f"{RECIPES['nano']}.toml", declaration)
    [part] = recipes_for(recipe, "rk3588")
    assert part["gates"] == {"min_tail_db": 90.0, "min_interior_db": 120.0, "min_simulator_snr_db": 35.0,
                             "max_regtask_lines": 0, "fail_on_cpu_ops": True}
    text = (REPO_ROOT / "recipes" / f"{RECIPES['nano']}.toml").read_text()
    path = tmp_path / "nano.toml"
    path.write_text(text.replace("min_tail_db = 90.0", "min_tail_dB = 90.0"))
    with pytest.raises(SetupError, match=r"gates.min_tail_dB: unknown; did you mean min_tail_db\?"):
        load_recipe(path, declaration)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["micro", "nano"])
def test_rk3588_engine_from_the_recipe(size, request, require_converter, tmp_path):
    require_converter("2.3.2")
    cfg, paths = request.getfixturevalue(f"{size}_official")
    recipe = load_recipe(REPO_ROOT / "recipes" / f"{RECIPES[size]}.toml", declaration)
    recipe["source"] = {"dir": str(paths["config"].parent)}
    [result] = build_components(recipe, "rk3588", "2.3.2", tmp_path, FAMILY)
    manifest = result.manifest_data
    print(f"{cfg.name}: {manifest['rknn']['bytes']} bytes, weights {manifest['weight_bytes']}, "
          f"{manifest['est_cycles']} cycles, " + "; ".join(v.line() for v in result.verdicts))
    assert manifest["regtask"]["lines"] == 0
    assert manifest["ops"]["cpu"] == 0 and manifest["ops"]["cpu_ops"] == []
    assert min(v.value for v in result.verdicts if v.name.startswith("simulator_snr")) >= 35.0
    assert all(v.passed for v in result.verdicts)
    assert [i["name"] for i in manifest["inputs"]] == ["z", "y_mask"]
    assert manifest["contract"]["stride_phase_levels"] == recipes_for(recipe, "rk3588")[0]["options"][
        "stride_phase_levels"] > 0  # the recipe's leading levels in stride-phase form
    assert manifest["exec_plan"] == {"inflect_v2.exec_plan": {"decoder": {"impl": "rknn",
                                     "artifacts": {"main": result.rknn.name}}}}

"""The kokoro declaration: `convert kokoro` and the recipe adapter are one export (`export_generator`) that differs
only where the old command and build_recipe did (the command reads the huggingface_hub cache and adds the kokoro
reference gate; a recipe does neither), the window is refused in check_frames' words before any weight is loaded,
and a recipe names only declared keys."""
from __future__ import annotations

from pathlib import Path

import pytest

from rkaudio.families import kokoro
from rkaudio.families.kokoro import FAMILY
from rkaudio.core.errors import MissingSource, SetupError

RECIPE = {"package": "kokoro_test", "path": "recipes/kokoro_test.toml", "family": "kokoro", "source": {},
          "options": {"frames": 96, "sin_reduce": False, "snake_fold": False}, "gates": {}}


@pytest.fixture
def calls(monkeypatch):
    """load_generator's and export's arguments, with both replaced (no weights, no graph)."""
    from rkaudio.families.kokoro import export, sources

    seen = {}

    def load_generator(checkpoint, model_onnx, work_dir, use_cache=True):
        seen["load"] = {"checkpoint": checkpoint, "model_onnx": model_onnx, "use_cache": use_cache}
        return "config", "state", "label", None

    def fake_export(job, config, state, source, form, taps_model, reference_gate=False):
        seen["export"] = {"frames": job.options.frames, "form": form, "snake_fold": job.options.snake_fold,
                          "reference_gate": reference_gate, "layout": job.options.fine_layout, "target": job.target}
        return []

    monkeypatch.setattr(sources, "load_generator", load_generator)
    monkeypatch.setattr(export, "export", fake_export)
    return seen


def test_the_command_reads_the_cache_and_adds_the_reference_gate(calls, tmp_path, family_cli):
    result = family_cli(FAMILY, "--frames", "64", "--no-sin-reduce", "--model-onnx", str(tmp_path / "m.onnx"), "--skip-rknn",
                    "--out", str(tmp_path))
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert calls["load"] == {"checkpoint": None, "model_onnx": tmp_path / "m.onnx", "use_cache": True}
    assert calls["export"] == {"frames": 64, "form": "clip", "snake_fold": True, "reference_gate": True,
                               "layout": "auto", "target": "rk3588"}


def test_a_recipe_reads_neither_the_cache_nor_runs_the_reference_gate(calls, tmp_path, monkeypatch):
    from rkaudio.pipeline import pipeline
    from rkaudio.release.recipes import build_part

    handed = {}
    monkeypatch.setattr(pipeline, "build", lambda exported, out_dir, options, **kw: handed.update(kw) or [])
    recipe = dict(RECIPE, source={"checkpoint": str(tmp_path / "Kokoro-82M")})
    build_part(FAMILY, recipe, "rk3576", "2.3.2", tmp_path / "work")
    assert calls["load"] == {"checkpoint": tmp_path / "Kokoro-82M", "model_onnx": None, "use_cache": False}
    assert calls["export"] == {"frames": 96, "form": "clip", "snake_fold": False, "reference_gate": False,
                               "layout": "auto", "target": "rk3576"}
    assert handed["context"] == "kokoro_test"


def test_the_command_and_the_recipe_gates_default_alike():
    gates = FAMILY.gates_model(FAMILY.component(None))()
    assert (gates.max_regtask_lines, gates.fail_on_cpu_ops, gates.min_simulator_snr_db) == (0, True, 35.0)


@pytest.mark.parametrize("args, message", [
    (("--frames", "137", "--fine-layout", "plain"), "must stay under 8192"),
    (("--frames", "40"), "needs at least 57"),
    (("--fine-layout", "columns"), "--fine-layout: input should be 'plain', 'rows' or 'auto'"),
])
def test_a_bad_window_is_refused_before_any_weight_is_loaded(calls, tmp_path, args, message, family_cli):
    result = family_cli(FAMILY, *args, "--skip-rknn", "--out", str(tmp_path))
    assert isinstance(result.exception, SetupError) and message in str(result.exception), result.output
    assert "load" not in calls


def test_a_recipe_names_only_declared_keys():
    from rkaudio.pipeline.schema import check_family_tables

    recipe = {"source": {"checkpont": "/x"}, "options": {"frame": 128, "fine_layout": "rows"},
              "gates": {"max_regtask_line": 3}, "components": {}, "targets": ["rk3588"]}
    with pytest.raises(SetupError) as refused:
        check_family_tables(recipe, FAMILY, "recipes/k.toml")
    assert str(refused.value).splitlines() == [
        "recipes/k.toml: source.checkpont: unknown; did you mean checkpoint?",
        "recipes/k.toml: options.frame: unknown; did you mean frames?",
        "recipes/k.toml: gates.max_regtask_line: unknown; did you mean max_regtask_lines?"]


def test_the_shipped_recipe_loads():
    from rkaudio.release.recipes import load_recipe

    recipe = load_recipe(Path("recipes/kokoro_82m_generator.toml"), lambda name: FAMILY)
    assert recipe["options"]["frames"] == 136


def test_recipe_sources_name_what_is_missing(tmp_path):
    from rkaudio.pipeline.schema import recipe_job

    job = recipe_job(FAMILY, dict(RECIPE, source={"model_onnx": str(tmp_path / "absent.onnx")}), "rk3588",
                     tmp_path, "2.3.2")
    with pytest.raises(MissingSource, match=r"absent\.onnx \(source\.model_onnx in recipes/kokoro_test\.toml\)"):
        kokoro.source_files(job)


def test_a_checkpoint_is_its_folder_or_its_pth_file_else_the_hub_cache(tmp_path, monkeypatch):
    """`--checkpoint` / `source.checkpoint` names the folder or the .pth in it (config.json beside it); without
    one the huggingface_hub cache is looked in, never the network (rkaudio.pipeline.checkpoint)."""
    from huggingface_hub import constants

    from rkaudio.families.kokoro.sources import find_checkpoint

    folder = tmp_path / "Kokoro-82M"
    folder.mkdir()
    for name in ("config.json", "kokoro-v1_0.pth", "renamed.pth"):
        (folder / name).write_text("x")
    assert find_checkpoint(folder) == (folder / "kokoro-v1_0.pth", folder / "config.json")
    assert find_checkpoint(folder / "renamed.pth") == (folder / "renamed.pth", folder / "config.json")
    (folder / "config.json").unlink()
    with pytest.raises(SetupError, match=rf"no hexgrad/Kokoro-82M checkpoint \(renamed.pth, config.json\) in {folder} "
                                         r"\(without config.json\); .* pass its folder with --checkpoint$"):
        find_checkpoint(folder / "renamed.pth")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SetupError, match=r"in the huggingface_hub cache of hexgrad/Kokoro-82M; .* `huggingface-cli "
                                         r"download hexgrad/Kokoro-82M`"):
        find_checkpoint(None)
    from rkaudio.pipeline.schema import recipe_job

    job = recipe_job(FAMILY, dict(RECIPE, source={"checkpoint": str(tmp_path / "absent")}), "rk3588", tmp_path,
                     "2.3.2")
    with pytest.raises(MissingSource, match="no hexgrad/Kokoro-82M checkpoint"):  # a recipe's: its skip
        kokoro.source_files(job)

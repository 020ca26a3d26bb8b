"""Incremental `convert engines`: a package whose key (recipe, checkpoint files, code, toolkit, target) matches
the one in dist is "up to date" and not rebuilt; touching one recipe rebuilds that package only; --force and a
damaged package rebuild."""
from __future__ import annotations

import json
import shutil

from rkaudio.release import recipes
from rkaudio.cli.families import declaration
from rkaudio.core.paths import REPO_ROOT


def _build(recipes_dir, dist, **options):
    lines = []
    rows = recipes.build_all("rk3588", declaration, "2.3.2", recipes_dir, dist, say=lines.append, **options)
    return {r["package"]: r["status"] for r in rows}, lines


def test_nothing_changed_is_up_to_date_and_one_touched_recipe_rebuilds_alone(tmp_path, require_converter):
    require_converter("2.3.2")
    recipes_dir, dist = tmp_path / "recipes", tmp_path / "dist"
    recipes_dir.mkdir()
    shutil.copy(REPO_ROOT / "recipes" / "example_conv.toml", recipes_dir)
    text = (recipes_dir / "example_conv.toml").read_text()
    (recipes_dir / "example_b.toml").write_text(text.replace('package = "example_conv"', 'package = "example_b"')
                                                .replace("frames = [64, 128]", "frames = [32]"))
    assert _build(recipes_dir, dist)[0] == {"example_b_rk3588": "ok", "example_conv_rk3588": "ok"}
    key = json.loads((dist / "rk3588" / "example_b_rk3588" / "build-key.json").read_text())
    assert set(key) == {"key", "recipe", "target", "toolkit", "sources", "code_sha256"}

    statuses, lines = _build(recipes_dir, dist)
    assert statuses == {"example_b_rk3588": "up to date", "example_conv_rk3588": "up to date"}
    assert not any("export example" in line for line in lines)

    (recipes_dir / "example_b.toml").write_text((recipes_dir / "example_b.toml").read_text()
                                                .replace("min_simulator_snr_db = 55.0", "min_simulator_snr_db = 50.0"))
    assert _build(recipes_dir, dist)[0] == {"example_b_rk3588": "ok", "example_conv_rk3588": "up to date"}
    assert _build(recipes_dir, dist, force=True)[0] == {"example_b_rk3588": "ok", "example_conv_rk3588": "ok"}

    (dist / "rk3588" / "example_conv_rk3588" / "exec_plan.json").write_text("{}")  # damaged: rebuilt
    assert _build(recipes_dir, dist)[0] == {"example_b_rk3588": "up to date", "example_conv_rk3588": "ok"}


def test_the_key_follows_the_checkpoint_and_the_code(tmp_path):
    recipe = {"package": "p", "family": "example", "targets": ["rk3588"], "source": {}, "options": {}, "gates": {},
              "components": {}, "path": "p.toml", "per_target": {"options": [], "gates": []}}
    checkpoint = tmp_path / "weights.bin"
    checkpoint.write_bytes(b"one")
    first = recipes.package_key(recipe, "rk3588", "2.3.2", [checkpoint])
    checkpoint.write_bytes(b"two")
    assert recipes.package_key(recipe, "rk3588", "2.3.2", [checkpoint])["key"] != first["key"]
    assert recipes.package_key(recipe, "rk3588", "2.3.2", None) is None  # a family that cannot name its sources


def test_the_key_hashes_every_room_but_the_other_families():
    files = recipes.code_files("example")
    package = REPO_ROOT / "rkaudio"
    assert package / "families" / "example.py" in files and package / "__init__.py" in files
    for room in ("board", "core", "gates", "toolkit", "host", "surgery", "engine", "pipeline", "release", "cli"):
        assert set((package / room).rglob("*.py")) <= set(files), room  # every module of every shared room counts
    assert package / "families" / "__init__.py" in files
    # another family's change rebuilds nothing here (the board runtimes, named after families, are shared code)
    assert not [p for p in files if (package / "families" / "piper") in p.parents]

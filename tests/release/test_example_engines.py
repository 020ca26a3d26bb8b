"""`convert engines` end to end with the built-in example family: real exports and real rk3588 builds
through build_engine, the packaged dist layout, and a real gate failure that publishes nothing."""
import json
import shutil

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from rkaudio import cli
from rkaudio.release import recipes
from rkaudio.cli.families import declaration
from rkaudio.core.paths import REPO_ROOT
from rkaudio.core.errors import SetupError
from rkaudio.core.contract import get_contract


def test_example_recipe_builds_a_gated_ladder_package_and_a_failing_gate_publishes_nothing(tmp_path, require_converter):
    require_converter("2.3.2")
    recipes_dir, dist = tmp_path / "recipes", tmp_path / "dist"
    recipes_dir.mkdir()
    shutil.copy(REPO_ROOT / "recipes" / "example_conv.toml", recipes_dir)
    shipped = recipes.load_recipe(recipes_dir / "example_conv.toml", declaration)
    # The same graph under a simulator bar no fp16 engine can reach: the gate must fail it.
    strict = (recipes_dir / "example_conv.toml").read_text().replace('package = "example_conv"', 'package = "example_strict"')
    strict = strict.replace("frames = [64, 128]", "frames = [32]").replace("min_simulator_snr_db = 55.0", "min_simulator_snr_db = 200.0")
    (recipes_dir / "example_strict.toml").write_text(strict)

    lines = []
    rows = recipes.build_all("rk3588", declaration, "2.3.2", recipes_dir, dist, say=lines.append)

    assert [(r["package"], r["status"]) for r in rows] == [("example_conv_rk3588", "ok"), ("example_strict_rk3588", "FAILED")]
    assert not (dist / "rk3588" / "example_strict_rk3588").exists()
    assert any("simulator_snr" in line and "FAIL" in line for line in lines)

    package = dist / "rk3588" / "example_conv_rk3588"
    frames = shipped["options"]["frames"]
    stems = [f"example_c{shipped['options']['channels']}_t{t}" for t in frames]
    # the self-test kit (rkaudio/board/), the card, and the build key (the example names its sources: none)
    kit = ["SHA256SUMS", "selftest.py", "selftest", "rkaudio", "README.md", "build-key.json"]
    assert sorted(p.name for p in package.iterdir()) == sorted(
        [f"{s}{ext}" for s in stems for ext in (".rknn", ".manifest.json", ".build.log")] + ["exec_plan.json"] + kit)
    plan = json.loads((package / "exec_plan.json").read_text())
    assert plan == {"example.exec_plan": {"conv": {"impl": "rknn", "artifacts": {
        "main": ",".join(f"{s}.rknn" for s in stems)}}}}
    gate_count = 0
    for stem in stems:
        manifest = json.loads((package / f"{stem}.manifest.json").read_text())
        assert manifest["target"] == "rk3588" and manifest["toolkit_version"] == "2.3.2"
        assert manifest["rknn"]["bytes"] == (package / f"{stem}.rknn").stat().st_size
        assert manifest["regtask"]["lines"] <= shipped["gates"]["max_regtask_lines"]
        simulator = [g for g in manifest["gates"] if g["name"].startswith("simulator_snr")]
        assert simulator and all(float(g["value"]) >= shipped["gates"]["min_simulator_snr_db"] for g in simulator)
        assert all(g["passed"] for g in manifest["gates"])
        gate_count += len(manifest["gates"])
    assert rows[0]["gates"] == f"{gate_count}/{gate_count}"


def test_convert_example_skip_rknn_writes_the_fixed_shape_export_with_its_contract_only(tmp_path):
    if not cli.app.registered_commands:
        cli._register_all()
    result = CliRunner().invoke(cli.app, ["example", "--frames", "48", "--channels", "8", "--skip-rknn",
                                          "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    onnx_path = tmp_path / "example_c8_t48.onnx"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "example_c8_t48.onnx", "example_c8_t48.selfcheck.npz", "example_ladder.e2e.json", "example_ladder.e2e.npz"]
    contract = get_contract(onnx_path)
    assert (contract["family"], contract["component"], contract["role"], contract["ladder_key"]) == (
        "example", "conv", "main", 48)
    dims = [d.dim_value for d in onnx.load(str(onnx_path)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 8, 48]
    with np.load(tmp_path / "example_c8_t48.selfcheck.npz") as feeds:
        assert feeds["x"].shape == (1, 8, 48)
    (tmp_path / "example_c8_t48.selfcheck.npz").unlink()
    result = CliRunner().invoke(cli.app, ["example", "--onnx", str(onnx_path), "--out", str(tmp_path)])
    assert isinstance(result.exception, SetupError) and "no self-check" in str(result.exception)

"""Recipe machinery with fake families: a missing source is one skip line, a failing gate or a family bug
fails that recipe only (exit code 3) and never leaves its package dir, the others still build."""
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from converters import kit, recipes
from converters.pipeline import Exported
from converters.commands import engines, recipe_builder
from converters.engine import BuildOptions, EngineResult
from core.errors import GateFailure, MissingSource, SetupError
from gates.verdict import at_least


def _write_recipe(directory: Path, package: str, family: str, targets=("rk3588",), extra: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    listed = ", ".join(f'"{t}"' for t in targets)
    (directory / f"{package}.toml").write_text(f'package = "{package}"\nfamily = "{family}"\ntargets = [{listed}]\n{extra}')


def _fake_engine(work_dir: Path, stem: str, snr: float) -> EngineResult:
    """An engine as build_engine leaves it: .rknn, manifest and log in the work dir."""
    rknn, manifest, log = work_dir / f"{stem}.rknn", work_dir / f"{stem}.manifest.json", work_dir / f"{stem}.build.log"
    rknn.write_bytes(b"\0" * 100)
    log.write_text("build log\n")
    verdict = at_least("simulator_snr[y]", snr, 35.0, "dB")
    data = {"contract": {"family": "fake", "component": "decoder", "role": "main",
                         "exec_plan_option": "fake.exec_plan"},
            "gates": [verdict.to_json()], "rknn": {"bytes": 100, "path": f"{stem}.rknn"}, "ops": {"cpu": 0},
            "regtask": {"lines": 0}, "toolkit_version": "2.3.2",
            "inputs": [], "outputs": [], "simulator": {}, "onnx": {"path": f"{stem}.onnx"}}
    manifest.write_text(json.dumps(data))
    result = EngineResult(rknn, manifest, log, data, [verdict])
    # What pipeline.build leaves beside the engines: the self-test goldens (none to record for a fake graph).
    selfcheck = work_dir / f"{stem}.selfcheck.npz"
    np.savez(selfcheck)
    kit.write_goldens(work_dir, [Exported(work_dir / f"{stem}.onnx", selfcheck)], [result], [], 35.0)
    return result


def _family(monkeypatch, name: str, build_recipe) -> None:
    module = types.ModuleType(f"converters.families.{name}")
    module.build_recipe = build_recipe
    monkeypatch.setitem(sys.modules, module.__name__, module)


def _ok(recipe, target, toolkit, work_dir):
    return [_fake_engine(work_dir, f"{recipe['package']}_{target}_engine", 60.0)]


def _missing(recipe, target, toolkit, work_dir):
    raise MissingSource(f"checkpoint {recipe['source']['path']} not found; download the voice there")


def _failing_gate(recipe, target, toolkit, work_dir):
    (work_dir / "model.onnx").write_text("exported before the gate failed")
    raise GateFailure([at_least("simulator_snr[y]", 12.0, 35.0, "dB")], advice="look for fp16 overflow")


def _buggy(recipe, target, toolkit, work_dir):
    raise ZeroDivisionError("a family bug")


@pytest.fixture
def fake_families(monkeypatch):
    for name, build in (("fake_ok", _ok), ("fake_missing", _missing), ("fake_gate", _failing_gate),
                        ("fake_buggy", _buggy)):
        _family(monkeypatch, name, build)


def test_recipe_validation_names_the_file_and_the_problem(tmp_path):
    _write_recipe(tmp_path, "good", "example", extra="[gates]\nmin_simulator_snr_db = 50.0\n")
    recipe = recipes.load_recipe(tmp_path / "good.toml")
    assert recipe["source"] == {} and recipe["options"] == {} and recipe["gates"] == {"min_simulator_snr_db": 50.0}
    (tmp_path / "no_family.toml").write_text('package = "x"\ntargets = ["rk3588"]\n')
    with pytest.raises(SetupError, match=r"no_family.toml needs `family`"):
        recipes.load_recipe(tmp_path / "no_family.toml")
    _write_recipe(tmp_path, "rv", "example", targets=("rv1106",))
    with pytest.raises(SetupError, match="rv1106"):
        recipes.load_recipe(tmp_path / "rv.toml")
    (tmp_path / "broken.toml").write_text("package = \n")
    with pytest.raises(SetupError, match="not valid TOML"):
        recipes.load_recipe(tmp_path / "broken.toml")


def test_gates_table_reaches_build_options():
    recipe = {"gates": {"min_simulator_snr_db": 55.0, "max_regtask_lines": 0, "min_export_snr_db": 90.0}}
    options = BuildOptions.from_recipe(recipe, "rk3576", "2.5.0")
    assert (options.target, options.toolkit, options.min_simulator_snr_db, options.max_regtask_lines) == (
        "rk3576", "2.5.0", 55.0, 0)


def test_missing_source_is_one_skip_line_and_no_package(tmp_path, fake_families):
    _write_recipe(tmp_path / "r", "voice", "fake_missing", extra='[source]\npath = "/nowhere/voice.pt"\n')
    lines = []
    rows = recipes.build_all("rk3588", recipe_builder, recipes_dir=tmp_path / "r", dist_dir=tmp_path / "dist", say=lines.append)
    assert [r["status"] for r in rows] == ["missing source"]
    skips = [line for line in lines if line.startswith("skip")]
    assert skips == ["skip voice_rk3588: checkpoint /nowhere/voice.pt not found; download the voice there"]
    assert [p.name for p in (tmp_path / "dist" / "rk3588").iterdir()] == [recipes.LOCK_NAME]


def test_failures_leave_no_package_dir_and_the_other_recipes_still_build(tmp_path, fake_families):
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "a_gate", "fake_gate")
    _write_recipe(recipes_dir, "b_bug", "fake_buggy")
    _write_recipe(recipes_dir, "c_ok", "fake_ok", targets=("rk3566", "rk3588"))
    _write_recipe(recipes_dir, "d_other_target", "fake_ok", targets=("rk3576",))
    lines = []
    rows = recipes.build_all("rk3588", recipe_builder, recipes_dir=recipes_dir, dist_dir=dist, say=lines.append)
    assert [(r["package"], r["status"]) for r in rows] == [
        ("a_gate_rk3588", "FAILED"), ("b_bug_rk3588", "FAILED"), ("c_ok_rk3588", "ok")]
    assert rows[0]["gates"] == "0/1" and rows[0]["worst_snr_db"] == 12.0
    assert rows[2]["gates"] == "1/1" and rows[2]["engine_bytes"] == 100
    text = "\n".join(lines)
    assert "look for fp16 overflow" in text and "ZeroDivisionError: a family bug" in text
    published = sorted(p.name for p in (dist / "rk3588").iterdir() if p.name != recipes.LOCK_NAME)
    # Failed recipes keep their work dir (ONNX, logs) beside, never under the package name.
    assert published == ["a_gate_rk3588.failed", "b_bug_rk3588.failed", "c_ok_rk3588"]
    assert (dist / "rk3588" / "a_gate_rk3588.failed" / "model.onnx").is_file()
    package = dist / "rk3588" / "c_ok_rk3588"
    assert sorted(p.name for p in package.iterdir()) == [
        "README.md", "SHA256SUMS", "c_ok_rk3588_engine.build.log", "c_ok_rk3588_engine.manifest.json",
        "c_ok_rk3588_engine.rknn", "core", "exec_plan.json", "gates", "runtime", "selftest", "selftest.py"]
    assert json.loads((package / "exec_plan.json").read_text()) == {
        "fake.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": "c_ok_rk3588_engine.rknn"}}}}


def test_only_selects_packages_and_rejects_unknown_names(tmp_path, fake_families):
    recipes_dir = tmp_path / "r"
    _write_recipe(recipes_dir, "one", "fake_ok")
    _write_recipe(recipes_dir, "two", "fake_ok")
    rows = recipes.build_all("rk3588", recipe_builder, recipes_dir=recipes_dir, dist_dir=tmp_path / "dist", only=["two"],
                             say=lambda line: None)
    assert [r["package"] for r in rows] == ["two_rk3588"]
    with pytest.raises(SetupError, match="three"):
        recipes.build_all("rk3588", recipe_builder, recipes_dir=recipes_dir, dist_dir=tmp_path / "dist", only=["three"])


def test_unknown_family_fails_before_anything_is_built(tmp_path, fake_families):
    recipes_dir = tmp_path / "r"
    _write_recipe(recipes_dir, "a_ok", "fake_ok")
    _write_recipe(recipes_dir, "b_typo", "no_such_family_here")
    with pytest.raises(SetupError, match="no family 'no_such_family_here'"):
        recipes.build_all("rk3588", recipe_builder, recipes_dir=recipes_dir, dist_dir=tmp_path / "dist", say=lambda line: None)
    assert not (tmp_path / "dist" / "rk3588" / "a_ok_rk3588").exists()


def test_engines_command_prints_the_summary_and_exits_3_on_a_failed_recipe(tmp_path, fake_families):
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, like `convert`: the command is chosen by name
    app.command("engines")(engines)
    recipes_dir = tmp_path / "r"
    _write_recipe(recipes_dir, "good", "fake_ok")
    _write_recipe(recipes_dir, "missing", "fake_missing", extra='[source]\npath = "/nowhere/x.pt"\n')
    args = ["engines", "--target", "rk3588", "--recipes", str(recipes_dir), "--dist", str(tmp_path / "dist")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "good_rk3588" in result.output and "missing source" in result.output
    _write_recipe(recipes_dir, "gate", "fake_gate")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3
    summary = result.output.splitlines()[-5:]
    assert summary[0].split()[:2] == ["package", "status"]
    assert [line.split()[:2] for line in summary[2:]] == [
        ["gate_rk3588", "FAILED"], ["good_rk3588", "ok"], ["missing_rk3588", "missing"]]
    listing = CliRunner().invoke(app, ["engines", "--target", "rk3576", "--list", "--recipes", str(recipes_dir)])
    assert listing.exit_code == 0 and "fake_missing" in listing.output and "False" in listing.output


def test_a_write_failure_while_packaging_publishes_nothing_and_names_the_file(tmp_path, fake_families, monkeypatch):
    import errno
    import shutil as real_shutil

    from converters import package as package_module

    def copy2(source, target, *args, **kwargs):
        if str(target).endswith(".rknn"):
            raise OSError(errno.EFBIG, "File too large")  # what a file-size limit (RLIMIT_FSIZE) gives
        return real_shutil.copy2(source, target, *args, **kwargs)

    monkeypatch.setattr(package_module.shutil, "copy2", copy2)
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "c_ok", "fake_ok")
    lines = []
    rows = recipes.build_all("rk3588", recipe_builder, recipes_dir=recipes_dir, dist_dir=dist, say=lines.append)
    assert [r["status"] for r in rows] == ["FAILED"]
    failure = next(line for line in lines if line.startswith("FAIL"))
    assert "could not write" in failure and "c_ok_rk3588_engine.rknn" in failure and "File too large" in failure
    assert sorted(p.name for p in (dist / "rk3588").iterdir()) == [recipes.LOCK_NAME, "c_ok_rk3588.failed"]


def test_files_a_contract_names_reach_the_package_when_the_onnx_is_kept_beside_dist(tmp_path, monkeypatch):
    def with_plan(recipe, target, toolkit, work_dir):
        (work_dir / "plan.json").write_text("{}")
        result = _fake_engine(work_dir, "planned", 60.0)
        result.manifest_data["contract"]["package_files"] = ["plan.json"]
        return [result]

    _family(monkeypatch, "fake_files", with_plan)
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "p", "fake_files")
    rows = recipes.build_all("rk3588", recipe_builder, recipes_dir=recipes_dir, dist_dir=dist, say=lambda _: None)
    assert [r["status"] for r in rows] == ["ok"]
    package = dist / "rk3588" / "p_rk3588"
    assert (package / "plan.json").is_file()
    manifest = json.loads((package / "planned.manifest.json").read_text())
    assert (package / manifest["onnx"]["path"]).parent.resolve() == (tmp_path / "work" / "dist" / "rk3588" / "p_rk3588")

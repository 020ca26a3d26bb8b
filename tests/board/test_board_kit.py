"""The board self-test kit as a board runs it: `python3 selftest.py` in a venv with numpy alone, against a test
double of rknnlite that replays the stored outputs. A clean run passes with the full report; each fault the
kit exists to catch (a runtime older than the toolkit, REGTASK-like damage, zeros, a changed file) fails it with
the documented exit code."""
from __future__ import annotations

import ast
import json

import pytest

from rkaudio.core.paths import REPO_ROOT


def test_the_kit_passes_on_a_faithful_board_with_numpy_alone(package, run_kit, board_python):
    import subprocess

    for module in ("torch", "onnx", "onnxruntime", "rkaudio"):
        probe = subprocess.run([str(board_python), "-E", "-s", "-c", f"import {module}"], capture_output=True,
                               cwd="/", env={"PATH": "/usr/bin:/bin"})
        assert probe.returncode != 0, f"{module} is importable on the stand-in board"

    result = run_kit(package, "--runs", "3", "--core-masks", "0,1,2,0_1_2")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.report.read_text())
    assert report["exit_code"] == 0 and report["passed"] and report["backend"] == "rknnlite"
    assert report["files_checked"] == len((package / "SHA256SUMS").read_text().splitlines())
    assert {e["engine"] for e in report["engines"]} == {p.name for p in package.glob("*.rknn")}
    for engine in report["engines"]:
        assert engine["latency_ms"]["median"] is not None
        for output in engine["outputs"]:
            assert output["snr_db_vs_simulator"] == "inf"  # the double replays the simulator outputs
            assert output["passed"] and output["threshold_db"] >= 55.0  # the recipe's floor
        masks = engine["core_masks"]
        assert masks["ran"] == ["0", "1", "2", "0_1_2"] and len(masks["pairwise"]) == 6  # no device tree: all run
    [loop] = report["end_to_end"]
    assert loop["calls"] == loop["recorded_calls"] == 2
    assert loop["calls_with_host_inputs"] == 2  # the packaged loop fed exactly what the host's did
    assert loop["passed"]
    # The repository never reached the board's sys.path; the report is outside the package.
    assert result.loads and all(str(REPO_ROOT) not in line for line in result.loads)
    assert "every gate passed" in result.stdout
    assert not (package / "selftest-report.json").exists()
    assert not list(package.rglob("__pycache__"))


def test_the_kit_feeds_each_input_in_the_dtype_its_manifest_says_the_engine_is_fed(package, run_kit):
    """An engine whose contract feeds an input in fp16 (`feed_dtypes`, so its manifest lists it as float16) gets
    it from the kit in float16, through the same backend the runtime loops use; its other inputs and the other
    engines' stay float32."""
    from rkaudio.release.kit import write_sums

    first, *others = sorted(package.glob("*.manifest.json"))
    manifest = json.loads(first.read_text())
    name = manifest["inputs"][0]["name"]
    manifest["inputs"][0]["dtype"] = "float16"
    manifest["contract"]["feed_dtypes"] = {name: "float16"}
    first.write_text(json.dumps(manifest, indent=2) + "\n")
    write_sums(package)
    result = run_kit(package, "--runs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    fed = [line.split()[1:] for line in result.loads if line.startswith("feed ")]
    engine = first.name.replace(".manifest.json", ".rknn")
    assert fed and all(dtypes.split(",")[0] == ("float16" if name == engine else "float32") for name, dtypes in fed)
    assert {name for name, _ in fed} == {engine, *(m.name.replace(".manifest.json", ".rknn") for m in others)}


def test_a_runtime_that_refuses_the_engines_is_a_setup_problem_naming_the_versions(package, run_kit):
    result = run_kit(package, mode="refuse_init")
    assert result.returncode == 2, result.stdout
    assert "rknn-toolkit2 2.3.2" in result.stdout and "the board runtime refused it" in result.stdout
    assert "librknnrt.so" in result.stdout  # the fix
    assert json.loads(result.report.read_text())["exit_code"] == 2


def test_a_runtime_older_than_the_toolkit_is_refused_before_any_engine_runs(package, run_kit):
    result = run_kit(package, runtime_version="2.1.0")
    assert result.returncode == 2, result.stdout
    assert "2.3.2" in result.stdout and "2.1.0" in result.stdout
    assert not result.loads


def test_regtask_like_damage_to_one_output_fails_that_engine(package, run_kit):
    damaged = "example_c16_t128.rknn"
    result = run_kit(package, mode=f"regtask:{damaged}")
    assert result.returncode == 3, result.stdout
    report = json.loads(result.report.read_text())
    verdicts = {e["engine"]: e["passed"] for e in report["engines"]}
    assert verdicts == {damaged: False, "example_c16_t64.rknn": True}
    assert "FAIL" in result.stdout and damaged in result.stdout


def test_an_engine_returning_zeros_fails(package, run_kit):
    result = run_kit(package, mode="zeros")
    assert result.returncode == 3, result.stdout
    report = json.loads(result.report.read_text())
    assert not any(e["passed"] for e in report["engines"]) and not report["end_to_end"][0]["passed"]


def test_one_flipped_byte_in_an_engine_stops_the_kit_before_any_run(package, run_kit):
    engine = package / "example_c16_t64.rknn"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    result = run_kit(package)
    assert result.returncode == 2, result.stdout
    assert "changed: example_c16_t64.rknn" in result.stdout
    assert not result.loads
    assert "engines" not in json.loads(result.report.read_text())


def test_every_module_the_kit_ships_parses_as_python_3_8(package):
    shipped = [package / "selftest.py", *package.glob("*/**/*.py")]
    assert len(shipped) > 5
    for path in shipped:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


def test_shipped_modules_are_unchanged_copies(package):
    from rkaudio.release.kit import KIT_SCRIPT, kit_files

    shipped = kit_files()
    assert KIT_SCRIPT in shipped.values() and "rkaudio/board/golden.py" in shipped.values()
    for source, name in shipped.items():
        assert (package / name).read_bytes() == source.read_bytes(), name
    # the kit is the folder and nothing else: no core/ or gates/ beside it
    in_package = {str(p.relative_to(package)) for p in package.rglob("*.py") if "selftest" not in p.parts[:1]}
    assert in_package == set(shipped.values()), in_package ^ set(shipped.values())


@pytest.mark.parametrize("masks, cores, ran, skipped", [
    (["0", "1", "2", "0_1_2"], 3, ["0", "1", "2", "0_1_2"], []),
    (["0", "1", "2", "0_1_2"], 2, ["0", "1"], ["2", "0_1_2"]),
    (["0", "1", "2", "0_1_2"], 1, ["0"], ["1", "2", "0_1_2"]),
])
def test_core_masks_the_soc_lacks_are_skipped(masks, cores, ran, skipped):
    from rkaudio.board.rknnlite import masks_for, soc_name

    assert masks_for(masks, cores) == (ran, skipped)
    assert soc_name("rockchip,rk3588-evb\x00rockchip,rk3588\x00") == "rk3588"
    assert soc_name("radxa,rock-4d\x00rockchip,rk3576\x00") == "rk3576"


def _loops() -> list[str]:
    """Every end-to-end loop the families can declare: `golden_loop` of a board runtime module."""
    found = []
    for path in sorted((REPO_ROOT / "rkaudio" / "board").glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "golden_loop" for node in tree.body):
            found.append(f"rkaudio.board.{path.stem}:golden_loop")
    return found


def test_every_loop_a_family_can_ship_imports_on_the_board_with_numpy_alone(board_python, tmp_path):
    import subprocess

    from rkaudio.release.kit import kit_files, write_file

    loops = _loops()
    assert "rkaudio.board.ladder:golden_loop" in loops and len(loops) >= 2
    for source, name in kit_files().items():  # laid out as in a package
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, source)
        ast.parse(source.read_text(), filename=str(source), feature_version=(3, 8))
    probe = "; ".join(f"import {loop.partition(':')[0]}" for loop in loops) + "; import selftest"
    result = subprocess.run([str(board_python), "-E", "-s", "-c", probe], cwd=tmp_path, capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


def test_a_board_without_rknnlite_is_a_setup_problem(package, board_python, tmp_path):
    import subprocess

    bare = tmp_path / "bare"
    site = next((board_python.parent.parent / "lib").glob("python*/site-packages"))
    hidden = site / "rknnlite"
    hidden.rename(tmp_path / "rknnlite-away")
    try:
        bare.mkdir()
        result = subprocess.run([str(board_python), "-E", "-s", str(package / "selftest.py"), "--runs", "1"],
                                cwd=bare, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    finally:
        (tmp_path / "rknnlite-away").rename(hidden)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "rknn-toolkit-lite2 is not importable" in result.stdout and "Traceback" not in result.stderr

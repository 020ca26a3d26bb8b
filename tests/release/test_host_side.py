"""The host side of the kit: the package layout and budget, `convert verify` naming what is wrong, the host
replay (`convert selftest --backend simulator|onnx`), and the report's model (rkaudio/release/report_model.py)."""
from __future__ import annotations

import importlib
import json

import pytest
from typer.testing import CliRunner

from rkaudio import cli
from rkaudio.core.manifest_model import Manifest, schema_problems
from rkaudio.release.kit import kit_budget, verify
from rkaudio.release.report_model import SelftestReport


def convert(*args: str):
    if not cli.app.registered_commands:  # discovery runs once per process (main() does it at start)
        cli._register_all()
    return CliRunner().invoke(cli.app, list(args))


def test_the_package_carries_goldens_sums_and_the_kit_within_budget(package):
    from rkaudio.release.kit import kit_size, tree_bytes

    index = json.loads((package / "selftest" / "index.json").read_text())
    assert {e["engine"] for e in index["engines"]} == {p.name for p in package.glob("*.rknn")}
    roles = {a["role"] for e in index["engines"] for a in e["arrays"]}
    assert roles == {"input", "fp32", "simulator"}
    simulator_arrays = [a for e in index["engines"] for a in e["arrays"] if a["role"] == "simulator"]
    assert all(a["stored_dtype"] == "float16" for a in simulator_arrays)  # fp16 engine outputs: exact in fp16
    [loop] = index["end_to_end"]
    assert len(loop["calls"]) == 2 and all(c["inputs"][0]["sha256"] for c in loop["calls"])
    listed = [line.split("  ", 1)[1] for line in (package / "SHA256SUMS").read_text().splitlines()]
    assert "selftest.py" in listed and "rkaudio/board/golden.py" in listed and "selftest/golden.npz" in listed
    assert not any(name.startswith(("core/", "gates/", "rkaudio/board/selftest.py")) for name in listed)  # the folder only
    assert kit_size(package) <= kit_budget(tree_bytes(package))
    assert verify(package) == []
    for manifest in package.glob("*.manifest.json"):  # as the build wrote them, the ONNX path rewritten
        assert schema_problems(Manifest, json.loads(manifest.read_text())) == [], manifest.name


def test_kit_budget():
    assert kit_budget(100_000) == 1_000_000
    assert kit_budget(100_000_000) == 5_000_000
    assert kit_budget(2_000_000_000) == 20_000_000


def test_verify_names_a_truncated_engine(package):
    engine = package / "example_c16_t64.rknn"
    engine.write_bytes(engine.read_bytes()[:-100])
    result = convert("verify", str(package))
    assert result.exit_code == 3
    assert "changed: example_c16_t64.rknn" in result.output
    assert "example_c16_t64.rknn: " in result.output and "do not match its manifest" in result.output


def test_verify_names_a_missing_manifest(package):
    (package / "example_c16_t128.manifest.json").unlink()
    result = convert("verify", str(package))
    assert result.exit_code == 3
    assert "missing: example_c16_t128.manifest.json" in result.output
    assert "no manifest for example_c16_t128.rknn" in result.output


def test_verify_names_an_extra_file(package):
    (package / "notes.txt").write_text("left behind")
    result = convert("verify", str(package))
    assert result.exit_code == 3
    assert "extra (not in SHA256SUMS): notes.txt" in result.output


def test_host_replay_in_the_simulator_reproduces_the_stored_outputs(package, tmp_path, require_converter):
    require_converter("2.3.2")
    report_path = tmp_path / "report.json"
    result = convert("selftest", str(package), "--backend", "simulator", "--runs", "1", "--report", str(report_path))
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["backend"] == "simulator"
    for engine in report["engines"]:
        for output in engine["outputs"]:
            assert output["bit_exact_vs_simulator"], output  # same toolkit, same graph, same inputs
    assert report["end_to_end"][0]["calls_with_host_inputs"] == 2
    assert verify(package) == []  # the replay wrote nothing into the package


def test_host_replay_finds_the_onnx_elsewhere_with_onnx_dir(package, tmp_path):
    moved = tmp_path / "moved-onnx"
    manifest = json.loads((package / "example_c16_t64.manifest.json").read_text())
    kept = (package / manifest["onnx"]["path"]).resolve().parent
    moved.mkdir()
    for path in kept.glob("*.onnx"):
        (moved / path.name).write_bytes(path.read_bytes())
    report_path = tmp_path / "report.json"
    result = convert("selftest", str(package), "--backend", "onnx", "--onnx-dir", str(moved), "--report", str(report_path))
    assert result.exit_code == 0, result.output
    result = convert("selftest", str(package), "--backend", "onnx", "--onnx-dir", str(tmp_path / "nowhere"),
                     "--report", str(report_path))
    assert result.exit_code == 2 and "no ONNX for" in result.output


def test_a_board_report_follows_the_report_model(package, run_kit):
    result = run_kit(package, "--runs", "2", "--core-masks", "0,1")
    assert result.returncode == 0, result.stdout
    report = json.loads(result.report.read_text())
    assert schema_problems(SelftestReport, report) == []
    # The model must catch a wrong report, naming each wrong field.
    broken = dict(report, exit_code=1)
    broken["engines"] = [dict(report["engines"][0], passed="yes")]
    assert [problem.split(":")[0] for problem in schema_problems(SelftestReport, broken)] == [
        "engines.0.passed", "exit_code"]


@pytest.mark.parametrize("mode", ["refuse_init"])
def test_a_setup_failure_report_follows_the_report_model(package, run_kit, mode):
    result = run_kit(package, mode=mode)
    assert result.returncode == 2
    assert schema_problems(SelftestReport, json.loads(result.report.read_text())) == []


# The names older packages give their loop, and the folder their kit ships: before rkaudio/ (runtime/board/), and
# before the board folder (the loop's own runtime module).
OLD_LAYOUTS = {"runtime.board.ladder:golden_loop": "runtime", "runtime.ladder:golden_loop": "runtime"}


@pytest.mark.parametrize("old_loop", sorted(OLD_LAYOUTS))
def test_a_package_of_an_older_layout_still_replays(package, tmp_path, old_loop):
    """Packages published before today's layout name their loops by the old modules and ship their kit in another
    folder; the host replay finds each loop where it moved, and verify reads the package as it was published."""
    from rkaudio.release.kit import write_sums
    from rkaudio.board.golden import MOVED_LOOP_MODULES, load_loop

    for old, new in MOVED_LOOP_MODULES.items():
        assert importlib.import_module(new).__name__ == new and old.startswith("runtime.")
    assert load_loop("runtime.vits_decoder:golden_loop") is load_loop("rkaudio.board.piper:golden_loop")
    assert load_loop("runtime.board.piper:golden_loop") is load_loop("rkaudio.board.piper:golden_loop")
    index_path = package / "selftest" / "index.json"
    index = json.loads(index_path.read_text())
    assert {entry["loop"] for entry in index["end_to_end"]} == {"rkaudio.board.ladder:golden_loop"}
    for entry in index["end_to_end"]:
        entry["loop"] = old_loop
    index_path.write_text(json.dumps(index))
    (package / "rkaudio").rename(package / OLD_LAYOUTS[old_loop])
    write_sums(package)
    assert verify(package) == []
    result = convert("selftest", str(package), "--backend", "onnx", "--report", str(tmp_path / "report.json"))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert [e["loop"] for e in report["end_to_end"]] == [old_loop] and report["passed"]

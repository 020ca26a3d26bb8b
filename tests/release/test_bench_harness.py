"""The bench harness runs a named benchmark's main(), prints its rows as a table and writes the JSON."""
import importlib.util
import json

import pytest

from rkaudio.core.paths import REPO_ROOT

_spec = importlib.util.spec_from_file_location("bench_run", REPO_ROOT / "bench" / "run.py")
bench_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_run)


def test_harness_prints_the_rows_and_writes_them_to_results(tmp_path, capsys):
    (tmp_path / "tiny.py").write_text(
        "def main():\n    return [{'frames': 64, 'build_s': 1.5, 'snr_db': float('inf')}, {'frames': 128, 'build_s': 2.25}]\n")
    out = bench_run.run("tiny", bench_dir=tmp_path, results_dir=tmp_path / "results")
    assert out == tmp_path / "results" / "tiny.json"
    data = json.loads(out.read_text())
    assert data["name"] == "tiny" and data["rows"] == [
        {"frames": 64, "build_s": 1.5, "snr_db": "inf"}, {"frames": 128, "build_s": 2.25}]
    assert {"measured_at", "host", "producer"} <= set(data)
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["frames", "build_s", "snr_db"] and table[3].split() == ["128", "2.25", "-"]


def test_unknown_benchmark_names_the_available_ones(tmp_path):
    (tmp_path / "tiny.py").write_text("def main():\n    return []\n")
    with pytest.raises(SystemExit, match="available: tiny"):
        bench_run.run("nope", bench_dir=tmp_path, results_dir=tmp_path)


def test_a_benchmark_that_returns_no_rows_is_refused(tmp_path):
    (tmp_path / "silent.py").write_text("def main():\n    print('my own table')\n")
    with pytest.raises(SystemExit, match="must return a list of row dicts"):
        bench_run.run("silent", bench_dir=tmp_path, results_dir=tmp_path)
    assert not (tmp_path / "silent.json").exists()

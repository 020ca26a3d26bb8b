"""The figures the package reads from a bench are package data that names the command regenerating it:
rkaudio/release/build_peaks.json (bench/targets.py: each cell's largest compiler peak RSS, which `convert engines`
budgets by) and rkaudio/gates/board_time_constants.json (bench/board_time.py)."""
import importlib.util
import json

import pytest

from rkaudio.core.paths import PACKAGE_ROOT, REPO_ROOT
from rkaudio.gates.board_time import CONSTANTS_FILE, load_constants
from rkaudio.release import scheduler

_spec = importlib.util.spec_from_file_location("bench_targets", REPO_ROOT / "bench" / "targets.py")
bench_targets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_targets)


@pytest.mark.parametrize("path, bench", [(scheduler.MEASURED_PEAKS, "targets"), (CONSTANTS_FILE, "board_time")])
def test_each_figure_file_is_package_data_naming_the_command_that_regenerates_it(path, bench):
    assert PACKAGE_ROOT in path.parents
    assert json.loads(path.read_text())["regenerate"].startswith(f"make bench NAME={bench}")


def test_the_readers_take_their_figures_past_the_regenerate_key():
    assert set(load_constants()) == {"rk3588", "rk3576", "rk3566"}
    peak, where = scheduler.measured_peak_rss("audio8_asr_0_1b", "rk3588")
    assert peak > 0 and str(scheduler.MEASURED_PEAKS) in where


def test_the_committed_build_peaks_are_the_committed_targets_tables():
    rows = json.loads((REPO_ROOT / "bench" / "results" / "targets.json").read_text())["rows"]
    assert json.loads(scheduler.MEASURED_PEAKS.read_text())["peaks"] == bench_targets.build_peaks(rows)


def test_a_cells_peak_is_its_largest_row_measured_and_when(tmp_path, monkeypatch):
    rows = [{"package": "p", "target": "rk3588", "peak_rss_bytes": 2 << 30, "measured_at": "day 1"},
            {"package": "p", "target": "rk3588", "peak_rss_bytes": 5 << 30, "measured_at": "day 2"},
            {"package": "p", "target": "rk3588", "peak_rss_bytes": 5 << 30, "measured_at": "day 3"},
            {"package": "p", "target": "rk3566", "peak_rss_bytes": None, "measured_at": None},  # not built
            {"package": "q", "target": "rk3588", "peak_rss_bytes": 1 << 30, "measured_at": "day 4"}]
    peaks = bench_targets.build_peaks(rows)
    assert peaks == [{"package": "p", "target": "rk3588", "peak_rss_bytes": 5 << 30, "measured_at": "day 2"},
                     {"package": "q", "target": "rk3588", "peak_rss_bytes": 1 << 30, "measured_at": "day 4"}]
    table = tmp_path / "build_peaks.json"
    table.write_text(json.dumps({"regenerate": bench_targets.REGENERATE, "peaks": peaks}))
    monkeypatch.setattr(scheduler, "MEASURED_PEAKS", table)
    assert scheduler.measured_peak_rss("p", "rk3588") == (5 << 30, f"the measured table {table} (day 2)")
    assert scheduler.measured_peak_rss("p", "rk3566") is None

"""The board-time model's terms (rkaudio/gates/board_time.py) against a hand computation on a small real layer table, and
the prediction `convert inspect` makes for an engine built before the model (from its manifest and build log)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkaudio.gates.board_time import CallFigures, Constants, load_constants, predict, predict_from_log
from rkaudio.gates.layer_table import parse_layer_table

DATA = Path(__file__).parent / "data"
# Conv -> Floor (CPU) -> Add on [1,8,64], rk3588, toolkit 2.5.0: rows 0 InputOperator .. 6 OutputOperator
RK3588_FLOOR = DATA / "rk3588_conv_floor_t64_2.5.0.log"
IO = {"inputs": [{"name": "x", "shape": [1, 8, 64], "dtype": "float32"}],
      "outputs": [{"name": "y", "shape": [1, 8, 64], "dtype": "float32"}]}
CONSTANTS = {"ms_per_cycle": 1e-6, "ms_per_elementwise_mb": 0.5, "ms_per_cpu_mb": 2.0, "ms_per_layer": 0.006,
             "ms_per_io_tensor": 1.5, "ms_per_io_mb": 4.0}


def test_terms_match_a_hand_computation_on_a_small_table():
    figures = CallFigures.from_table(parse_layer_table(RK3588_FLOOR.read_text()), IO["inputs"], IO["outputs"])
    # Read off the table by eye: one Conv costs 192 cycles; the 0-cycle NPU rows between the I/O operators are
    # Reshape 1 KB, Add 2 KB, Reshape 1 KB; Floor (1 KB) is on the CPU; five layers; x and y are 512 float32 each.
    assert figures == CallFigures(cycles=192, elementwise_bytes=4 * 1024, cpu_bytes=1024, layers=5, io_tensors=2,
                                  io_bytes=4096)
    prediction = predict(figures, "rk3588", {"rk3588": {"constants": CONSTANTS, "basis": "test"}})
    mb = 1024 * 1024
    hand = {"compute": 192e-6, "elementwise": 4 * 1024 / mb * 0.5, "cpu_ops": 1024 / mb * 2.0, "dispatch": 5 * 0.006,
            "call_io": 2 * 1.5 + 4096 / mb * 4.0}
    assert prediction["terms"] == pytest.approx({k: round(v, 3) for k, v in hand.items()}, abs=1e-9)
    assert prediction["ms"] == pytest.approx(sum(hand.values()), abs=1e-3)
    assert prediction["figures"] == figures.to_json() and prediction["basis"] == "test"


def test_io_bytes_count_each_input_as_fed_and_each_output_as_returned():
    """An input fed in float16 (the manifest's dtype, `rkaudio.core.contract.fed_inputs`) counts 2 bytes an item; outputs
    count float32 whatever the ONNX says, as rknnlite returns them."""
    table = parse_layer_table(RK3588_FLOOR.read_text())
    fed16 = CallFigures.from_table(table, [{**IO["inputs"][0], "dtype": "float16"}], IO["outputs"])
    assert fed16.io_bytes == 512 * 2 + 512 * 4
    returned16 = CallFigures.from_table(table, IO["inputs"], [{**IO["outputs"][0], "dtype": "float16"}])
    assert returned16.io_bytes == 4096


def test_a_contracts_feed_dtypes_name_what_the_manifest_says_is_fed():
    from rkaudio.board.contract import EngineContract
    from rkaudio.core.contract import fed_inputs

    entries = [{"name": "x", "shape": [2], "dtype": "float32"}, {"name": "k", "shape": [2], "dtype": "float32"}]
    assert [e["dtype"] for e in fed_inputs(entries, EngineContract(feed_dtypes={"k": "float16"}))] == \
        ["float32", "float16"]
    assert fed_inputs(entries, EngineContract()) == entries


def test_every_term_moves_with_its_own_constant_only():
    figures = CallFigures(cycles=10**6, elementwise_bytes=2 * 1024 * 1024, cpu_bytes=3 * 1024 * 1024, layers=100,
                          io_tensors=3, io_bytes=1024 * 1024)
    base = Constants(**CONSTANTS).terms(figures)
    for name, term in (("ms_per_cycle", "compute"), ("ms_per_elementwise_mb", "elementwise"),
                       ("ms_per_cpu_mb", "cpu_ops"), ("ms_per_layer", "dispatch"), ("ms_per_io_tensor", "call_io"), ("ms_per_io_mb", "call_io")):
        doubled = Constants(**{**CONSTANTS, name: 2 * CONSTANTS[name]}).terms(figures)
        assert {k for k in base if doubled[k] != base[k]} == {term}, name


def test_an_unknown_soc_has_no_prediction_and_the_shipped_constants_cover_every_target():
    assert predict(CallFigures(1, 1, 1, 1, 1, 1), "rk3562", {"rk3588": {"constants": CONSTANTS, "basis": "x"}}) is None
    socs = load_constants()
    assert {"rk3588", "rk3576", "rk3566"} <= set(socs)
    for soc, entry in socs.items():
        assert entry["basis"] and all(value >= 0 for value in Constants.from_json(entry["constants"]).__dict__.values())
    assert "unfitted" in socs["rk3566"]["basis"]


def test_inspect_predicts_for_an_engine_built_before_the_model(tmp_path):
    from typer.testing import CliRunner

    from rkaudio.cli import _register_all, app

    _register_all()

    manifest = {"target": "rk3588", **IO, "rknn": {"path": "old.rknn", "bytes": 1}, "onnx": {"bytes": 1},
                "toolkit_version": "2.5.0", "weight_bytes": 0, "internal_bytes": 0, "est_cycles": 192, "rw_kb": 7,
                "build_log": "old.build.log"}
    (tmp_path / "old.manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "old.build.log").write_text(RK3588_FLOOR.read_text())
    expected = predict_from_log(manifest, RK3588_FLOOR.read_text())
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "old.manifest.json")])
    assert result.exit_code == 0, result.output
    assert f"predicted board time: {expected['ms']:,.1f} ms per call" in result.output
    assert "convert inspect, from the build log" in result.output
    (tmp_path / "old.build.log").unlink()  # no table to read: said, not invented
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "old.manifest.json")])
    assert "predicted board time: none" in result.output

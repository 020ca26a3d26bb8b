"""`ladder = "dynamic"` end to end on the built-in example (rk3588, toolkit 2.3.2): one engine for both rungs,
gated per shape set against what the static engines of the same rungs measure, packaged with its exec_plan role
named once, replayed by the kit in the simulator; and the refusals (a shape outside the list, a file in two roles
without shape sets, a log whose graphs do not match the sets)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rkaudio.cli.families import declaration
from rkaudio.release import recipes
from rkaudio.core.paths import REPO_ROOT

STEMS = {"static": ["example_c16_t64", "example_c16_t128"], "dynamic": ["example_c16_ladder"]}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The example recipe built static and dynamic: {ladder: package dir}."""
    from rkaudio.core.errors import SetupError
    from rkaudio.toolkit.versions import converter_python

    try:
        converter_python("2.3.2")
    except SetupError as error:
        pytest.fail(str(error))
    root = tmp_path_factory.mktemp("ladders")
    recipes_dir, dist = root / "recipes", root / "dist"
    recipes_dir.mkdir()
    shipped = (REPO_ROOT / "recipes" / "example_conv.toml").read_text()
    (recipes_dir / "example_conv.toml").write_text(shipped)
    dynamic = shipped.replace('package = "example_conv"', 'package = "example_dyn"')
    (recipes_dir / "example_dyn.toml").write_text(
        dynamic.replace("frames = [64, 128]", 'frames = [64, 128]\nladder = "dynamic"'))
    rows = recipes.build_all("rk3588", declaration, "2.3.2", recipes_dir, dist, say=lambda line: None)
    assert [(r["package"], r["status"]) for r in rows] == [("example_conv_rk3588", "ok"), ("example_dyn_rk3588", "ok")]
    return {"static": dist / "rk3588" / "example_conv_rk3588", "dynamic": dist / "rk3588" / "example_dyn_rk3588"}


def _manifest(package, stem):
    return json.loads((package / f"{stem}.manifest.json").read_text())


def test_one_engine_holds_both_rungs_with_per_set_figures_close_to_the_static_engines(packages):
    dynamic = _manifest(packages["dynamic"], STEMS["dynamic"][0])
    statics = [_manifest(packages["static"], stem) for stem in STEMS["static"]]
    sets = dynamic["shape_sets"]
    assert [entry["contract"]["frames"] for entry in sets] == [64, 128]
    assert [entry["inputs"][0]["shape"] for entry in sets] == [[1, 16, 64], [1, 16, 128]]
    assert dynamic["rknn"]["bytes"] < sum(m["rknn"]["bytes"] for m in statics)
    for number, (entry, static) in enumerate(zip(sets, statics)):
        # the compiler prints one layer table per set: cycles per set within 2% of the static engine's
        assert abs(entry["est_cycles"] - static["est_cycles"]) <= 0.02 * static["est_cycles"]
        assert entry["regtask"]["lines"] == 0 and entry["ops"]["cpu"] == 0
        figures, fixed = dynamic["simulator"][f"y@{number}"], static["simulator"]["y"]
        for key in ("snr_db", "fp16_floor_gap_db"):
            assert abs(figures[key] - fixed[key]) <= 0.5, (number, key, figures[key], fixed[key])
    names = {gate["name"] for gate in dynamic["gates"]}
    assert {"regtask_lines@0", "regtask_lines@1", "simulator_snr[y@0]", "simulator_snr[y@1]",
            "shape_generic_exact"} <= names
    assert all(gate["passed"] for gate in dynamic["gates"])


def test_the_package_names_the_engine_once_and_its_kit_replays_every_set(packages, tmp_path):
    from rkaudio.release.kit import HostOpener
    from rkaudio.board.selftest import SelfTest

    package = packages["dynamic"]
    plan = json.loads((package / "exec_plan.json").read_text())
    assert plan == {"example.exec_plan": {"conv": {"impl": "rknn", "artifacts": {"main": "example_c16_ladder.rknn"}}}}
    assert b'"shape_sets"' in (package / "example_c16_ladder.rknn").read_bytes()  # custom_string: a board can ask
    index = json.loads((package / "selftest" / "index.json").read_text())
    assert [(e["engine"], e.get("shape_set")) for e in index["engines"]] == [
        ("example_c16_ladder.rknn", 0), ("example_c16_ladder.rknn", 1)]
    assert index["end_to_end"][0]["engines"] == ["example_c16_ladder.rknn"]
    with HostOpener(package, "simulator") as opener:  # closes the simulator children it kept between phases
        report = SelfTest(package, opener, runs=1, core_masks=[], say=lambda line: None,
                          report_path=tmp_path / "report.json").run()
    assert report["passed"], json.dumps(report, default=str)[:2000]
    assert [row.get("shape_set") for row in report["engines"]] == [0, 1]
    assert report["end_to_end"][0]["calls"] == 2


def test_a_shape_outside_the_engine_list_is_refused_by_name(packages):
    from rkaudio.release.kit import HostOpener
    from rkaudio.board.contract import EngineContract
    from rkaudio.board.golden import EnginePool
    from rkaudio.board.shapes import ShapeRefused
    from rkaudio.host.backends import SimulatorBackend

    onnx_path = HostOpener(packages["dynamic"], "simulator").onnx_path("example_c16_ladder.rknn")
    with SimulatorBackend(onnx_path, "rk3588") as simulator:
        assert simulator.run({"x": np.ones((1, 16, 64), np.float32)})["y"].shape == (1, 16, 64)
        with pytest.raises(ShapeRefused, match=r"fed x \[1, 16, 96\].*x \[1, 16, 64\]; x \[1, 16, 128\]"):
            simulator.run({"x": np.ones((1, 16, 96), np.float32)})
        manifest = _manifest(packages["dynamic"], "example_c16_ladder")
        contract = EngineContract.from_json(manifest["contract"])
        with EnginePool([("example_c16_ladder.rknn", contract)], lambda name: simulator) as pool:
            small, large = pool.engines  # one view per shape set, one backend
            with pytest.raises(ShapeRefused, match="through the view of set 0"):
                small.run({"x": np.ones((1, 16, 128), np.float32)})
            assert large.run({"x": np.ones((1, 16, 128), np.float32)})["y"].shape == (1, 16, 128)
            pool.engines[0]._slot.backend = None  # the simulator is closed by its own context


def test_a_file_in_two_roles_needs_a_shape_set_for_each():
    from rkaudio.host.exec_plan import shared_file_problems

    plan = {"audio8_asr.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {
        "step_128": "step.rknn", "step_256": "step.rknn", "head": "h0.rknn,h1.rknn"}}}}
    fixed = {"step.rknn": {"role": "step_128"}}
    assert shared_file_problems(plan, fixed) == [
        "audio8_asr.exec_plan component 'decoder': step.rknn fills roles ['step_128', 'step_256'] but is compiled for "
        "one shape set"]
    both = {"step.rknn": {"shape_sets": [{"contract": {"role": "step_128"}}, {"contract": {"role": "step_256"}}]}}
    assert shared_file_problems(plan, both) == []
    one = {"step.rknn": {"shape_sets": [{"contract": {"role": "step_128"}}, {"contract": {"role": "step_512"}}]}}
    assert shared_file_problems(plan, one) == [
        "audio8_asr.exec_plan component 'decoder': step.rknn fills role 'step_256' but lists no shape set for it "
        "(its sets: ['step_128', 'step_512'])"]


def test_a_dynamic_log_is_split_per_set_or_refused(packages, tmp_path):
    from rkaudio.gates.layer_table import parse_layer_table, shape_set_logs

    package = packages["dynamic"]
    manifest = _manifest(package, "example_c16_ladder")
    sets = [{"inputs": {t["name"]: t["shape"] for t in entry["inputs"]}} for entry in manifest["shape_sets"]]
    log = (package / "example_c16_ladder.build.log").read_text(errors="replace")
    parts = shape_set_logs(log, sets)
    assert [parse_layer_table(part).est_cycles for part in parts] == [e["est_cycles"] for e in manifest["shape_sets"]]
    # the whole log parsed as one table gives one set's figures only: the reason it is split
    assert parse_layer_table(log).est_cycles in [e["est_cycles"] for e in manifest["shape_sets"]]
    with pytest.raises(ValueError, match="ends 2 dynamic-shape graphs, the engine lists 3"):
        shape_set_logs(log, sets + sets[:1])
    with pytest.raises(ValueError, match="matches shape sets"):
        shape_set_logs(log, [{"inputs": {"x": [1, 16, 96]}}, sets[1]])


def test_one_rung_cannot_be_a_dynamic_ladder(tmp_path):
    from rkaudio.families import example
    from rkaudio.pipeline.ladder import dynamic_ladder
    from rkaudio.core.errors import SetupError

    records = example.export(example.FAMILY.job(target="rk3588", out=tmp_path, options={"channels": 4}), 16)
    with pytest.raises(SetupError, match="at least two rungs"):
        dynamic_ladder(records, ("main",), say=lambda line: None)
    with pytest.raises(SetupError, match="no exported engine fills the ladder roles"):
        dynamic_ladder(records, ("first",), say=lambda line: None)


def test_a_symbolic_dimension_builds_only_with_its_shape_sets(packages):
    """`convert build` compiles the merged ONNX from the sets its contract lists, and refuses the same graph
    without them (what a shape-generic ONNX from elsewhere is), naming the dimension and the fix."""
    from rkaudio.release.kit import HostOpener
    from rkaudio.core.contract import contract_of, set_contract
    from rkaudio.core.errors import SetupError
    from rkaudio.core.onnx_graph import load_model
    from rkaudio.toolkit.session import graph_io

    model = load_model(HostOpener(packages["dynamic"], "simulator").onnx_path("example_c16_ladder.rknn"))
    inputs, _ = graph_io(model)
    assert [list(spec.shape) for spec in inputs] == [[1, 16, 128]]  # the largest set: what the manifest's top shows
    contract = contract_of(model).replace(shape_sets=None)
    with pytest.raises(SetupError, match="input 'x' has a symbolic dimension 's0' at axis 2.*shape_sets"):
        graph_io(set_contract(model, contract))


def test_the_exactness_gate_fails_on_a_merge_that_changed_the_maths(tmp_path):
    """`shape_generic_exact` passes the true merge of two example rungs and fails it once one weight is changed."""
    import onnx
    from onnx import numpy_helper

    from rkaudio.families import example
    from rkaudio.pipeline.ladder import _lean_rungs, exactness_verdict
    from rkaudio.surgery.graph.shape_generic import shape_generic

    job = example.FAMILY.job(target="rk3588", out=tmp_path, options={"channels": 4})
    records = [record for frames in (16, 32) for record in example.export(job, frames)]
    graphs, weights = _lean_rungs([record.onnx for record in records])
    generic = shape_generic(graphs)
    for name, tensor in weights.items():  # the merged graph as the merge writes it
        generic.graph.initializer.append(tensor)
        generic.graph.input.remove(next(v for v in generic.graph.input if v.name == name))
    assert exactness_verdict(generic, records, graphs, weights).passed
    tampered = onnx.ModelProto()
    tampered.CopyFrom(generic)
    bias = next(t for t in tampered.graph.initializer if numpy_helper.to_array(t).ndim == 1
                and numpy_helper.to_array(t).dtype.kind == "f")
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.01, bias.name))
    verdict = exactness_verdict(tampered, records, graphs, weights)
    assert not verdict.passed and verdict.value > 1e-4

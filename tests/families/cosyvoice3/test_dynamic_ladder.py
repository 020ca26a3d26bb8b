"""`ladder = "dynamic"` on the tiny estimator (rk3588, toolkit 2.3.2, the recipe's own gates: 0 REGTASK lines,
no CPU op, 40 dB): one engine for both rungs whose per-set figures are those of the static engines of the same
rungs, and whose kit replays every set and the ODE golden (one engine view per set) in the simulator."""
from __future__ import annotations

import pytest

from rkaudio.cli.families import declaration
from rkaudio.release import recipes
from rkaudio.core.paths import REPO_ROOT

# Three rungs, not conftest's two: the 2.3.2 simulator refuses the two-set engine of S=24, 32 (its session feeds
# rope_cos un-transposed to an input it moved a Transpose into, `reduce_tp_in_mesh_forward`); 24, 32, 48 runs.
LENGTHS = [24, 32, 48]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The recipe's flow part at the tiny rungs, from small random weights, built static and dynamic:
    {ladder: its manifests in rung order}, and the dynamic build's folder."""
    from rkaudio.core.errors import SetupError
    from rkaudio.toolkit.versions import converter_python

    try:
        converter_python("2.3.2")
    except SetupError as error:
        pytest.fail(str(error))
    recipe = recipes.load_recipe(REPO_ROOT / "recipes" / "cosyvoice3_flow_0_5b.toml", declaration)
    family = declaration("cosyvoice3")
    manifests, folders = {}, {}
    for ladder in ("static", "dynamic"):
        work = tmp_path_factory.mktemp(ladder)
        lengths = {target: LENGTHS for target in recipe["targets"]}  # the recipe's lengths are per target
        cut = {**recipe, "options": {**recipe["options"], "lengths": lengths, "ladder": ladder}}
        results, _ = recipes.build_cell(cut, "flow", "rk3588", "2.3.2", work, family, "small", random_weights=True)
        manifests[ladder] = [result.manifest_data for result in results]
        folders[ladder] = results[0].rknn.parent
    return manifests, folders


def test_one_engine_gated_per_set_as_the_static_engines_of_its_rungs(builds):
    manifests, _ = builds
    (dynamic,), statics = manifests["dynamic"], manifests["static"]
    sets = dynamic["shape_sets"]
    assert [entry["contract"]["length"] for entry in sets] == LENGTHS
    assert [static["contract"]["length"] for static in statics] == LENGTHS
    thresholds = {gate["name"]: gate["threshold"] for gate in dynamic["gates"]}
    for number, (entry, static) in enumerate(zip(sets, statics)):
        # the recipe's gates held per set: no REGTASK line, no CPU op (the ones-column broadcast is a Mul), 40 dB
        assert thresholds[f"cpu_compute_ops@{number}"] == 0 and thresholds[f"regtask_lines@{number}"] == 0
        assert thresholds[f"simulator_snr[dphi_dt@{number}]"] == 40.0
        assert entry["ops"]["cpu"] == 0 == static["ops"]["cpu"] and entry["regtask"]["lines"] == 0
        # the compiler prints one layer table per set: its cycles within 2% of the static engine's
        assert abs(entry["est_cycles"] - static["est_cycles"]) <= 0.02 * static["est_cycles"], number
        figures, fixed = dynamic["simulator"][f"dphi_dt@{number}"], static["simulator"]["dphi_dt"]
        for key in ("snr_db", "fp16_floor_gap_db"):
            assert abs(figures[key] - fixed[key]) <= 0.5, (number, key, figures[key], fixed[key])
    assert "shape_generic_exact" in thresholds and all(gate["passed"] for gate in dynamic["gates"])


def test_the_kit_replays_every_set_and_the_ode_golden_in_the_simulator(builds, tmp_path):
    import json

    from rkaudio.release.kit import HostOpener
    from rkaudio.board.selftest import SelfTest

    _, folders = builds
    folder = folders["dynamic"]
    index = json.loads((folder / "selftest" / "index.json").read_text())
    assert [(e["engine"], e.get("shape_set")) for e in index["engines"]] == [
        ("cosyvoice3_flow_ladder.rknn", number) for number in range(len(LENGTHS))]
    assert index["end_to_end"][0]["engines"] == ["cosyvoice3_flow_ladder.rknn"]
    with HostOpener(folder, "simulator") as opener:  # closes the simulator children it kept between phases
        report = SelfTest(folder, opener, runs=1, core_masks=[], say=lambda line: None,
                          report_path=tmp_path / "report.json").run()
    assert report["passed"], json.dumps(report, default=str)[:2000]
